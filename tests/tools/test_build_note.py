"""The build line of the check, bench and compile answers: the build's seconds and what came from a cache, read
defensively from the harness's build records (the split build's `binding_cache` may be missing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.compiling.compile import CompileOutcome
from harness.config import EvalConfig, Limits, TimingConfig
from harness.problems.registry import get, load_suite
from harness.records.results import CandidateInfo, EvalResult, Failure
from tools import compile as compile_tool
from tools.base import ToolContext, ToolSettings
from tools.build_note import binding_marks, build_note
from tools.check import verdict_blocks

SPLIT_HIT = [{"name": "ext", "seconds": 3.1, "ok": True, "cache": "miss", "binding_cache": "hit"}]
SPLIT_MISS = [{"name": "ext", "seconds": 58.0, "ok": True, "cache": "miss", "split": {"binding_cache": "miss"}}]


@pytest.mark.parametrize("builds", [None, [], "hit", [1, "x"]])
def test_nothing_native_built_says_nothing(builds: Any) -> None:
    assert build_note(builds, 0.0001) is None


def test_the_line_names_the_seconds_and_the_caches() -> None:
    assert build_note(SPLIT_HIT, 4.25) == ("build: 4.2 s; the binding unit (cpp_sources, torch headers) came from "
                                           "the cache, only cuda_sources was compiled")
    missed = build_note(SPLIT_MISS, 61.0)
    assert missed is not None and missed.startswith("build: 61.0 s; the binding unit (cpp_sources, torch headers) "
                                                    "was compiled too")
    assert build_note([{"cache": "hit"}, {"cache": "hit", "binding_cache": "miss"}], 0.2) == \
        "build: 0.2 s; this exact source was built before, taken from the cache"
    # a build record without the split's field, or with a value this reader does not know: the seconds only
    assert build_note([{"cache": "miss"}], 95.0) == "build: 95.0 s"
    assert build_note([{"cache": "miss", "binding_cache": "up_to_date"}], 2.0) == "build: 2.0 s"
    assert build_note([{"cache": "miss"}], None) is None and build_note([{"cache": "miss"}], True) is None
    assert binding_marks([{"binding_cache": "hit", "split": {"binding_cache": "miss"}}, {"x": {}}]) == ["hit", "miss"]


def _result(verdict: str, builds: list[dict[str, Any]] | None, compile_s: float) -> EvalResult:
    failure = None if verdict == "correct" else Failure(verdict=verdict, message="rank 1, trial 0: out: differs",
                                                        rank=1, trial=0, phase="check")
    return EvalResult(problem="all_reduce", category="collective", shape="small", world_size=2, device="cpu",
                      candidate=CandidateInfo(path="c.py", sha256="0" * 64), verdict=verdict,
                      correct=verdict == "correct", failure=failure, seed=1, trials=2,
                      stages={"compile": compile_s, "check": 1.0},
                      integrity={} if builds is None else {"builds": builds})


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> ToolContext:
    config = EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"), limits=Limits(grace_s=1.0))
    return ToolContext(problem=get(load_suite(), "all_reduce"),
                       settings=ToolSettings(2, "cpu", "small", answer_tokens=1500), config=config,
                       workdir=tmp_path_factory.mktemp("w"))


def test_check_and_bench_answers_carry_the_build_line(ctx: ToolContext) -> None:
    right = "\n".join(b.text for b in verdict_blocks(_result("correct", SPLIT_HIT, 3.3), ctx, "check"))
    assert right.startswith("check: correct") and "\nbuild: 3.3 s; the binding unit" in right
    wrong = "\n".join(b.text for b in verdict_blocks(_result("output_mismatch", SPLIT_MISS, 60.0), ctx, "bench"))
    assert wrong.startswith("bench: output_mismatch") and "\nbuild: 60.0 s; the binding unit" in wrong
    plain = "\n".join(b.text for b in verdict_blocks(_result("correct", None, 0.0001), ctx, "check"))
    assert "build:" not in plain  # a PyTorch-only candidate builds nothing


def test_the_compile_answer_says_where_the_binding_unit_came_from(ctx: ToolContext, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    outcome = CompileOutcome(True, 3.5, native=True, builds=SPLIT_HIT)
    monkeypatch.setattr(compile_tool, "compile_candidate", lambda *a, **k: outcome)
    candidate = tmp_path / "000.py"
    candidate.write_text("x = 1\n")
    answer = compile_tool.run({}, ctx, candidate)
    assert "in 3.5 s" in answer.text and "came from the cache, only cuda_sources was compiled" in answer.text


def test_a_gpu_results_build_line_is_the_build_made_before_the_lease():
    """On a GPU the executor builds before the lease and the compile stage within it finds every build cached: the
    line reports the build that was made (its seconds, its binding unit), not the stage's 0 s "hit"."""
    from harness.records.results import EvalResult
    from tools.build_note import result_build

    made = [{"name": "ext", "ok": True, "cache": "miss", "binding_cache": "hit"}]
    gpu: dict[str, Any] = {
        "integrity": {"builds": [{"name": "ext", "ok": True, "cache": "hit"}]}, "stages": {"compile": 0.0},
        "environment": {"executor": {"name": "local", "build_before_lease_s": 6.25, "builds": made}}}
    result = EvalResult.model_construct(**gpu)  # only the fields the build line reads
    builds, seconds = result_build(result)
    assert builds == made and seconds == 6.25
    assert build_note(builds, seconds) == ("build: 6.2 s; the binding unit (cpp_sources, torch headers) came from "
                                           "the cache, only cuda_sources was compiled")
    cpu: dict[str, Any] = {"integrity": {"builds": made}, "stages": {"compile": 3.5}, "environment": {}}
    on_cpu = EvalResult.model_construct(**cpu)
    assert result_build(on_cpu) == (made, 3.5)
