"""The manifest in every run (agent.manifest): what it records, and `pkb report` refusing (or, forced, marking) a
comparison of runs whose manifests differ in more than the compared factor."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

import prompts
from agent import cli, manifest
from agent.report.build import build
from agent.report.run_reader import read_run
from agent.rundir import RunDir
from agent.runner import RunConfig, create_run
from harness.common.paths import REPO_ROOT
from harness.problems.problem import load_problem
from harness.problems.registry import SUITE_ROOT
from harness.records.environment import environment, hardware_key
from tests.report_support import OUTCOMES, make_run

REPO = REPO_ROOT


def git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout.strip()


def with_manifest(run: Path, **changes: object) -> Path:
    """Give a synthetic run (tests.report_support.make_run) a manifest, with `changes` to its code record."""
    header = json.loads((run / "run.json").read_text())
    header["manifest"] = {"schema": manifest.MANIFEST_SCHEMA,
                          "code": {"commit": "a" * 40, "dirty": False, "diff_sha256": None, "version": "0.1.0",
                                   **changes},
                          "problem_source": {"kind": "suite"}, "problem_sha256": {"all_reduce": "1" * 64},
                          "executor": "local", "hardware": {"fingerprint": "f" * 16}}
    (run / "run.json").write_text(json.dumps(header))
    return run


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and err.startswith("pkb: error: "), err
    return err


# -- what a manifest records --------------------------------------------------------------------------------
def test_a_new_run_records_code_problems_prompts_settings_executor_and_hardware(tmp_path: Path):
    problem = load_problem(SUITE_ROOT / "collective" / "all_reduce.py")
    config = RunConfig(model="scripted:x", conditions=["zero-shot"], samples=2, problems=["all_reduce"], seed=7,
                       trials=3, temperature=0.2)
    header = create_run(RunDir(tmp_path / "r"), config, None, problems=[problem], executor="local")
    assert json.loads((tmp_path / "r" / "run.json").read_text())["manifest"] == header["manifest"]
    m = header["manifest"]
    assert m["schema"] == manifest.MANIFEST_SCHEMA
    if (REPO / ".git").exists():
        assert m["code"]["commit"] == git(REPO, "rev-parse", "HEAD")
        changed = git(REPO, "diff", "HEAD", "--name-only") + git(REPO, "ls-files", "--others", "--exclude-standard",
                                                                 "--", *manifest.SOURCE_FOLDERS)
        assert m["code"]["dirty"] == bool(changed)
    assert m["problem_sha256"] == {"all_reduce": problem.source_sha256}
    assert m["prompts_sha256"] == manifest.prompts_digest(prompts.hashes())
    assert m["model"]["model"] == "scripted:x" and m["model"]["temperature"] == 0.2
    assert (m["seed"], m["trials"], m["samples"], m["budgets"]) == (7, 3, 2, config.budgets)
    assert m["executor"] == "local" and m["hardware"]["fingerprint"] == hardware_key(environment())
    assert m["problem_source"] == {"kind": "suite"}


def test_git_state_tells_clean_and_dirty_trees_apart_and_two_edits_apart(tmp_path: Path):
    repo = tmp_path / "checkout"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "f.py").write_text("x = 1\n")
    git(repo, "add", "f.py")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    clean = manifest.git_state(repo)
    assert clean == {"commit": git(repo, "rev-parse", "HEAD"), "dirty": False, "diff_sha256": None, "changed": {}}
    (repo / "f.py").write_text("x = 2\n")
    first = manifest.git_state(repo)
    (repo / "f.py").write_text("x = 3\n")
    second = manifest.git_state(repo)
    assert first["dirty"] and second["dirty"] and first["diff_sha256"] != second["diff_sha256"]
    (repo / "sub").mkdir()
    assert manifest.git_state(repo / "sub")["commit"] is None  # a folder inside a checkout is not the checkout
    record = manifest.source_record(f"pkb:{repo}", {"p": "0" * 64})
    assert record["kind"] == "pkb" and record["commit"] == clean["commit"] and record["tree_sha256"]


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def project(tmp_path: Path) -> Path:
    """A checkout laid out as this project: a source folder, a tracked doc, an ignored runs/."""
    repo = tmp_path / "project"
    (repo / "agent").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "agent" / "a.py").write_text("x = 1\n")
    (repo / "README.md").write_text("hello\n")
    (repo / ".gitignore").write_text("runs/*\n")
    commit_all(repo, "one")
    return repo


def test_the_code_hash_ignores_untracked_files_outside_the_sources_and_ignored_files(tmp_path: Path):
    repo = project(tmp_path)
    clean = manifest.git_state(repo, manifest.SOURCE_FOLDERS)
    # what the README's quickstart leaves: a folder of solutions, a report, a run: none of it is code
    (repo / "my_solutions" / "all_reduce").mkdir(parents=True)
    (repo / "my_solutions" / "all_reduce" / "k.py").write_text("def solution(x): return x\n")
    (repo / "demo.html").write_text("<html>")
    (repo / "runs" / "demo").mkdir(parents=True)
    (repo / "runs" / "demo" / "run.json").write_text("{}")
    assert manifest.git_state(repo, manifest.SOURCE_FOLDERS) == clean
    assert clean["dirty"] is False and clean["diff_sha256"] is None
    # an untracked module inside a source folder is new code; an edit of a tracked file anywhere counts
    (repo / "agent" / "new.py").write_text("y = 2\n")
    (repo / "README.md").write_text("edited\n")
    state = manifest.git_state(repo, manifest.SOURCE_FOLDERS)
    assert state["dirty"] and set(state["changed"]) == {"agent/new.py", "README.md"}
    assert state["changed"]["agent/new.py"] == hashlib.sha256(b"y = 2\n").hexdigest()
    (repo / "agent" / "a.py").unlink()
    assert manifest.git_state(repo, manifest.SOURCE_FOLDERS)["changed"]["agent/a.py"] is None  # deleted
    # the same edits give the same hash
    assert manifest.git_state(repo, manifest.SOURCE_FOLDERS) == manifest.git_state(repo, manifest.SOURCE_FOLDERS)


def header_of(state: dict) -> dict:
    return {"manifest": {"code": state}}


def test_code_differences_name_the_files_two_runs_differ_in(tmp_path: Path):
    repo = project(tmp_path)
    before = manifest.git_state(repo, manifest.SOURCE_FOLDERS)
    (repo / "agent" / "a.py").write_text("x = 2\n")
    (repo / "agent" / "b.py").write_text("z = 0\n")
    edited = manifest.git_state(repo, manifest.SOURCE_FOLDERS)
    assert manifest.code_differences(header_of(before), header_of(edited)) == ["agent/a.py", "agent/b.py"]
    (repo / "agent" / "a.py").write_text("x = 3\n")
    again = manifest.git_state(repo, manifest.SOURCE_FOLDERS)
    assert manifest.code_differences(header_of(edited), header_of(again)) == ["agent/a.py"]
    assert manifest.code_differences(header_of(again), header_of(again)) == []
    # runs written before per-file records: not known, never "no difference"
    old = {"manifest": {"code": {"commit": before["commit"], "dirty": True, "diff_sha256": "d" * 64}}}
    assert manifest.code_differences(old, header_of(before)) is None
    note = manifest.code_note(header_of(before), header_of(edited), ["code.diff_sha256", "code.dirty"])
    assert note == "; the code differs in agent/a.py, agent/b.py"
    assert manifest.code_note(header_of(before), header_of(edited), ["seed"]) == ""


def test_code_differences_across_commits_of_this_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    repo = project(tmp_path)
    first = manifest.git_state(repo, manifest.SOURCE_FOLDERS)
    (repo / "agent" / "a.py").write_text("x = 5\n")
    (repo / "README.md").write_text("more\n")
    commit_all(repo, "two")
    (repo / "agent" / "c.py").write_text("c = 1\n")
    second = manifest.git_state(repo, manifest.SOURCE_FOLDERS)
    monkeypatch.setattr(manifest, "PROJECT_ROOT", repo)
    assert manifest.code_differences(header_of(first), header_of(second)) == ["README.md", "agent/a.py", "agent/c.py"]
    unknown = {**second, "commit": "0" * 40}  # a commit this checkout does not have
    assert manifest.code_differences(header_of(first), header_of(unknown)) is None


def test_comparable_views_and_their_differences():
    a = {"config": {"model": "openai:x", "seed": 0, "trials": 5}, "manifest": {"code": {"commit": "1"}},
         "prompt_hashes": {"system.md": "s"}}
    b = {"config": {"model": "openai:y", "seed": 1, "trials": 5}, "manifest": {"code": {"commit": "2"}},
         "prompt_hashes": {"system.md": "s"}}
    assert manifest.differing_keys(manifest.comparable(a), manifest.comparable(b)) == [
        "code.commit", "model.model", "seed"]
    old = {"config": {"model": "openai:x", "seed": 0, "trials": 5}, "prompt_hashes": {"system.md": "s"}}
    assert "code.commit" in manifest.differing_keys(manifest.comparable(a), manifest.comparable(old))


# -- pkb report ---------------------------------------------------------------------------------------------
def test_report_refuses_runs_whose_manifests_differ_besides_the_compared_factor(tmp_path: Path, capsys):
    a = with_manifest(make_run(tmp_path, "run-a"))
    b = with_manifest(make_run(tmp_path, "run-b", {"zero-shot": OUTCOMES["agent:check+compile"]}), commit="b" * 40)
    assert cli.main(["report", str(a), str(b)]) == 2
    err = one_line_error(capsys)
    assert "run-b/zero-shot vs run-a/zero-shot" in err and "code.commit" in err and "--force" in err
    assert "which files of the code differ is not recorded" in err  # commits this checkout does not have
    # the same with another seed: named too
    c = with_manifest(make_run(tmp_path, "run-c", seed=1))
    assert cli.main(["report", str(a), str(c)]) == 2
    assert "differ in seed" in one_line_error(capsys)


def test_report_names_the_files_in_which_the_code_of_two_runs_differs(tmp_path: Path, capsys):
    commit = manifest.code_state()["commit"] or "a" * 40
    a = with_manifest(make_run(tmp_path, "run-a"), commit=commit, dirty=False, changed={})
    b = with_manifest(make_run(tmp_path, "run-b", {"zero-shot": OUTCOMES["agent:check+compile"]}), commit=commit,
                      dirty=True, diff_sha256="d" * 64, changed={"agent/runner.py": "e" * 64, "notes.md": None})
    assert cli.main(["report", str(a), str(b)]) == 2
    err = one_line_error(capsys)
    assert "code.diff_sha256" in err and "the code differs in agent/runner.py, notes.md" in err


def test_forced_the_comparison_is_marked(tmp_path: Path, capsys):
    a = with_manifest(make_run(tmp_path, "run-a"))
    b = with_manifest(make_run(tmp_path, "run-b", {"zero-shot": OUTCOMES["agent:check+compile"]}), commit="b" * 40)
    assert cli.main(["report", str(a), str(b), "--force", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    marked = [c for c in data["comparisons"] if c["confounded"]]
    assert [(c["treatment"], c["confounded"]) for c in marked] == [("run-b/zero-shot", ["code.commit"])]
    assert any("marked †" in note for note in data["notes"])
    assert cli.main(["report", str(a), str(b), "--force"]) == 0
    assert "| run-b/zero-shot vs run-a/zero-shot † |" in capsys.readouterr().out


def test_two_models_may_differ_in_their_settings_and_nothing_else(tmp_path: Path):
    a = with_manifest(make_run(tmp_path, "run-a", {"zero-shot": OUTCOMES["zero-shot"]}))
    b = with_manifest(make_run(tmp_path, "run-b", {"zero-shot": OUTCOMES["agent:check+compile"]},
                               model="openai:other", temperature=0.7))
    rep = build([read_run(a), read_run(b)])
    (c,) = rep.data["comparisons"]
    assert (c["factor"], c["confounded"]) == ("model", [])
    assert c["metrics"]["pass_at_k"]["mean"] == pytest.approx(1 / 3)
