"""One candidate, one problem, one shape, W ranks: the harness protocol of DESIGN.md, start to end.

compile (own process, time limit) -> launch W ranks -> load the candidate -> correctness over T trials
-> timing of reference and candidate (identical protocol) -> one EvalResult. Every phase has a limit; a
phase that overruns kills the whole rank group and reads as a deadlock. No process outlives the call.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from harness import failures, reference_cache
from harness.compile import compile_candidate, extensions_dir
from harness.config import EvalConfig, TimingConfig
from harness.fingerprint import environment, hardware_key
from harness.pool import Hang, PoolError, RankPool
from harness.problem import Problem
from harness.results import CandidateInfo, EvalResult, Failure, Timings, TimingStats
from harness.seeds import TIMING_TRIAL_BASE


class _Stop(Exception):
    """Ends the protocol early with a failure."""

    def __init__(self, failure: Failure, flags: list[str] | None = None) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.flags = flags or []


def _failure_from(reply: dict[str, Any], phase: str) -> Failure:
    return Failure(
        verdict=reply.get("verdict", failures.INFRA_ERROR),
        message=reply.get("message", "no message"),
        rank=reply.get("rank"),
        trial=reply.get("trial"),
        phase=phase,
        evidence=reply.get("evidence", ""),
        max_abs_err=reply.get("max_abs_err"),
        max_rel_err=reply.get("max_rel_err"),
    )


def _ask(pool: RankPool, message: dict[str, Any], phase: str, timeout: float, grace: float) -> list[dict]:
    """One request to every rank; the first failing rank's reply becomes the verdict."""
    try:
        replies = pool.request(message, timeout=timeout, grace=grace)
    except Hang as hang:
        failed = [r for r in hang.replies.values() if not r.get("ok")]
        if failed:  # a rank failed and its peers were left waiting in a collective: its failure counts
            raise _Stop(_failure_from(min(failed, key=lambda r: r["rank"]), phase)) from hang
        raise _Stop(Failure(
            verdict=failures.DEADLOCK, phase=phase,
            message=f"{phase}: rank(s) {', '.join(map(str, hang.missing))} did not finish within "
                    f"{hang.timeout:.0f} s; the rank group was killed",
        )) from hang
    failed = [r for r in replies if not r.get("ok")]
    if failed:
        first = min(failed, key=lambda r: r["rank"])
        raise _Stop(_failure_from(first, phase), flags=list(first.get("flags", [])))
    return replies


def reference_key(problem: Problem, shape: str, world_size: int, device: str, config: EvalConfig) -> str:
    return "|".join([problem.name, problem.source_sha256[:16], shape, str(world_size), device,
                     hardware_key(), config.timing_key(), str(config.seed)])


def evaluate(
    problem: Problem,
    candidate_path: Path,
    *,
    world_size: int,
    device: str = "cpu",
    shape: str = "small",
    config: EvalConfig | None = None,
    log_dir: Path | None = None,
    gpus: list[int] | None = None,
) -> EvalResult:
    """Run the whole protocol; `gpus` picks the physical GPUs (one per rank) on a multi-GPU node."""
    config = config or EvalConfig(timing=TimingConfig.for_device(device))
    candidate_path = Path(candidate_path).resolve()
    source = candidate_path.read_bytes()
    stages: dict[str, float] = {}
    flags: list[str] = []
    failure: Failure | None = None
    timings: Timings | None = None
    max_abs = max_rel = None
    limits = config.limits

    def result(verdict: str) -> EvalResult:
        speedup = None
        if timings is not None and timings.candidate.median_ms > 0:
            speedup = timings.reference.median_ms / timings.candidate.median_ms
        return EvalResult(
            problem=problem.name, category=problem.category, origin=problem.origin, shape=shape,
            world_size=world_size, device=device,  # type: ignore[arg-type]
            candidate=CandidateInfo(path=str(candidate_path), sha256=hashlib.sha256(source).hexdigest()),
            verdict=verdict,  # type: ignore[arg-type]
            correct=verdict == failures.CORRECT, failure=failure, max_abs_err=max_abs, max_rel_err=max_rel,
            timings=timings, speedup=speedup, flags=sorted(set(flags)), seed=config.seed, trials=config.trials,
            stages={k: round(v, 4) for k, v in stages.items()}, environment=environment(),
            config=config.model_dump(),
        )

    # 1. compile, in its own process, before any rank starts.
    outcome = compile_candidate(candidate_path, limits.compile_s, device)
    stages["compile"] = outcome.seconds
    if not outcome.ok:
        failure = Failure(verdict=outcome.verdict, message=outcome.message, evidence=outcome.evidence,  # type: ignore[arg-type]
                          phase="compile")
        return result(outcome.verdict)

    env = {"TORCH_EXTENSIONS_DIR": str(extensions_dir())}
    pool = RankPool(world_size, device, start_timeout=limits.start_s, env=env, keep_logs=log_dir, gpus=gpus)
    phase = "launch"
    started = time.perf_counter()
    try:
        # 2. launch the ranks.
        pool.start()
        stages["launch"] = time.perf_counter() - started
        base = {"problem": problem.loader_spec, "candidate": str(candidate_path), "shape": shape}

        # 3. load the candidate on every rank (in-process builds hit the cache filled in step 1).
        phase, started = "load", time.perf_counter()
        _ask(pool, {"op": "load_candidate", **base}, phase, limits.load_s, limits.grace_s)
        stages["load"] = time.perf_counter() - started

        # 4. correctness: fresh inputs per trial, candidate first, every rank compared.
        phase, started = "check", time.perf_counter()
        replies = _ask(pool, {"op": "check", **base, "seed": config.seed, "trials": config.trials},
                       phase, limits.check_s, limits.grace_s)
        stages["check"] = time.perf_counter() - started
        max_abs = max(r.get("max_abs_err", 0.0) for r in replies)
        max_rel = max(r.get("max_rel_err", 0.0) for r in replies)
        for r in replies:
            flags.extend(r.get("flags", []))

        # 5. timing, only for a correct candidate; the reference with the very same protocol.
        if not config.skip_timing:
            phase, started = "timing", time.perf_counter()
            timing_req = {"op": "time", **base, "seed": config.seed, "trial_base": TIMING_TRIAL_BASE,
                          "config": config.timing.model_dump()}
            clock = "cuda_events" if device == "cuda" else "host"
            key = reference_key(problem, shape, world_size, device, config)
            ref_stats = reference_cache.lookup(key) if config.use_reference_cache else None
            if ref_stats is None:
                ref_replies = _ask(pool, {**timing_req, "candidate": None}, "timing_reference",
                                   limits.time_s, limits.grace_s)
                ref_stats = TimingStats.from_ranks(ref_replies, clock)
                reference_cache.store(key, ref_stats)
            cand_replies = _ask(pool, timing_req, phase, limits.time_s, limits.grace_s)
            timings = Timings(reference=ref_stats, candidate=TimingStats.from_ranks(cand_replies, clock))
            stages["timing"] = time.perf_counter() - started
    except _Stop as stop:
        stages[phase] = time.perf_counter() - started
        failure = stop.failure
        flags.extend(stop.flags)
    except PoolError as err:
        stages[phase] = time.perf_counter() - started
        failure = Failure(verdict=failures.INFRA_ERROR, message=str(err), phase=phase)  # type: ignore[arg-type]
    finally:
        teardown = time.perf_counter()
        if failure is None:
            pool.close()
        else:
            pool.kill()  # after a failure the ranks may be stuck in a collective: no polite exit
        stages["teardown"] = time.perf_counter() - teardown
    return result(failure.verdict if failure else failures.CORRECT)
