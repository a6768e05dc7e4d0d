"""One candidate, one problem, one shape, W ranks: the harness protocol, start to end.

    compile (sandboxed, time limit) -> static findings
    -> reference side: a clean pool draws every input, runs the reference, writes inputs and expected
       outputs to this evaluation's private folder, times the reference (or reads the signed cache);
       meanwhile the candidate's sandboxed pool starts, with no candidate code in it yet
    -> candidate side: load the candidate; one request per correctness call, each carrying its inputs,
       in a secret order; every output judged here as it comes back
    -> timing, one request per iteration, the same for the candidate as for the reference: outputs of
       calls chosen after they returned are judged; claimed times reconciled with this process's clock
    -> plausibility (positive times, fresh inputs, roofline) -> one EvalResult.

Nothing here runs candidate code or reads anything from a candidate but data files and JSON replies;
every comparison, flag and verdict is computed in this process (harness.judge). Every phase has a
limit; an overrun kills the whole rank group and reads as a deadlock when ranks waited on each other,
as a timeout when they were busy (harness.judge.watchdog), with their stacks. No process outlives the
call, and no file outside the evaluation's folders is left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import random
import secrets
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch

from harness import cancel
from harness.common import failures, hostile_files, integrity, messages
from harness.common.compare import compare_outputs
from harness.common.flags import EMULATED, fast_eligible
from harness.common.integrity import IntegrityConfig
from harness.common.seeds import TIMING_TRIAL_BASE, fill_recipe
from harness.compiling import requirements
from harness.compiling.compile import CompileOutcome, compile_candidate, keep_lazy_builds, private_copy, visible_for
from harness.config import EvalConfig, TimingConfig
from harness.emulation import rewrite_record
from harness.emulation.errors import parse_refusal, refusal_is_plausible
from harness.judge import plausibility, timing, trials, watchdog
from harness.judge.reference import ReferenceFailed, ReferenceRun
from harness.judge.static_scan import static_scan
from harness.launch.pool import Hang, PoolError, RankMisbehaved, RankPool
from harness.launch.sandbox import SandboxUnavailable
from harness.launch.sandbox.budget import evaluation_limits
from harness.launch.sandbox.limits import SandboxLimits
from harness.launch.sandbox.private import private_folder, remove_private, stage_file
from harness.measure import roofline
from harness.problems.parallelkernelbench import input_report
from harness.problems.parallelkernelbench import multicast as pkb_multicast
from harness.problems.problem import Problem
from harness.rank import transport
from harness.rank.candidate import required_positional
from harness.records import reference_cache
from harness.records.environment import environment, hardware_key
from harness.records.redaction import redact_value, secret_names
from harness.records.results import CandidateInfo, Clock, EvalResult, Failure, Timings, TimingStats

# The scratch folders the harness and the ranks exchange files through: calls (a call's inputs and the
# ranks' outputs), sets (timing inputs: only the harness writes there), kept (timed outputs to judge).
EXCHANGE_DIRS = {"calls": True, "sets": False, "kept": True}


class _Stop(Exception):
    """Ends the protocol early with a failure."""

    def __init__(self, failure: Failure, flags: list[str] | None = None) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.flags = flags or []


def _failure_from(reply: dict[str, Any], phase: str) -> tuple[Failure, list[str]]:
    """A failure a rank reported about itself. It can only hurt the candidate, so it is taken at its word
    for the class, except a class that is not a failure (a tampered rank claiming success)."""
    verdict = reply.get("verdict", failures.RUNTIME_ERROR)
    # A candidate's rank cannot declare itself correct, nor claim infra_error (retried, never charged):
    # whatever it says beyond "I failed" is the candidate's runtime error.
    if verdict not in failures.VERDICTS or verdict in (failures.CORRECT, failures.INFRA_ERROR):
        verdict = failures.RUNTIME_ERROR
    if reply.get("build") and verdict == failures.RUNTIME_ERROR:
        verdict = failures.COMPILE_ERROR  # a build inside the first call failed: the compiler's error
    return Failure(
        verdict=verdict,
        message=str(reply.get("message", "no message"))[:1500],
        rank=reply.get("rank") if isinstance(reply.get("rank"), int) else None,
        trial=reply.get("trial") if isinstance(reply.get("trial"), int) else None,
        phase=phase,
        evidence=str(reply.get("evidence", ""))[:4000],
    ), [f for f in reply.get("flags", []) if isinstance(f, str)]


def redacted(result: EvalResult) -> EvalResult:
    """The record with every value of the harness's secrets replaced (harness.records.redaction): its messages,
    evidence and stacks carry what candidate code printed or made the harness read."""
    if not secret_names():
        return result
    return EvalResult.model_validate(redact_value(result.model_dump()))


def _first_failure(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """The root failure: a rank whose process died (its peers then fail on the broken connection), else
    the lowest rank."""
    return min(replies, key=lambda r: (not r.get("died"), r.get("rank", 0)))


def _flags_of(replies: Any) -> list[str]:
    return sorted({f for r in replies for f in r.get("flags", []) if isinstance(f, str)})


def reference_key(problem: Problem, shape: str, world_size: int, device: str, config: EvalConfig) -> str:
    return "|".join([problem.name, problem.source_sha256[:16], shape, str(world_size), device,
                     hardware_key(), config.timing_key(), str(config.seed), f"rpg{config.ranks_per_gpu}",
                     "per-iteration-v3-refill"])


class _Evaluation:
    """The state of one evaluation: what the record will say, and the pools and folders to clean up."""

    def __init__(self, problem: Problem, candidate_path: Path, world_size: int, device: str, shape: str,
                 config: EvalConfig, checks: IntegrityConfig, log_dir: Path | None, gpus: list[int] | None) -> None:
        self.problem, self.path, self.world_size, self.device, self.shape = problem, candidate_path, world_size, \
            device, shape
        self.config, self.checks, self.log_dir, self.gpus = config, checks, log_dir, gpus
        self.source = candidate_path.read_bytes()
        self.stages: dict[str, float] = {}
        self.flags: list[str] = []
        self.failure: Failure | None = None
        self.timings: Timings | None = None
        self.max_abs: float | None = None
        self.max_rel: float | None = None
        # The secret: it orders the trials, mixes the seed, and picks the timed calls that are judged. It
        # never enters a candidate's process.
        self.salt = secrets.randbits(31) | 1
        self.rng = random.Random(secrets.randbits(64))
        self.evidence: dict[str, Any] = {"salt": self.salt, "checks": checks.to_dict()}
        # Under the private root (harness.launch.sandbox.private): no sandbox sees it, whatever TMPDIR is, except the
        # read-only copy of the candidate the ranks import (its own folder is never bound).
        self.folder = private_folder("pkb-eval-")
        self.ref_dir = self.folder / "reference"
        self.ref_dir.mkdir()
        self.code_path = stage_file(self.source, candidate_path.name, self.folder / "code")
        self.reference: ReferenceRun | None = None
        self.pool: RankPool | None = None
        self.ext_copy: Path | None = None
        self.ext_files: hostile_files.Folder | None = None  # ext_copy, held open before the ranks can write it
        self.ext_entry: Path | None = None
        self.seed = 0  # the run's seed mixed with the salt: only trusted processes ever hold it
        self.plan: timing.Plan | None = None
        self._timed_judged = 0  # judged calls of the timing phase so far
        self.abandoned = False  # stopped from outside (Ctrl-C, a cancelled task): its pools are killed, not closed

    # -- the record ---------------------------------------------------------------------------
    def result(self) -> EvalResult:
        if self.failure is not None:  # tracebacks name the ranks' copy of the file: the record names the user's
            copy, own = str(self.code_path), str(self.path)
            self.failure = self.failure.model_copy(update={"message": self.failure.message.replace(copy, own),
                                                           "evidence": self.failure.evidence.replace(copy, own)})
        verdict = self.failure.verdict if self.failure else failures.CORRECT
        speedup = None
        if self.timings is not None and self.timings.candidate.median_ms > 0:
            speedup = self.timings.reference.median_ms / self.timings.candidate.median_ms
        emulated = self.config.ranks_per_gpu > 1
        all_flags = sorted(set(self.flags) | ({EMULATED} if emulated else set()))
        return redacted(EvalResult(
            problem=self.problem.name, category=self.problem.category, origin=self.problem.origin, shape=self.shape,
            world_size=self.world_size, device=self.device,
            candidate=CandidateInfo(path=str(self.path), sha256=hashlib.sha256(self.source).hexdigest()),
            verdict=verdict,
            correct=verdict == failures.CORRECT, failure=self.failure, max_abs_err=self.max_abs,
            max_rel_err=self.max_rel, timings=self.timings, speedup=speedup, flags=all_flags,
            seed=self.config.seed, trials=self.config.trials, fast_eligible=fast_eligible(all_flags), emulated=emulated,
            integrity=self.evidence, stages={k: round(v, 4) for k, v in self.stages.items()},
            environment=environment(), config=self.config.model_dump(),
        ))

    def ask(self, pool: RankPool, message: Any, phase: str, timeout: float,
            build_allowance: float = 0.0) -> list[dict[str, Any]]:
        """One request to every rank of the candidate's pool; a failing rank's report, a hang or a broken
        sandbox limit becomes the verdict."""
        try:
            replies = pool.request(message, timeout=timeout, grace=self.config.limits.grace_s,
                                   build_allowance=build_allowance)
        except Hang as hang:
            failed = [r for r in hang.replies.values() if not r.get("ok")]
            if failed:  # a rank failed and its peers were left waiting in a collective: its failure counts
                failure, extra = _failure_from(_first_failure(failed), phase)
                raise _Stop(self.emulation_refusal(failure), _flags_of(hang.replies.values()) + extra) from hang
            building = pool.building(hang.missing)
            if building:
                raise _Stop(Failure(
                    verdict=failures.COMPILE_ERROR, phase="compile",
                    message=f"a native build inside the first call on rank(s) {', '.join(map(str, building))} did "
                            f"not finish within {build_allowance:.0f} s (Limits.build_s)",
                    evidence=watchdog.evidence(hang.stacks))) from hang
            verdict, why = watchdog.classify(hang.missing, hang.stacks)
            if hang.stacks:
                self.evidence["stacks"] = {str(k): v for k, v in sorted(hang.stacks.items())}
            raise _Stop(Failure(
                verdict=verdict, phase=phase,
                message=f"{phase}: rank(s) {', '.join(map(str, hang.missing))} did not finish within "
                        f"{hang.timeout:.0f} s; {why}; the rank group was killed",
                evidence=watchdog.evidence(hang.stacks),
            ), _flags_of(hang.replies.values())) from hang
        except RankMisbehaved as err:
            raise _Stop(Failure(verdict=failures.RUNTIME_ERROR, phase=phase, rank=err.rank,
                                message=str(err), evidence=err.evidence)) from err
        for reply in replies:  # what a rank's tripwires named (a mode left active), beside its flag
            if isinstance(reply.get("tripwire"), list):
                self.evidence.setdefault("tripwire", {})[str(reply.get("rank"))] = [str(m)[:200] for m in
                                                                                  reply["tripwire"][:8]]
        failed = [r for r in replies if not r.get("ok")]
        if failed:
            failure, extra = _failure_from(_first_failure(failed), phase)
            raise _Stop(self.emulation_refusal(failure), flags=_flags_of(replies) + extra)
        return replies

    def emulation_refusal(self, failure: Failure) -> Failure:
        """With ranks sharing GPUs, a failure that is the emulation refusing an API it cannot serve
        (multicast, NCCL, torch's symm_mem ops) is nobody's fault: infra_error, not charged. The message is
        the rank's claim, so it counts only where the candidate's source names such an API."""
        if self.config.ranks_per_gpu <= 1 or failure.verdict != failures.RUNTIME_ERROR:
            return failure
        refusal = parse_refusal(f"{failure.message}\n{failure.evidence}")
        if refusal is None or not refusal_is_plausible(refusal, self.source.decode(errors="replace")):
            return failure
        return failure.model_copy(update={"verdict": failures.INFRA_ERROR, "infra_cause": "emulation",
                                          "message": f"not available in emulation: {failure.message}"})

    def note_collectives(self, phase: str, events: dict[int, dict[str, int]],
                         replies: list[dict[str, Any]] | None = None, loopback: int | None = None) -> None:
        """Collectives inside candidate calls: events the ranks' monitors sent as they happened, the
        counts in their replies, and bytes on the sandbox's loopback (read from outside)."""
        seen: dict[str, Any] = {}
        for rank, counts in events.items():
            seen.setdefault(str(rank), {})["events"] = counts
        for reply in replies or []:
            if reply.get("collectives"):
                seen.setdefault(str(reply["rank"]), {}).update(reply["collectives"])
        if loopback:
            # Read from outside the sandbox: what its ranks sent each other over sockets (gloo, NCCL's
            # bootstrap) during candidate calls, which no in-process counter can wind back.
            traffic = self.evidence.setdefault("loopback_bytes", {})
            traffic[phase] = traffic.get(phase, 0) + loopback
            self.flags.append(integrity.USES_TORCH_COLLECTIVES)
        if seen:
            self.evidence.setdefault("collectives", {}).setdefault(phase, {}).update(seen)
            self.flags.append(integrity.USES_TORCH_COLLECTIVES)

    # -- phases -------------------------------------------------------------------------------
    def compile(self, built: CompileOutcome | None = None) -> bool:
        """The compile stage; `built`: evaluate()'s argument of that name."""
        outcome = built if built is not None and not built.ok else compile_candidate(
            self.path, self.config.limits.compile_s, self.device, problem=self.problem.loader_spec,
            limits=SandboxLimits.for_ranks(1, self.checks))
        self.stages["compile"] = outcome.seconds
        if outcome.cleanup:
            self.evidence["stopped_build"] = outcome.cleanup
        if outcome.built_again_alone:
            self.evidence["built_again_alone"] = outcome.built_again_alone
        if outcome.builds:
            self.evidence["builds"] = outcome.builds
        if not outcome.ok:
            self.failure = Failure(verdict=outcome.verdict, message=outcome.message,
                                   evidence=outcome.evidence, phase="compile")
            if outcome.native and outcome.verdict == failures.COMPILE_ERROR:  # no build folder was kept
                self.note_rewrites(rewrite_record.of_source(self.source.decode(errors="replace")))
            return False
        self.ext_entry = outcome.extensions
        static = static_scan(self.source.decode(errors="replace"))
        if static:
            self.evidence["static"] = static
            self.flags.extend(f["flag"] for f in static)
        return True

    def note_rewrites(self, record: dict[str, Any] | None) -> None:
        """Builds whose CUDA source was rewritten for multimem (harness.emulation.rewrite_record)."""
        if record is not None:
            self.evidence.setdefault("emulation", {})["multimem_rewritten"] = record

    def start_pools(self) -> None:
        limits = self.config.limits
        self.reference = ReferenceRun(self.problem, self.shape, self.world_size, self.device, self.ref_dir,
                                      limits.reference_s, gpus=self.gpus, start_s=limits.start_s,
                                      ranks_per_gpu=self.config.ranks_per_gpu, call_s=limits.reference_call_s,
                                      scale=limits.reference_scale, slack_s=limits.reference_slack_s).launch()
        self.ext_copy = private_copy(self.ext_entry, self.folder / "extensions")
        self.ext_files = hostile_files.Folder.open(self.ext_copy)
        self.pool = RankPool(self.world_size, self.device, start_timeout=limits.start_s, keep_logs=self.log_dir,
                             gpus=self.gpus, role="candidate", extensions=self.ext_copy,
                             visible=visible_for(self.code_path, self.problem.loader_spec),
                             ranks_per_gpu=self.config.ranks_per_gpu,
                             sandbox_limits=evaluation_limits(self.problem, self.shape, self.world_size,
                                                              self.device, self.checks))
        self.pool.launch()
        for name, writable in EXCHANGE_DIRS.items():  # before any candidate code can plant a link there
            self.pool.exchange_dir(name, writable)
        self.evidence["sandbox"] = self.pool.record()

    def run_reference(self, schedule: list[trials.Trial], seed: int) -> TimingStats | None:
        assert self.reference is not None and self.pool is not None
        started = time.perf_counter()
        self.reference.wait_ready()
        self.reference.prepare_trials(schedule, seed)
        sets = None
        if not self.config.skip_timing:
            self.plan = self.timing_plan()
            sets = self.reference.prepare_sets(seed, self.config.timing, self.checks.fresh_iters, self.plan)
            if not sets.refill:
                self.plan = self.plan.without_refill()
        self.stages["reference"] = time.perf_counter() - started
        # The candidate's pool has been starting meanwhile; no candidate code is in it yet, and it stays
        # idle while the reference is timed.
        launch = time.perf_counter()
        try:
            self.pool.wait_ready()
        except PoolError as err:
            raise _Stop(Failure(verdict=failures.INFRA_ERROR, phase="launch", infra_cause="launch",
                                message=f"the candidate's sandboxed ranks did not start: {err}")) from err
        # From launch to ready, overlapping the reference's work; `launch_wait` is what the reference left.
        self.stages["launch"] = self.pool.start_seconds
        self.stages["launch_wait"] = time.perf_counter() - launch
        ref_stats = None
        if sets is not None:
            started = time.perf_counter()
            key = reference_key(self.problem, self.shape, self.world_size, self.device, self.config)
            cv_max = self.checks.reference_cv_max
            ref_stats = reference_cache.lookup(key, cv_max) if self.config.use_reference_cache else None
            if ref_stats is None:
                assert self.plan is not None
                reference, plan = self.reference, self.plan
                ref_stats, record = reference_cache.time_until_stable(
                    lambda: reference.time(self.config.timing, seed, plan), cv_max, self.checks.reference_attempts)
                record["cached"] = record["stable"]  # an unstable timing is used here, never reused
                if record["stable"]:
                    reference_cache.store(key, ref_stats)
            else:
                record = {"cv": ref_stats.cv, "cv_max": cv_max, "stable": True, "attempts": 0, "from_cache": True,
                          "cached": True}
            self.evidence["reference_timing"] = record
            self.stages["timing_reference"] = time.perf_counter() - started
        self.reference.close()
        return ref_stats

    def timing_plan(self) -> timing.Plan:
        """The timing phase's calls, drawn from the secret: which are judged, where the precision probes go.
        Probes only where the correctness phase's probe could judge this problem; fewer judged calls where
        their expected outputs would exceed `timed_check_bytes`."""
        assert self.reference is not None
        notes = [rec.get("probe_note") for tid, by_rank in self.reference.trials.items() for rec in by_rank.values()
                 if tid == integrity.PROBE_TRIAL]
        probes = self.checks.timed_probes if self.checks.precision_probe and notes and not any(notes) else 0
        judged = self.checks.timed_checks
        first = min(self.reference.trials, default=None)
        out_bytes = sum((self.ref_dir / f"exp-{first}-r{r}.bin").stat().st_size for r in range(self.world_size)
                        if (self.ref_dir / f"exp-{first}-r{r}.bin").exists()) if first is not None else 0
        if out_bytes:
            judged = min(judged, max(0, self.checks.timed_check_bytes // out_bytes - probes))
        return timing.make_plan(self.config.timing, self.checks.fresh_iters, judged, probes, self.rng)

    def load(self) -> None:
        assert self.pool is not None and self.reference is not None
        limits = self.config.limits
        started = time.perf_counter()
        self.ask(self.pool, messages.Setup(problem=self.problem.loader_spec, shape=self.shape,
                                          groups=list(self.reference.groups)), "load", limits.load_s)
        params = len(_required(self.problem))
        replies = self.ask(self.pool, messages.LoadCandidate(candidate=str(self.code_path), params=params),
                           "load", limits.load_s)
        self.flags.extend(_flags_of(replies))
        events = self.pool.take_events()
        if events or any(r.get("collectives") for r in replies):
            self.evidence.setdefault("collectives", {})["import"] = {
                str(r["rank"]): r.get("collectives", {}) for r in replies if r.get("collectives")} | (
                {"events": {str(k): v for k, v in events.items()}} if events else {})
        self.stages["load"] = time.perf_counter() - started

    def check(self, schedule: list[trials.Trial]) -> None:
        assert self.pool is not None and self.reference is not None
        limits = self.config.limits
        pool, scratch, files = self.pool, self.pool.scratch, self.pool.scratch_files
        assert scratch is not None and files is not None
        calls_dir = scratch / "calls"
        with self.candidate_files("check"):
            files.make_dir("calls")
        # A slow reference (PKB's 76-78 take a minute a call at small shapes) stretches the budget; a fast
        # one leaves it as configured, whatever the machine's load did to its measured time.
        slow = self.reference.trial_seconds if self.reference.trial_seconds > 1.0 else 0.0
        budget = max(limits.check_s, limits.check_scale * slow * len(schedule))
        deadline = time.monotonic() + budget
        judge = trials.Judge(self.problem.atol, self.problem.rtol, self.device, self.ref_dir, files, self.world_size)
        results: list[trials.CallResult] = []
        started = time.perf_counter()
        for index, trial in enumerate(schedule):
            delays = trials.delays(trial, self.checks, self.world_size, self.rng)
            per_rank: dict[int, messages.Call] = {}
            paths = {}
            ref = self.reference.trials[trial.id]
            for rank in range(self.world_size):
                stem = calls_dir / f"c{index}-r{rank}"
                inputs = Path(f"{stem}-in.pt")
                with self.candidate_files("check"):  # a name planted where the inputs go: never written through
                    files.copy_new(inputs, self.ref_dir / f"in-{trial.id}-r{rank}.pt")
                paths[rank] = {"output": f"{stem}-out.bin", "previous_output": f"{stem}-prev.bin",
                               "inputs_after": f"{stem}-after.bin"}
                per_rank[rank] = messages.Call(
                    candidate=str(self.code_path), inputs=str(inputs), output=paths[rank]["output"],
                    previous_output=paths[rank]["previous_output"],
                    return_inputs=paths[rank]["inputs_after"] if ref[rank].get("mutated") else None,
                    delay_s=delays[rank], lazy_delay_s=self.checks.lazy_delay_s, busy_bytes=self.checks.busy_bytes)
            loopback = pool.net_bytes()
            timeout = max(1.0, deadline - time.monotonic())
            try:
                # A build only a call reveals (PKB's lazy builds) is limited by build_s, not the call's time.
                replies = self.ask(pool, per_rank, "check", timeout, build_allowance=limits.build_s)
            except _Stop as stop:
                if stop.failure.trial is None:
                    stop.failure.trial = trial.id
                if index == 0 and stop.failure.verdict == failures.COMPILE_ERROR:
                    stop.failure.phase = "compile"
                raise
            after = pool.net_bytes()
            traffic = after - loopback if after is not None and loopback is not None else None
            counted = index > 0  # a rank's first call is set-up: a rendezvous, groups, a lazy build
            events = pool.take_events()
            if counted and (events or traffic or any(r.get("collectives") for r in replies)):
                self.note_collectives("check", events, replies, traffic)
            self.flags.extend(_flags_of(replies))
            result = trials.CallResult(trial, index)
            judge.judge_call(result, replies, paths, ref)
            results.append(result)
            with self.candidate_files("check"):
                for rank in range(self.world_size):
                    for suffix in ("-in.pt", "-out.bin", "-out.bin.later", "-prev.bin", "-after.bin"):
                        files.unlink(f"calls/c{index}-r{rank}{suffix}")
        self.stages["check"] = time.perf_counter() - started
        if pool.build_seconds() > 0.0:
            # Builds inside calls, reported apart (and not charged to the check's budget: see build_s).
            self.stages["build_in_call"] = pool.build_seconds()
        notes_in = {int(r): rec.get("probe_note") for tid, by_rank in self.reference.trials.items()
                    for r, rec in by_rank.items() if tid == integrity.PROBE_TRIAL}
        failure, flags, notes = trials.decide(results, notes_in)
        self.flags.extend(flags)
        if notes:
            self.evidence["notes"] = notes
        self.evidence["rules"] = {rule: trials.RULES[rule] for rule in sorted(judge.rules)}
        self.evidence["order"] = [t.id for t in schedule]
        self.max_abs, self.max_rel = trials.worst_errors(results)
        if failure is not None:
            self.max_abs = failure.get("max_abs_err", self.max_abs)
            self.max_rel = failure.get("max_rel_err", self.max_rel)
            raise _Stop(Failure(verdict=failure["verdict"], message=failure["message"], rank=failure.get("rank"),
                                trial=failure.get("trial"), call=failure.get("call"), phase="check",
                                max_abs_err=failure.get("max_abs_err"), max_rel_err=failure.get("max_rel_err")))

    def time(self, ref_stats: TimingStats) -> None:
        assert self.pool is not None and self.reference is not None and self.reference.sets is not None
        assert self.plan is not None
        limits = self.config.limits
        sets, plan = self.reference.sets, self.plan
        scratch, files = self.pool.scratch, self.pool.scratch_files
        assert scratch is not None and files is not None
        started = time.perf_counter()
        sets_dir, keep_dir = scratch / "sets", scratch / "kept"
        per_rank: dict[int, messages.CallTimeBegin] = {}
        with self.candidate_files("timing"):
            files.make_dir("sets")
            files.make_dir("kept")
            for rank in range(self.world_size):
                if plan.refill:  # the rank draws its sets' first contents itself, as every call's
                    fills = [cast(messages.Recipe, fill_recipe(self.seed, TIMING_TRIAL_BASE + k, rank))
                             for k in range(sets.count)]
                    per_rank[rank] = messages.CallTimeBegin(candidate=str(self.code_path), clone_inputs=sets.mutated,
                                                            set_fills=fills)
                    continue
                names = [f"set{i}" for i in range(sets.count)] + [f"fresh{j}" for j in range(sets.fresh)]
                paths = []
                for name in names:
                    target = sets_dir / f"{name}-r{rank}.pt"
                    files.copy_new(target, self.ref_dir / f"in-{name}-r{rank}.pt")
                    paths.append(str(target))
                per_rank[rank] = messages.CallTimeBegin(candidate=str(self.code_path), clone_inputs=sets.mutated,
                                                        sets=paths[:sets.count], fresh=paths[sets.count:])
        self.ask(self.pool, per_rank, "timing", limits.time_s)
        self.pool.take_events()
        judged = [it for it in plan.iterations if it.judged]
        calls = sum(1 for it in plan.iterations if it.kind != "probe")
        self.evidence["timed_judging"] = {
            "refill": plan.refill, **({} if plan.refill else {"why_not": sets.why_not}),
            "calls": calls, "judged": len(judged), "probes": sum(1 for it in judged if it.kind == "probe"),
            "miss_probability_at_20pct_wrong": round(
                timing.miss_probability(calls, len(judged) - sum(1 for it in judged if it.kind == "probe"), 0.2), 6)}
        run = timing.drive(self.pool, self.ask, plan, n_sets=sets.count, recipes=timing.recipes_for(self.seed),
                           config=self.config.timing, cuda=self.device == "cuda", keep_dir=keep_dir,
                           call_timeout=limits.time_s, deadline=time.monotonic() + limits.time_s,
                           on_kept=lambda kept: None, check_inputs=not sets.mutated)
        self.note_collectives("timing", self.pool.take_events())
        clock: Clock = "cuda_events" if self.device == "cuda" else "host"
        candidate = timing.stats(run, clock)
        self.timings = Timings(reference=ref_stats, candidate=candidate)
        self.stages["timing"] = time.perf_counter() - started
        # Judged after the phase, not between its iterations: the judge's own work (torch's threads spinning
        # after a comparison) would otherwise slow the candidate's next iterations and not the reference's.
        # One torch thread: the comparisons are of at most timed_check_elements each, and on a busy machine
        # torch's thread pool made each one 5-15x slower (30 ms against 170-500 ms at 256K elements, 2 cores).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        wrong: list[tuple[timing.Kept, int, str]] = []
        try:
            for kept in run.kept:
                wrong += self._judge_timed_output(kept, sets, plan.refill)
        finally:
            torch.set_num_threads(threads)
            self.evidence["timed_outputs_judged"] = self._timed_judged
            for kept in run.kept:  # what judging left (it stopped early): the scratch goes at the end anyway
                for path in kept.paths.values():
                    with contextlib.suppress(hostile_files.HostileFile, OSError):
                        self._remove_kept(files, path)
        self.stages["timing_judge"] = time.perf_counter() - started - self.stages["timing"]
        if not plan.refill and not sets.mutated:
            for rank, prints in run.fingerprints.items():
                if prints != sets.fingerprints.get(rank):
                    self._inputs_changed(rank, "an input set changed while it was timed")
        if wrong:
            self._timed_calls_wrong(wrong)
        self._plausibility(run, candidate, ref_stats)

    def _inputs_changed(self, rank: int, what: str) -> None:
        self.flags.append(integrity.MUTATES_INPUTS)
        raise _Stop(Failure(verdict=failures.OUTPUT_MISMATCH, phase="timing", rank=rank,
                            message=f"rank {rank}: {what}: the candidate modifies its inputs"))

    def _judge_timed_output(self, kept: timing.Kept, sets: Any, refill: bool) -> list[tuple[timing.Kept, int, str]]:
        """A judged call of the timing phase: its output against the reference's for the same inputs, with the
        full tolerance (why it is wrong, per rank); its inputs after the call (the rank compares them with the
        draw they were copied from): changed inputs end the evaluation at once (phase timing)."""
        it = kept.iteration
        stem = f"t{it.trial}" if refill else (f"fresh{kept.set_index}" if it.request == "fresh"
                                               else f"set{kept.set_index}")
        self._timed_judged += 1
        files = self.pool.scratch_files if self.pool is not None else None
        assert files is not None
        wrong: list[tuple[timing.Kept, int, str]] = []
        for rank, path in sorted(kept.paths.items()):
            why = self._why_wrong(files, path, self.ref_dir / f"exp-{stem}-r{rank}.bin")
            if why is not None:
                wrong.append((kept, rank, why))
            self._remove_kept(files, path)
        if refill and not sets.mutated:
            for rank in sorted(kept.paths):
                if not kept.intact.get(rank):  # a rank that does not say they are intact has changed them
                    self._inputs_changed(rank, f"the inputs of a judged {it.kind} call changed during the call")
        return wrong

    def _timed_calls_wrong(self, wrong: list[tuple[timing.Kept, int, str]]) -> None:
        """The verdict of wrong judged calls: `timed_output_wrong`; where only precision probes were wrong
        (right on random inputs, wrong where the low bits matter), `reduced_precision` too."""
        plain = [w for w in wrong if w[0].iteration.kind != "probe"]
        kept, rank, why = (plain or wrong)[0]
        calls = len({id(w[0]) for w in wrong})
        self.flags.append(integrity.TIMED_OUTPUT_WRONG)
        note = ""
        if not plain:
            self.flags.append(integrity.REDUCED_PRECISION)
            note = (" (only precision probes among the timed calls were wrong: right on random inputs, wrong on "
                    "inputs whose low bits matter: reduced precision when timed)")
        raise _Stop(Failure(verdict=failures.OUTPUT_MISMATCH, phase="timing", rank=rank,
                            message=f"{calls} of {self._timed_judged} judged calls of the timing phase were wrong "
                                    f"although the check passed; first: rank {rank}, a {kept.iteration.kind} call: "
                                    f"{why}{note}"))

    def _why_wrong(self, files: hostile_files.Folder, path: Path, expected_path: Path) -> str | None:
        """Why one kept timed output is wrong (a sample of its elements, the full tolerance), or None. Every
        file is the rank's: read as hostile."""
        issue = path.with_suffix(".issue")
        try:
            if files.exists(issue):
                return f"not comparable: {files.read_text(issue, 4096)[:200]}"
            expected = trials.reference_file(expected_path)
            got = transport.read_tree(path, trials.output_limit(expected_path.stat().st_size, self.world_size), files)
            expected, got = timing.sampled(expected, got, self.checks.timed_check_elements, self.rng)
            verdict = compare_outputs(expected, got, self.problem.atol, self.problem.rtol)
        except (transport.TransportError, hostile_files.HostileFile) as err:
            return f"its output could not be read back: {err}"
        except Exception as exc:  # whatever the output is, failing to judge it is its failure
            return f"its output could not be judged: {type(exc).__name__}: {exc}"
        return None if verdict["ok"] else str(verdict["message"])

    def _remove_kept(self, files: hostile_files.Folder, path: Path) -> None:
        """A kept output and its note, gone from the scratch (through the held folder: no link followed)."""
        with self.candidate_files("timing"):
            for name in (path, path.with_suffix(".issue")):
                files.unlink(name)  # nothing there is fine

    @contextlib.contextmanager
    def candidate_files(self, phase: str) -> Iterator[None]:
        """Files the trusted side reads or writes in the candidate's scratch: anything wrong with them
        (a link, a FIFO, a name planted where the harness writes) is the candidate's failure."""
        try:
            yield
        except hostile_files.HostileFile as err:
            raise _Stop(Failure(verdict=failures.RUNTIME_ERROR, phase=phase,
                                message=f"{phase}: the harness refused a file in the candidate's scratch: {err}"),
                        [integrity.TAMPERING]) from err

    def _plausibility(self, run: timing.TimingRun, candidate: TimingStats, reference: TimingStats) -> None:
        problems = [p for ranks in run.times.get("timed", []) for p in plausibility.timing_problems(ranks)]
        problems = sorted(set(problems + plausibility.timing_problems([max(r) for r in run.times.get("timed", [])])))
        if problems:
            self.flags.append(integrity.TIMING_IMPLAUSIBLE)
            self.evidence["timing_problems"] = problems
        pairs = timing.fresh_pairs(run)
        if plausibility.caching_suspected(pairs, reference.median_ms, self.checks):
            self.flags.append(integrity.INPUT_CACHING)
            self.evidence["input_caching"] = {
                "pairs_ms": [[round(r, 4), round(f, 4)] for r, f in pairs],
                "median_excess_ms": plausibility.caching_excess_ms(pairs, self.checks),
                "margin_ms": plausibility.caching_margin_ms(reference.median_ms, self.checks)}
        if self.checks.reconcile:
            inconsistent = timing.reconcile(candidate, reference, self.checks)
            if inconsistent:
                self.flags.append(integrity.TIMING_INCONSISTENT)
                self.evidence["timing_inconsistent"] = inconsistent

    def cleanup(self) -> None:
        """Every process and folder of the evaluation goes, whatever fails on the way (it raises after)."""
        teardown = time.perf_counter()
        try:
            if self.reference is not None:
                self.reference.kill()
            if self.pool is not None:
                if self.failure is None and not self.abandoned:
                    self.pool.close()
                else:
                    self.pool.kill()  # after a failure the ranks may be stuck in a collective: no polite exit
            if not self.abandoned:  # the ranks are gone: what they built stays as it is now
                self.note_rewrites(rewrite_record.of_folder(self.ext_files, self.ext_entry))
            if self.ext_files is not None and self.failure is None and not self.abandoned:
                added = keep_lazy_builds(self.ext_files, self.ext_entry)
                if added:
                    self.evidence["lazy_builds_kept"] = added
        finally:
            if self.pool is not None:
                self.pool.kill()  # nothing when closed already
            if self.ext_files is not None:
                self.ext_files.close()
            remove_private(self.folder)
            self.stages["teardown"] = time.perf_counter() - teardown


def _required(problem: Problem) -> list[str]:
    return required_positional(problem.solution)


def build_limits(config: EvalConfig, device: str) -> SandboxLimits:
    """The compile stage's sandbox limits under `config` (without an `integrity_config` of evaluate()'s own):
    for a caller that builds ahead, so that its build is the one evaluate() would have made."""
    return SandboxLimits.for_ranks(1, IntegrityConfig.coerce(config.integrity.overrides(), device))


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
    built: CompileOutcome | None = None,
) -> EvalResult:
    """Run the whole protocol; `gpus` picks the physical GPUs (one per rank) on a multi-GPU node.
    The integrity checks are the device's defaults with `config.integrity`'s settings on top;
    `integrity_config`, where given, replaces `config.integrity`. `built`: the compile stage's outcome for
    this file, where the caller ran it already with `build_limits(config, device)` (agent.executors.local
    builds before it takes a GPU lease). A failure there is the verdict and is not built again: a second
    build that succeeded would start ranks on devices nobody leased. A success is found in the cache."""
    cancel.check()  # the process was interrupted: nothing new starts
    config = config or EvalConfig(timing=TimingConfig.for_device(device))
    checks = IntegrityConfig.coerce(
        integrity_config if integrity_config is not None else config.integrity.overrides(), device)
    if config.ranks_per_gpu > 1:
        # Ranks sharing a GPU run in its time slices: one rank late by 2 ms rarely exposes a race there
        # (measured on the H200: gpu_race_no_barrier passed 2 such trials). More, and later, stress calls.
        checks = dataclasses.replace(checks, stress_trials=max(checks.stress_trials, 6),
                                     stress_delay_s=max(checks.stress_delay_s, 0.02))
    ev = _Evaluation(problem, Path(candidate_path).resolve(), world_size, device, shape, config, checks, log_dir, gpus)
    if problem.origin == "pkb":
        # PKB's generators may leave inputs constant across trials (or the harness had to perturb them):
        # the record says which inputs, and why, whatever the verdict.
        report = input_report.input_report(problem, shape, world_size)
        ev.flags.extend(sorted(report.flags()))
        ev.evidence["inputs"] = report.as_dict()
    # What this machine cannot run (a CUDA candidate on a CPU-only run, a missing package): nobody's
    # failure, said at once in one line, never charged to the model.
    try:
        issue = requirements.environment_issue(problem, ev.path, device)
    except Exception as exc:  # noqa: BLE001 - it reads the candidate's source: a source it chokes on is the candidate's
        ev.failure = unexpected_failure(exc, "compile")
        remove_private(ev.folder)
        return ev.result()
    if issue:
        ev.failure = Failure(verdict=failures.INFRA_ERROR, message=issue, phase="environment",
                             infra_cause="environment")
        ev.evidence["environment_issue"] = issue
        remove_private(ev.folder)
        return ev.result()
    refused = pkb_multicast.emulation_reason(ev.source.decode(errors="replace")) if config.ranks_per_gpu > 1 else None
    if refused:  # multicast the emulation cannot rewrite (docs/emulation.md): nothing of it runs
        ev.failure = Failure(verdict=failures.INFRA_ERROR, message=f"not available in emulation: {refused}",
                             phase="environment", infra_cause="emulation")
        remove_private(ev.folder)
        return ev.result()
    phase, started = "compile", time.perf_counter()
    try:
        if not ev.compile(built):
            return ev.result()
        phase = "launch"
        ev.start_pools()
        seed = ev.seed = integrity.mixed_seed(config.seed, ev.salt)
        schedule = trials.schedule(config.trials, checks, world_size, ev.rng)
        phase = "reference"
        ref_stats = ev.run_reference(schedule, seed)
        phase = "load"
        ev.load()
        phase = "check"
        ev.check(schedule)
        if ref_stats is not None:
            phase = "timing"
            ev.time(ref_stats)
    except _Stop as stop:
        ev.stages.setdefault(phase, time.perf_counter() - started)
        ev.failure = stop.failure
        ev.flags.extend(stop.flags)
    except ReferenceFailed as err:
        ev.failure = Failure(verdict=failures.INFRA_ERROR, message=str(err)[:1500], phase="reference",
                             infra_cause="reference")
    except SandboxUnavailable as err:
        ev.failure = Failure(verdict=failures.INFRA_ERROR, message=str(err)[:1500], phase=phase, infra_cause="sandbox")
    except Exception as exc:  # noqa: BLE001 - every evaluation ends with a verdict
        ev.failure = unexpected_failure(exc, phase)
    except BaseException:  # Ctrl-C, harness.cancel, a Ray task cancelled: no polite wait for busy ranks
        ev.abandoned = True
        raise
    finally:
        if ev.reference is not None and ev.reference.cost:
            # What the reference's first call cost and the limits derived from it (harness.judge.reference).
            ev.evidence["reference_cost"] = dict(ev.reference.cost)
        try:
            ev.cleanup()
        except Exception as exc:  # noqa: BLE001 - a verdict already taken stays; the record says what failed
            ev.evidence["cleanup_error"] = f"{type(exc).__name__}: {exc}"[:500]
        # Stopped by Ctrl-C midway: whatever the killed ranks said is no verdict on the candidate.
        cancel.check()
    if ev.failure is None and ev.timings is not None:
        # After the ranks are gone: the bound traces the reference once (then reads a cache), in clean
        # processes of its own, never beside a candidate.
        try:
            bound = plausibility.usable_bound(roofline.lower_bound_ms(problem, shape, world_size, device))
        except Exception as exc:  # noqa: BLE001 - the reference's trace failed: no bound, said so
            ev.evidence["roofline_bound_error"] = f"{type(exc).__name__}: {exc}"[:500]
            bound = None
        if bound is not None:
            ev.evidence["roofline_bound_ms"] = bound
            if plausibility.beats_the_roofline(ev.timings.candidate.median_ms, bound, checks):
                ev.flags.append(integrity.IMPOSSIBLE)
        cancel.check()  # the bound's trace may have been the wait that Ctrl-C cut short
    return ev.result()


# Phases in which candidate code has run or its artifacts are handled: whatever goes wrong there is the
# candidate's. Before them (launch, reference) nothing of the candidate is involved.
CANDIDATE_PHASES = ("compile", "load", "check", "timing")


def unexpected_failure(exc: BaseException, phase: str) -> Failure:
    """The verdict for an exception nobody anticipated. In a candidate's phase it is the candidate's failure
    with the reason (fail closed: an infra_error would be retried, re-rolling the candidate's verdict); a
    pool that stopped there stopped with the candidate's ranks. Before those phases, the harness's own."""
    reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:600]
    trace = "".join(traceback.format_exception(exc))[-3000:]
    if phase in CANDIDATE_PHASES:
        verdict = failures.COMPILE_ERROR if phase == "compile" else failures.RUNTIME_ERROR
        what = "its rank pool stopped" if isinstance(exc, PoolError) else "the harness could not handle its artifacts"
        return Failure(verdict=verdict, phase=phase, message=f"{phase}: {what}: {reason}", evidence=trace)
    return Failure(verdict=failures.INFRA_ERROR, phase=phase, infra_cause="harness",
                   message=f"{phase}: the harness failed before any candidate code ran: {reason}", evidence=trace)
