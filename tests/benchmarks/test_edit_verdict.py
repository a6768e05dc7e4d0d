"""The edit -> verdict benchmark: its candidates (edits to the kernel body only, the split layout, nvcc-clean), the
scripted sequence, the reading of a run's files and the table's arithmetic; a real dry run on CPU (slow)."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import shutil
import subprocess
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils import cpp_extension

from benchmarks import edit_verdict as ev

NVCC = shutil.which("nvcc")


def _strings(source: str) -> dict[str, str]:
    """The module-level string constants of a candidate (CUDA_SRC, CPP_SRC), read without importing it."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found[node.targets[0].id] = node.value.value  # type: ignore[attr-defined]
    return found


def _versions(device: str, problem: str, count: int = 6) -> list[str]:
    return ev.versions((ev.TEMPLATES / ev.CANDIDATES[device][problem]).read_text(), count)


@pytest.mark.parametrize("problem", ["all_reduce", "all_gather"])
def test_cuda_edits_change_one_line_of_the_kernel_body_and_nothing_else(problem: str) -> None:
    sources = _versions("cuda", problem)
    assert len(set(sources)) == len(sources)
    units = [_strings(s) for s in sources]
    assert all(u["CPP_SRC"] == units[0]["CPP_SRC"] for u in units)  # the binding unit never changes
    for unit in units[1:]:
        changed = [(a, b) for a, b in zip(units[0]["CUDA_SRC"].splitlines(), unit["CUDA_SRC"].splitlines()) if a != b]
        assert len(changed) == 1 and "constexpr int kUnroll" in changed[0][1]
        # inside the kernel: after the __global__ line, before the launcher
        before, after = units[0]["CUDA_SRC"].split(changed[0][0])
        assert "__global__" in before and "extern \"C\"" in after


@pytest.mark.parametrize("problem", ["all_reduce", "all_gather"])
def test_cuda_candidates_keep_torch_out_of_the_cuda_unit(problem: str) -> None:
    source = _versions("cuda", problem, 1)[0]
    units = _strings(source)
    assert "torch" not in units["CUDA_SRC"] and "ATen" not in units["CUDA_SRC"]
    assert "cudaStream_t stream" in units["CUDA_SRC"] and 'extern "C"' in units["CUDA_SRC"]
    assert "#include <torch/extension.h>" in units["CPP_SRC"]
    assert "at::cuda::getCurrentCUDAStream()" in units["CPP_SRC"]
    # without it load_inline puts torch/types.h at the top of cuda.cu, and every edit parses torch again
    assert "no_implicit_headers=True" in source
    for api in ("symm_mem.empty", "symm_mem.rendezvous", "buffer_ptrs_dev", "hdl.barrier(channel=0)"):
        assert api in source


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
@pytest.mark.parametrize("problem", ["all_reduce", "all_gather"])
def test_cuda_units_compile_with_nvcc(problem: str, tmp_path: Path) -> None:
    first, last = _versions("cuda", problem)[::5]
    for n, source in enumerate((first, last)):
        unit = tmp_path / f"v{n}.cu"
        unit.write_text(_strings(source)["CUDA_SRC"])
        # torch's own nvcc flags (no implicit bf16 conversions or operators), as load_inline passes them
        flags = [*cpp_extension.COMMON_NVCC_FLAGS, "-std=c++17", "-Xcompiler", "-fPIC", "-arch=sm_90", "-O3"]
        built = subprocess.run([str(NVCC), "-c", *flags, str(unit), "-o", str(tmp_path / f"v{n}.o")],
                               capture_output=True, text=True, check=False)
        assert built.returncode == 0, built.stderr[-2000:]


def _ranks(inputs: list[torch.Tensor]) -> types.SimpleNamespace:
    """torch.distributed as the CPU candidates use it, for W = len(inputs): all_gather hands back every input."""
    def all_gather(parts: list[torch.Tensor], _mine: torch.Tensor) -> None:
        for part, given in zip(parts, inputs):
            part.copy_(given)

    return types.SimpleNamespace(get_world_size=lambda: len(inputs), all_gather=all_gather)


@pytest.mark.parametrize("name", ["all_reduce", "all_gather"])
def test_cpu_versions_all_give_the_oracles_answer(name: str) -> None:
    problem = importlib.import_module(f"problems.collective.{name}")  # data of the suite, not a typed module of ours
    shape = {"tokens": 12, "hidden": 96}  # rows and elements that no chunk divides evenly
    generator = torch.Generator().manual_seed(3)
    inputs = [problem.make_inputs(shape, r, 2, generator, "cpu") for r in range(2)]
    expected = problem.oracle(shape, 2, inputs)
    for source in _versions("cpu", problem.PROBLEM["name"]):
        namespace: dict[str, Any] = {}
        exec(compile(source, "candidate", "exec"), namespace)
        namespace["dist"] = _ranks([i[0] for i in inputs])
        for rank in range(2):
            got = namespace["solution"](*inputs[rank])
            torch.testing.assert_close(got.float(), expected[rank].float(), atol=2e-2, rtol=2e-2)


def test_the_script_checks_every_version_then_submits_the_last() -> None:
    steps = ev.script_steps(["v0", "v1", "v2"])
    assert steps == [["tool", "check", {"source": "v0"}], ["tool", "check", {"source": "v1"}],
                     ["tool", "check", {"source": "v2"}], ["tool", "submit", {"source": "v2"}]]
    with pytest.raises(ValueError):
        ev.versions("$unroll", len(ev.VARIANTS) + 1)


def test_the_run_command_is_the_agent_loop_on_one_gpu_with_emulation(tmp_path: Path) -> None:
    args = argparse.Namespace(device="cuda", world_size=2, ranks_per_gpu=2, shape="decode")
    command = ev.run_command("all_reduce", tmp_path / "s.json", tmp_path / "runs", args)
    text = " ".join(command)
    assert "-m agent.cli run" in text and f"scripted:{tmp_path / 's.json'}" in text
    assert "--condition agent:check" in text and "--device cuda --world-size 2 --ranks-per-gpu 2" in text
    assert "--no-timing" in text and "--run-id edit-verdict-all_reduce" in text


def test_each_problem_runs_with_an_empty_build_cache_unless_asked(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """So the first build is cold even on a machine that built these sources before (a second run)."""
    seen: list[dict[str, str]] = []

    def run(command: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        seen.append(kw["env"])
        cache = Path(kw["env"]["PKB_CACHE_DIR"])
        assert not cache.exists() or not any(cache.iterdir())
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setenv("PKB_CACHE_DIR", str(tmp_path / "mine"))
    args = argparse.Namespace(device="cpu", edits=1, out=tmp_path, world_size=2, shape="small", warm_cache=False)
    assert ev.run_problem("all_reduce", args) == 0
    args.warm_cache = True
    assert ev.run_problem("all_reduce", args) == 0
    assert seen[0]["PKB_CACHE_DIR"] != str(tmp_path / "mine") and not Path(seen[0]["PKB_CACHE_DIR"]).exists()
    assert seen[1]["PKB_CACHE_DIR"] == str(tmp_path / "mine")


# -- reading a run's files ------------------------------------------------------------------------------------


def _event(second: float, **fields: Any) -> str:
    minute, rest = divmod(second, 60)
    return json.dumps({**fields, "timestamp": f"2026-12-07T03:{int(minute):02d}:{rest:09.6f}Z"})


def _record(verdict: str, compile_s: float | None, builds: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A check's saved record as agent/tool_calls writes it (candidates/NNN.json)."""
    result: dict[str, Any] = {"stages": {} if compile_s is None else {"compile": compile_s, "check": 1.0},
                              "integrity": {} if builds is None else {"builds": builds}}
    return {"tool": "check", "data": {"tool": "check", "verdict": verdict, "correct": verdict == "correct",
                                      "result": result}}


def _run_folder(runs: Path, problem: str) -> Path:
    """A run folder laid out as `pkb run` writes it: a first build, two edits (one without a build record)."""
    sample = runs / ev.run_id(problem) / "samples" / problem / ev.CONDITION / "0"
    (sample / "candidates").mkdir(parents=True)
    records = [_record("correct", 61.5, [{"name": "x", "seconds": 60.0, "cache": "miss", "binding_cache": "miss"}]),
               _record("correct", 4.2, [{"name": "x", "seconds": 3.9, "cache": "miss",
                                         "split": {"binding_cache": "hit", "seconds": {"link": 0.2}}}]),
               _record("output_mismatch", None, None)]
    for n, record in enumerate(records):
        (sample / "candidates" / f"{n:03d}.json").write_text(json.dumps(record))
    cand = str(sample / "candidates")
    other = {"problem": "all_gather" if problem != "all_gather" else "all_reduce", "condition": ev.CONDITION}
    mine = {"problem": problem, "condition": ev.CONDITION, "sample": 0}
    lines = [_event(0.0, event="run_started"),
             _event(1.0, **mine, event="model_reply", tool_calls=["check"]),
             _event(1.5, label="lease", event="lease_asked"),
             _event(2.0, **other, event="model_reply", tool_calls=["check"]),  # another problem's sample
             _event(72.25, **mine, event="tool", tool="check", verdict="correct", candidate=f"{cand}/000.py"),
             _event(72.5, **mine, event="model_reply", tool_calls=["check"]),
             _event(80.0, **other, event="tool", tool="check", candidate="elsewhere/000.py"),
             _event(84.5, **mine, event="tool", tool="check", verdict="correct", candidate=f"{cand}/001.py"),
             '{"problem": "' + problem + '", "event": "torn',
             _event(85.0, **mine, event="model_reply", tool_calls=["check"]),
             _event(100.0, **mine, event="tool", tool="check", verdict="output_mismatch", candidate=f"{cand}/002.py"),
             _event(100.5, **mine, event="model_reply", tool_calls=["submit"]),
             _event(100.6, **mine, event="tool", tool="submit", candidate=f"{cand}/003.py")]
    (runs / ev.run_id(problem) / "events.jsonl").write_text("\n".join(lines) + "\n")
    (sample / "sample.json").write_text(json.dumps({"verdict": "output_mismatch"}))
    return sample


def test_checks_are_read_from_the_events_and_each_calls_record(tmp_path: Path) -> None:
    _run_folder(tmp_path, "all_reduce")
    checks = ev.read_checks(tmp_path, "all_reduce")
    assert [c.step for c in checks] == [0, 1, 2]
    assert [c.wall_s for c in checks] == [71.25, 12.0, 15.0]  # the reply that asked -> the tool's answer
    assert [c.compile_s for c in checks] == [61.5, 4.2, None]
    assert [c.build_cache for c in checks] == ["miss", "miss", None]
    assert [c.binding_cache for c in checks] == ["miss", "hit", None]  # top level, nested, absent
    assert [c.verdict for c in checks] == ["correct", "correct", "output_mismatch"]
    assert [c.correct for c in checks] == [True, True, False]
    assert ev.final_verdict(tmp_path, "all_reduce") == "output_mismatch"


def test_binding_marks_are_read_defensively() -> None:
    assert ev.binding_mark(None) is None and ev.binding_mark("hit") is None and ev.binding_mark([1, "x"]) is None
    assert ev.binding_mark([{"binding_cache": 3}]) is None
    assert ev.binding_mark([{"binding_cache": "hit"}, {"split": {"binding_cache": "miss"}}]) == "hit+miss"


def test_the_summary_takes_the_median_over_every_edit_and_the_first_builds_apart(tmp_path: Path) -> None:
    def check(step: int, wall: float, correct: bool = True) -> ev.Check:
        return ev.Check(step, wall, 1.0, "miss", "hit", "correct" if correct else "output_mismatch", correct)

    checks = {"all_reduce": [check(0, 90.0), *(check(k, w) for k, w in enumerate([10.0, 12.0, 30.0, 11.0, 9.0], 1))],
              "all_gather": [check(0, 70.0), *(check(k, w) for k, w in enumerate([8.0, 25.0, 14.0, 13.0, 40.0], 1))]}
    summary = ev.summarize(checks, {"all_reduce": "correct", "all_gather": "correct"})
    assert summary["edits"] == 10 and summary["median_edit_s"] == 12.5  # (12 + 13) / 2, over both problems
    assert summary["problems"]["all_reduce"]["first_build_s"] == 90.0
    assert summary["problems"]["all_gather"]["edit_walls_s"] == [8.0, 25.0, 14.0, 13.0, 40.0]
    assert summary["problems"]["all_gather"]["median_edit_s"] == 14.0 and summary["met"]
    text = ev.table(summary)
    assert "| all_reduce | first build | 90.0 | 1.0 | miss | hit | correct |" in text
    assert "| all_gather | edit 5 | 40.0 |" in text
    assert "over 10 edits: 12.5 s (target <= 20 s: met); first build: all_reduce 90.0 s, all_gather 70.0 s" in text
    # a wrong verdict, or a median over the target, is not met
    checks["all_gather"][3] = check(3, 14.0, correct=False)
    assert not ev.summarize(checks, {})["met"]
    slow = {"all_reduce": [check(0, 90.0), check(1, 21.0)]}
    assert not ev.summarize(slow, {})["met"]


def test_read_mode_writes_the_table_of_runs_already_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run_folder(tmp_path / "runs", "all_gather")
    assert ev.main(["--read", str(tmp_path / "runs"), "--problems", "all_gather", "--out", str(tmp_path / "o")]) == 0
    summary = json.loads((tmp_path / "o" / "edit_verdict.json").read_text())
    assert summary["median_edit_s"] == 13.5 and summary["problems"]["all_gather"]["first_build_s"] == 71.25
    assert not summary["met"]  # the last check's verdict was wrong
    assert "| all_gather | edit 2 | 15.0 | — | — | — | output_mismatch |" in capsys.readouterr().out


@pytest.mark.slow
def test_a_dry_run_on_cpu_goes_through_the_agent_loop(tmp_path: Path) -> None:
    """The real plumbing: `pkb run` with the scripted sequence (a first version and one edit), its files read."""
    assert ev.main(["--device", "cpu", "--problems", "all_reduce", "--edits", "1", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "edit_verdict.json").read_text())
    found = summary["problems"]["all_reduce"]
    assert [c["verdict"] for c in found["checks"]] == ["correct", "correct"] and found["all_correct"]
    assert found["final_verdict"] == "correct" and summary["exit_codes"] == {"all_reduce": 0}
    assert all(c["wall_s"] > 0 and c["compile_s"] is not None for c in found["checks"])
    assert found["checks"][1]["wall_s"] == found["edit_walls_s"][0] == summary["median_edit_s"]
    script = json.loads((tmp_path / "all_reduce.script.json").read_text())
    assert [s[1] for s in script] == ["check", "check", "submit"]


def test_a_gpu_checks_build_is_read_from_the_build_made_before_the_lease() -> None:
    """On a GPU the executor builds before the lease; the compile stage within it finds the build cached (0 s,
    "hit"): the check's build is the executor's."""
    record = {"data": {"verdict": "correct", "correct": True, "result": {
        "stages": {"compile": 0.0}, "integrity": {"builds": [{"cache": "hit"}]},
        "environment": {"executor": {"build_before_lease_s": 7.5,
                                     "builds": [{"cache": "miss", "binding_cache": "hit"}]}}}}}
    check = ev.check_record(1, 14.0, record)
    assert (check.compile_s, check.build_cache, check.binding_cache) == (7.5, "miss", "hit")
