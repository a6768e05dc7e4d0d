"""One candidate, one problem, one shape, W ranks: the harness protocol of DESIGN.md, start to end.

compile (own process, time limit) -> static findings -> launch W ranks (sealed reply channel) -> audit
inputs drawn and the reference run before any candidate code exists -> load the candidate ->
correctness over T trials, stress trials and the precision probe -> the audit call, judged here ->
timing of reference and candidate (identical protocol; every candidate output verified) ->
plausibility (positive times, fresh inputs, roofline) -> one EvalResult. Every phase has a limit; a
phase that overruns kills the whole rank group and reads as a deadlock. No process outlives the call.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from pathlib import Path
from typing import Any

from harness import channel, failures, integrity, pkb_compat, reference_cache
from harness.compare import compare_outputs
from harness.compile import compile_candidate, extensions_dir
from harness.config import EvalConfig, TimingConfig
from harness.fingerprint import environment, hardware_key
from harness.flags import fast_eligible
from harness.integrity import IntegrityConfig
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


def _failure_from(reply: dict[str, Any], phase: str) -> tuple[Failure, list[str]]:
    verdict = reply.get("verdict", failures.INFRA_ERROR)
    if verdict not in failures.VERDICTS or verdict == failures.CORRECT:
        # Only a tampered rank says "failed" with no failure class: trust nothing it sent.
        return Failure(verdict=failures.RUNTIME_ERROR, phase=phase, rank=reply.get("rank"),  # type: ignore[arg-type]
                       message=f"rank {reply.get('rank')} failed with verdict {verdict!r}, which is not a "
                               f"failure class: its reply was tampered with"), [integrity.TAMPERING]
    return Failure(
        verdict=verdict,
        message=reply.get("message", "no message"),
        rank=reply.get("rank"),
        trial=reply.get("trial"),
        phase=phase,
        evidence=reply.get("evidence", ""),
        max_abs_err=reply.get("max_abs_err"),
        max_rel_err=reply.get("max_rel_err"),
    ), []


def _first_failure(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """The root failure: a rank whose process died (its peers then fail on the broken connection), else
    the lowest trial (later trials may fail because of it), then the lowest rank."""
    return min(replies, key=lambda r: (not r.get("died"),
                                       r.get("trial") if isinstance(r.get("trial"), int) else 1 << 60,
                                       r.get("rank", 0)))


def _flags_of(replies: Any) -> list[str]:
    return sorted({f for r in replies for f in r.get("flags", []) if isinstance(f, str)})


def _ask(pool: RankPool, message: dict[str, Any], phase: str, timeout: float, grace: float) -> list[dict]:
    """One request to every rank; the first failing rank's reply becomes the verdict."""
    try:
        replies = pool.request(message, timeout=timeout, grace=grace)
    except Hang as hang:
        failed = [r for r in hang.replies.values() if not r.get("ok")]
        if failed:  # a rank failed and its peers were left waiting in a collective: its failure counts
            failure, extra = _failure_from(_first_failure(failed), phase)
            raise _Stop(failure, _flags_of(hang.replies.values()) + extra) from hang
        raise _Stop(Failure(
            verdict=failures.DEADLOCK, phase=phase,
            message=f"{phase}: rank(s) {', '.join(map(str, hang.missing))} did not finish within "
                    f"{hang.timeout:.0f} s; the rank group was killed",
        ), _flags_of(hang.replies.values())) from hang
    failed = [r for r in replies if not r.get("ok")]
    if failed:
        failure, extra = _failure_from(_first_failure(failed), phase)
        raise _Stop(failure, flags=_flags_of(replies) + extra)
    return replies


def reference_key(problem: Problem, shape: str, world_size: int, device: str, config: EvalConfig) -> str:
    return "|".join([problem.name, problem.source_sha256[:16], shape, str(world_size), device,
                     hardware_key(), config.timing_key(), str(config.seed)])


class _Audit:
    """The audit trial: inputs drawn from a salt only the parent knows, before the candidate is loaded;
    the reference's outputs and later the candidate's come back as files whose digest is in the signed
    reply; the comparison runs here, in a process no candidate code ever ran in."""

    def __init__(self, pool: RankPool, problem: Problem) -> None:
        self.pool = pool
        self.problem = problem
        self.key = secrets.token_hex(8)
        self.expected: dict[int, Any] = {}

    def _file(self, what: str, rank: int) -> Path:
        assert self.pool.tmp is not None
        return Path(self.pool.tmp.name) / f"audit-{what}-rank{rank}.bin"

    def _read(self, what: str, reply: dict[str, Any]) -> Any:
        path = self._file(what, reply["rank"])
        try:
            return channel.read_tree(path, reply[what])
        finally:
            path.unlink(missing_ok=True)  # the expected outputs must be gone before the candidate loads

    def prepare(self, base: dict[str, Any], seed: int, limits: Any) -> None:
        replies = _ask(self.pool, {"op": "audit_prepare", **base, "seed": seed, "salt": secrets.randbits(31) | 1,
                                   "key": self.key}, "audit", limits.check_s, limits.grace_s)
        for reply in replies:
            self.expected[reply["rank"]] = self._read("expected", reply)

    def run(self, base: dict[str, Any], limits: Any) -> list[dict[str, Any]]:
        replies = _ask(self.pool, {"op": "audit_run", **base, "key": self.key}, "audit", limits.check_s,
                       limits.grace_s)
        for reply in sorted(replies, key=lambda r: r["rank"]):
            rank = reply["rank"]
            where = f"rank {rank}, audit trial (inputs drawn before the candidate was loaded, compared by the " \
                    f"harness process)"
            try:
                got = self._read("output", reply)
            except (KeyError, ValueError, RuntimeError, OSError) as err:
                raise _Stop(Failure(verdict=failures.OUTPUT_MISMATCH, phase="audit", rank=rank,  # type: ignore[arg-type]
                                    message=f"{where}: its output could not be read back: {err}"),
                            [integrity.AUDIT_FAILED, integrity.TAMPERING]) from err
            result = compare_outputs(self.expected[rank], got, self.problem.atol, self.problem.rtol)
            if not result["ok"]:
                raise _Stop(Failure(verdict=result["verdict"], phase="audit", rank=rank,
                                    message=f"{where}: {result['message']}", max_abs_err=result.get("max_abs_err"),
                                    max_rel_err=result.get("max_rel_err")),
                            _flags_of(replies) + [integrity.AUDIT_FAILED])
        self.expected.clear()
        return replies


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
    integrity_config: IntegrityConfig | dict[str, Any] | None = None,
) -> EvalResult:
    """Run the whole protocol; `gpus` picks the physical GPUs (one per rank) on a multi-GPU node.
    The integrity checks are the device's defaults with `config.integrity`'s settings on top;
    `integrity_config`, where given, replaces `config.integrity`."""
    config = config or EvalConfig(timing=TimingConfig.for_device(device))
    checks = IntegrityConfig.coerce(
        integrity_config if integrity_config is not None else config.integrity.overrides(), device)
    candidate_path = Path(candidate_path).resolve()
    source = candidate_path.read_bytes()
    stages: dict[str, float] = {}
    flags: list[str] = []
    failure: Failure | None = None
    timings: Timings | None = None
    max_abs = max_rel = None
    limits = config.limits
    # The salt makes inputs unpredictable before the first call; it is recorded for reproduction.
    salt = secrets.randbits(31) | 1
    evidence: dict[str, Any] = {"salt": salt, "checks": checks.to_dict()}

    def note_collectives(phase: str, replies: list[dict[str, Any]]) -> None:
        seen = {str(r["rank"]): r["collectives"] for r in replies if r.get("collectives")}
        if seen:
            evidence.setdefault("collectives", {})[phase] = seen
            flags.append(integrity.USES_NCCL)

    def result(verdict: str) -> EvalResult:
        speedup = None
        if timings is not None and timings.candidate.median_ms > 0:
            speedup = timings.reference.median_ms / timings.candidate.median_ms
        all_flags = sorted(set(flags))
        return EvalResult(
            problem=problem.name, category=problem.category, origin=problem.origin, shape=shape,
            world_size=world_size, device=device,  # type: ignore[arg-type]
            candidate=CandidateInfo(path=str(candidate_path), sha256=hashlib.sha256(source).hexdigest()),
            verdict=verdict,  # type: ignore[arg-type]
            correct=verdict == failures.CORRECT, failure=failure, max_abs_err=max_abs, max_rel_err=max_rel,
            timings=timings, speedup=speedup, flags=all_flags, seed=config.seed, trials=config.trials,
            fast_eligible=fast_eligible(all_flags), integrity=evidence,
            stages={k: round(v, 4) for k, v in stages.items()}, environment=environment(),
            config=config.model_dump(),
        )

    if problem.origin == "pkb":
        # PKB's generators may leave inputs constant across trials (or the harness had to perturb them):
        # the record says so, whatever the verdict.
        flags.extend(pkb_compat.input_flags(problem, shape, world_size))

    # 1. compile, in its own process, before any rank starts. A build stopped at its limit is ended
    # whole, its lock removed (harness.compile.stop_build); the record says what that took.
    outcome = compile_candidate(candidate_path, limits.compile_s, device, problem=problem.loader_spec)
    stages["compile"] = outcome.seconds
    if outcome.cleanup:
        evidence["stopped_build"] = outcome.cleanup
    if not outcome.ok:
        failure = Failure(verdict=outcome.verdict, message=outcome.message, evidence=outcome.evidence,  # type: ignore[arg-type]
                          phase="compile")
        return result(outcome.verdict)
    static = integrity.static_scan(source.decode(errors="replace"))
    if static:
        evidence["static"] = static
        flags.extend(f["flag"] for f in static)

    env = {"TORCH_EXTENSIONS_DIR": str(extensions_dir())}
    pool = RankPool(world_size, device, start_timeout=limits.start_s, env=env, keep_logs=log_dir, gpus=gpus)
    phase = "launch"
    started = time.perf_counter()
    try:
        # 2. launch the ranks; each takes its reply key before any candidate code exists.
        pool.start()
        stages["launch"] = time.perf_counter() - started
        base = {"problem": problem.loader_spec, "candidate": str(candidate_path), "shape": shape,
                "integrity": checks.to_dict()}

        # 3. the audit's inputs and reference outputs, while the ranks are still clean.
        audit = _Audit(pool, problem)
        if checks.audit:
            phase, started = "audit", time.perf_counter()
            audit.prepare(base, config.seed, limits)
            stages["audit"] = time.perf_counter() - started

        # 4. load the candidate on every rank (in-process builds hit the cache filled in step 1).
        phase, started = "load", time.perf_counter()
        replies = _ask(pool, {"op": "load_candidate", **base}, phase, limits.load_s, limits.grace_s)
        flags.extend(_flags_of(replies))
        stages["load"] = time.perf_counter() - started

        # 5. correctness: fresh inputs per trial, candidate first, every rank compared; then stress trials
        # (one rank late) and the precision probe; then the audit call, judged here.
        phase, started = "check", time.perf_counter()
        replies = _ask(pool, {"op": "check", **base, "seed": config.seed, "salt": salt, "trials": config.trials},
                       phase, limits.check_s, limits.grace_s)
        max_abs = max(r.get("max_abs_err", 0.0) for r in replies)
        max_rel = max(r.get("max_rel_err", 0.0) for r in replies)
        flags.extend(_flags_of(replies))
        note_collectives("check", replies)
        notes = {k: v for r in replies for k, v in (r.get("notes") or {}).items()}
        if notes:
            evidence["notes"] = notes
        if checks.audit:
            phase = "audit"
            replies = audit.run(base, limits)
            note_collectives("audit", replies)
            flags.extend(_flags_of(replies))
        stages["check"] = time.perf_counter() - started

        # 6. timing, only for a correct candidate; the reference with the very same protocol.
        if not config.skip_timing:
            phase, started = "timing", time.perf_counter()
            timing_req = {"op": "time", **base, "seed": config.seed, "salt": salt, "trial_base": TIMING_TRIAL_BASE,
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
            flags.extend(_flags_of(cand_replies))
            note_collectives("timing", cand_replies)
            timings = Timings(reference=ref_stats, candidate=TimingStats.from_ranks(cand_replies, clock))
            stages["timing"] = time.perf_counter() - started
            flags.extend(_plausibility(cand_replies, timings.candidate, checks, evidence))
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
    if failure is None and timings is not None:
        # After the ranks are gone: the bound traces the reference once (then reads a cache), in clean
        # processes of its own, never in ranks that have loaded the candidate, never beside them.
        bound = integrity.roofline_bound_ms(problem, shape, world_size, device)
        if bound is not None:
            evidence["roofline_bound_ms"] = bound
            if timings.candidate.median_ms < checks.impossible_slack * bound:
                flags.append(integrity.IMPOSSIBLE)
    return result(failure.verdict if failure else failures.CORRECT)


def _plausibility(replies: list[dict[str, Any]], stats: TimingStats, checks: IntegrityConfig,
                  evidence: dict[str, Any]) -> list[str]:
    """What the parent can tell about the candidate's timings without trusting the ranks' processes."""
    flags = []
    problems = [p for r in replies for p in integrity.timing_problems(r.get("times_ms", []))]
    if problems:
        flags.append(integrity.TIMING_IMPLAUSIBLE)
        evidence["timing_problems"] = sorted(set(problems))
    rotated = stats.fresh_pair_median_ms if stats.fresh_pair_median_ms is not None else stats.median_ms
    if integrity.caching_suspected(rotated, stats.fresh_median_ms, checks):
        flags.append(integrity.INPUT_CACHING)
        evidence["input_caching"] = {"rotated_median_ms": rotated, "fresh_median_ms": stats.fresh_median_ms}
    return flags
