"""A fast, deterministic stand-in for the harness, for tests of the search loop (not of the harness).

`evaluate` has harness.evaluate.evaluate's signature and returns a real EvalResult in a few milliseconds:
a verdict read off the source (what agent.search.mutator's failure injections do to a kernel: a syntax
error, a rank that waits in a barrier alone, an unknown helper, a halved result or a lost rank, a barrier
in every call), and for a correct kernel a time that is a fixed function of its annotated tunables and
its variant, with a little noise drawn from the source and the seed (so a rescore on a fresh seed moves
a little, as a real one does). A barrier in every call makes a kernel look twice as fast and carries the
`uses_torch_collectives` flag: the search must never breed from it. `bound` is a roofline record of a fixed 0.01 ms.

PKB_FAKE_EVAL_DELAY (seconds) slows each evaluation down, so that a test can kill a search mid-way.
`RemoteLike` is an executor like the Ray one (requests by value) with this module underneath.
`pkb search --evaluator tests.search_fakes` uses this module.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.search import tunables
from harness.common import failures
from harness.common.flags import USES_TORCH_COLLECTIVES, fast_eligible
from harness.config import EvalConfig
from harness.problems.problem import Problem
from harness.records.results import CandidateInfo, EvalResult, Failure, Timings, TimingStats

REFERENCE_MS = 0.3
BOUND_MS = 0.01
STAGES = {"compile": 0.001, "launch": 0.01, "check": 0.02, "timing": 0.02}
_COST_PER_CHUNK_MS = {"CHUNK": 0.4, "SUM_CHUNK": 0.5, "COPY_CHUNK": 0.3}


def kernel_ms(source: str, seed: int) -> float:
    """A deterministic time: small chunks and long polls are slow."""
    values = {name: t.value for name, t in tunables.by_name(source).items()}
    ms = 0.08
    for name, per in _COST_PER_CHUNK_MS.items():
        if name in values:
            ms += per * 8.0 / float(values[name])
    if "POLL_S" in values:
        poll = float(values["POLL_S"])
        ms += poll * 1000.0 * 0.9 if poll > 0 else 0.05  # a pure spin fights the peer for the core
    if "two_shot" in source.split("\n", 1)[0] or "two-shot" in source.split("\n", 1)[0]:
        ms *= 0.9
    noise = int.from_bytes(hashlib.sha256(f"{seed}:{source}".encode()).digest()[:4], "big") / 2**32
    return ms * (0.97 + 0.06 * noise)


def _stats(ms: float) -> TimingStats:
    return TimingStats(median_ms=ms, p10_ms=ms * 0.95, p90_ms=ms * 1.05, mean_ms=ms, cv=0.03, iterations=10,
                       host_median_ms=ms, input_sets=2, spin_us=0.0, slowest_rank=0, rank_medians_ms=[ms, ms],
                       clock="host")


def verdict_of(source: str) -> tuple[str, str, list[str]]:
    """(verdict, failure message, flags)."""
    try:
        compile(source, "candidate.py", "exec")
    except SyntaxError as err:
        return failures.COMPILE_ERROR, f"SyntaxError: {err.msg} (line {err.lineno})", []
    if "barrier()  # make sure" in source:
        return failures.DEADLOCK, "check: rank(s) 0 did not finish within 10 s; the rank group was killed", []
    if "_workspace_bytes(" in source:
        return failures.RUNTIME_ERROR, "rank 0 raised NameError: name '_workspace_bytes' is not defined", []
    if "range(2, world)" in source or ") * 0.5" in source:
        return failures.OUTPUT_MISMATCH, "rank 0, trial 0: values differ (max abs err 1.2)", []
    if "barrier()  # keep the ranks in step" in source:
        return failures.CORRECT, "", [USES_TORCH_COLLECTIVES]
    return failures.CORRECT, "", []


def evaluate(problem: Problem, candidate_path: Path, *, world_size: int, device: str = "cpu", shape: str = "small",
             config: EvalConfig | None = None, log_dir: Path | None = None, gpus: list[int] | None = None,
             integrity_config: Any = None, built: Any = None) -> EvalResult:
    """harness.evaluate's signature; the verdict comes from the source (verdict_of), whatever was built."""
    delay = float(os.environ.get("PKB_FAKE_EVAL_DELAY", "0") or 0)
    if delay:
        time.sleep(delay)
    config = config or EvalConfig()
    source = Path(candidate_path).read_text()
    verdict, message, flags = verdict_of(source)
    timings = speedup = None
    if verdict == failures.CORRECT:
        ms = kernel_ms(source, config.seed)
        if flags:
            ms /= 2.0
        timings = Timings(reference=_stats(REFERENCE_MS), candidate=_stats(ms))
        speedup = REFERENCE_MS / ms
    return EvalResult(
        problem=problem.name, category=problem.category, shape=shape, world_size=world_size,
        device=device,
        candidate=CandidateInfo(path=str(candidate_path), sha256=hashlib.sha256(source.encode()).hexdigest()),
        verdict=verdict,
        correct=verdict == failures.CORRECT,
        failure=None if verdict == failures.CORRECT else Failure(verdict=verdict, message=message,
                                                               phase="check"),
        timings=timings, speedup=speedup, flags=flags, fast_eligible=fast_eligible(flags), seed=config.seed,
        trials=config.trials, stages=dict(STAGES),
    )


def bound(problem: Problem) -> dict[str, Any]:
    return {"bound_s": BOUND_MS / 1e3, "binding": "interconnect", "traffic_source": "declared", "notes": []}


class RemoteLike:
    """An executor the way RayExecutor is one: requests by value, device calls by function; fake underneath."""

    name = "remote"

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.device_calls: list[str] = []

    def evaluate(self, request: Any) -> Any:
        from agent.executors.request import problem_for  # the agent layer: only where an executor is faked

        self.requests.append(request)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(request.candidate_name).name
            path.write_bytes(request.source_bytes)
            return evaluate(problem_for(request.problem_spec), path, world_size=request.world_size,
                            device=request.device, shape=request.shape, config=request.eval_config())

    def run_on_devices(self, world_size: int, device: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.device_calls.append(fn.__name__)
        return bound(args[0])

    def capacity(self, world_size: int, device: str) -> int:
        return 4

    def close(self) -> None:
        pass
