"""`pkb sweep`: the file's checks (one line, exit 2), the matrix and its budget ceiling, and a sweep of two scripted
models x three conditions x two problems x two samples on CPU killed midway, resumed, and reported with the
Δs its answer tables fix (tests/fixtures/sweep/)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent import cli
from agent.sweep import spec as sweep_spec
from harness.common.paths import REPO_ROOT

REPO = REPO_ROOT
FIXTURES = REPO / "tests" / "fixtures" / "sweep"

MINIMAL = """
problems = ["all_reduce"]
[[models]]
model = "scripted:{model}"
[conditions]
names = ["zero-shot"]
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and err.startswith("pkb: error: "), err
    return err


# -- the file -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change,message", [
    (("names = [\"zero-shot\"]", "names = [\"zero-shot\", \"agent:compile+frobnicate\"]"), "unknown tool 'frobnicate'"),
    (("names = [\"zero-shot\"]", "names = [\"zero-shot\"]\ntools = [\"check\", \"nope\"]\nfamilies = [\"single\"]"),
     "unknown tool 'nope'"),
    (("problems = [\"all_reduce\"]", "problems = [\"all_reduce\", \"no_such_problem\"]"), "no_such_problem"),
    (("model = \"scripted:{model}\"", "model = \"openai:gpt-nonexistent-9\""), "unknown model"),
    (("model = \"scripted:{model}\"", "model = \"bogus:thing\""), "unknown model 'bogus:thing'"),
    (("model = \"scripted:{model}\"", "model = \"scripted:missing.json\""), "no script"),
    (("problems = [\"all_reduce\"]", "problems = [\"all_reduce\"]\nsampels = 3"), "unknown key 'sampels'"),
    (("[conditions]", "[conditions"), "not valid TOML"),
    (("names = [\"zero-shot\"]", "names = [\"zero-shot\"]\nfamilies = [\"pairs\"]"), "conditions.families"),
])
def test_a_file_naming_something_unknown_is_refused_with_one_line(tmp_path: Path, capsys, change, message):
    text = MINIMAL.format(model=FIXTURES / "model_a.json").replace(*[c.format(model=FIXTURES / "model_a.json")
                                                                     for c in change])
    file = write(tmp_path / "s.toml", text)
    assert cli.main(["sweep", str(file), "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 2
    err = one_line_error(capsys)
    assert message in err and str(file) in err
    assert not (tmp_path / "runs").exists()


def test_condition_families_expand_to_every_single_tool_all_but_one_and_all(tmp_path: Path):
    text = MINIMAL.format(model="x.json").replace(
        'names = ["zero-shot"]', 'names = ["zero-shot", "agent:check"]\ntools = ["compile", "check", "bench"]\n'
                                 'families = ["single", "all-but-one", "all"]')
    sweep = sweep_spec.parse(text, tmp_path / "s.toml")
    assert [c.name for c in sweep.conditions] == [
        "zero-shot", "agent:check", "agent:bench", "agent:compile", "agent:check+compile", "agent:bench+compile",
        "agent:bench+check", "agent:bench+check+compile"]
    assert [c.id for c in sweep.cells()][:3] == ["x--zero-shot--seed0", "x--agent_check--seed0",
                                                "x--agent_bench--seed0"]


def test_the_dry_run_prints_the_matrix_and_its_budget_ceiling(tmp_path: Path, capsys):
    file = write(tmp_path / "ceiling.toml", """
problems = ["all_reduce", "all_gather"]
samples = 3
seeds = [0, 1]
[budgets]
input_tokens = 1000
output_tokens = 500
wall_s = 100
[[models]]
label = "gpt"
model = "openai:gpt-5.5"
[conditions]
names = ["zero-shot", "agent:check+compile"]
""")
    assert cli.main(["sweep", str(file), "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    for cell in ("gpt--zero-shot--seed0", "gpt--agent_check.compile--seed0", "gpt--zero-shot--seed1",
                 "gpt--agent_check.compile--seed1"):
        assert cell in out
    # 4 cells x 2 problems x 3 samples = 24 samples; tokens 24 x 1500; dollars 24 x (1000 x $5 + 500 x $30)/1M;
    # wall: 4 cells x 6 samples one at a time x 100 s = 2400 s
    # piped, a table's columns are separated by blanks only (agent.cli.common)
    total = next(line for line in out.splitlines() if line.split()[:1] == ["total"])
    assert total.split() == ["total", "4", "24", "36,000", "$0.48", "0.67", "h", "—"]
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


# -- killed, resumed, reported -----------------------------------------------------------------------------
def finished(cell: Path) -> list[Path]:
    return [p for p in cell.glob("samples/*/*/*/sample.json") if json.loads(p.read_text())["status"] == "finished"]


def events(cell: Path, name: str) -> list[dict]:
    lines = (cell / "events.jsonl").read_text().splitlines() if (cell / "events.jsonl").exists() else []
    return [e for e in map(json.loads, (x for x in lines if x.startswith("{"))) if e.get("event") == name]


@pytest.mark.slow
def test_a_sweep_killed_midway_resumes_every_cell_once_and_reports_the_known_deltas(tmp_path: Path, capsys):
    file = write(tmp_path / "ablation.toml", (FIXTURES / "ablation.toml").read_text().replace(
        "scripted:model_", f"scripted:{FIXTURES}/model_"))
    runs = tmp_path / "runs"
    folder = runs / "ablation"
    target = folder / "cells" / "a--agent_check--seed0"  # the cell whose four samples are all scored
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "sweep", str(file), "--runs-dir", str(runs)],
                                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline and not finished(target):
            time.sleep(0.05)
        assert proc.poll() is None, (tmp_path / "first.log").read_text()
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its rank processes, mid-cell
        proc.wait(timeout=60)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for cell in (folder / "cells").iterdir()
              for p in finished(cell)}
    assert 1 <= len(finished(target)) < 4
    done_before = json.loads((folder / "state.json").read_text())["done"]
    assert "a--zero-shot--seed0" in done_before and "a--agent_check--seed0" not in done_before

    assert cli.main(["sweep", str(file), "--runs-dir", str(runs)]) == 0  # the same command resumes it
    cells = json.loads((folder / "sweep.json").read_text())["cells"]
    assert len(cells) == 6
    done = json.loads((folder / "state.json").read_text())["done"]
    assert set(done) == {c["id"] for c in cells}
    assert done["a--zero-shot--seed0"] == done_before["a--zero-shot--seed0"]  # not run again
    for cell in cells:
        path = folder / "cells" / cell["id"]
        assert len(finished(path)) == 4, cell["id"]
        per_sample = [f"{e['problem']}/{e['condition']}/{e['sample']}" for e in events(path, "sample_finished")]
        assert len(per_sample) == len(set(per_sample)) <= 4, cell["id"]  # no sample finished twice
        assert len(events(path, "run_started")) == (2 if path == target else 1), cell["id"]
    for p, (mtime, content) in before.items():  # what was finished before the kill was not touched
        assert (p.stat().st_mtime_ns, p.read_bytes()) == (mtime, content)

    capsys.readouterr()
    assert cli.main(["report", str(folder), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [a["label"] for a in data["arms"]] == ["a/zero-shot", "a/agent:check", "a/agent:compile", "b/zero-shot",
                                                  "b/agent:check", "b/agent:compile"]
    got = {(c["treatment"], c["baseline"]): c for c in data["comparisons"]}
    expected = {  # (factor, Δpass@2, wins, losses, ties, exact p over the 2 problems' 4 sign patterns)
        ("a/agent:check", "a/zero-shot"): ("condition", 1.0, 2, 0, 0, 0.5),  # always wins
        ("a/agent:compile", "a/zero-shot"): ("condition", 0.0, 0, 0, 2, 1.0),  # never differs
        ("b/zero-shot", "a/zero-shot"): ("model", 0.0, 0, 0, 2, 1.0),
        ("b/agent:check", "b/zero-shot"): ("condition", 0.5, 1, 0, 1, 1.0),
        ("b/agent:compile", "b/zero-shot"): ("condition", 0.0, 0, 0, 2, 1.0),
    }
    assert set(got) == set(expected)
    for pair, (factor, delta, wins, losses, ties, p_value) in expected.items():
        c = got[pair]
        pk = c["metrics"]["pass_at_k"]
        assert (c["factor"], c["confounded"]) == (factor, []), pair
        assert (pk["mean"], pk["wins"], pk["losses"], pk["ties"]) == (pytest.approx(delta), wins, losses, ties), pair
        assert pk["p_value"] == pytest.approx(p_value) and pk["p_holm"] >= pk["p_value"], pair
        assert c["metrics"]["fast_1_at_k"]["mean"] == pytest.approx(delta) or delta > 0, pair
    assert data["k"] == 2 and all(a["samples"]["finished"] == 4 for a in data["arms"])


def test_search_cells_ablate_the_proposer_and_are_checked_by_pkb_searchs_own_parser(tmp_path: Path, capsys):
    search = """
problems = ["all_reduce"]
[[models]]
label = "mut"
model = "scripted:mutator"
[conditions]
names = []
[search]
proposers = ["zero-shot", "agent:compile+check"]
budget_candidates = 6
proposer_turns = 3
"""
    file = write(tmp_path / "search.toml", search)
    assert cli.main(["sweep", str(file), "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "mut--search-zero-shot--seed0" in out and "mut--search-agent_check.compile--seed0" in out
    searches = next(line for line in out.splitlines() if line.split()[:1] == ["searches"])
    assert searches.split()[:3] == ["searches", "2", "12"]  # 2 cells x 6 candidates
    bad = write(tmp_path / "bad.toml", search.replace("proposer_turns = 3", "proposer_turns = 3\nwindoww = 2"))
    assert cli.main(["sweep", str(bad), "--dry-run"]) == 2
    assert "unknown key 'windoww'" in one_line_error(capsys)
    mixed = write(tmp_path / "mixed.toml", search.replace("names = []", 'names = ["zero-shot"]'))
    assert cli.main(["sweep", str(mixed), "--dry-run"]) == 2
    assert "scripted:mutator writes search proposals only" in one_line_error(capsys)
