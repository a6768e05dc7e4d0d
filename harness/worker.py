"""The per-rank worker: the process that runs references and untrusted candidates.

One process per rank, started by harness.pool. It joins the process group, then answers requests read
from a private pipe until told to exit. It imports torch, the standard library, the problem module
and the candidate, nothing else (the GPU machine has no pydantic). Keep it small enough to audit.

Integrity (harness.integrity): the collective monitor is installed and the guard captured before any
candidate code runs; after a "seal" request replies are signed JSON. Every rank runs the same list of
calls whatever its results, so a failure on one rank never leaves the others blocked in a collective;
the first failure is reported at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness import channel, failures, integrity, timing
from harness.candidate import CandidateError, load_candidate, trimmed_traceback
from harness.compare import compare_outputs, count_mismatches, same_values, structure_issue
from harness.integrity import IntegrityConfig, Trial, output_issue, poison_, snapshot
from harness.problem import Problem, load_problem_spec
from harness.seeds import rank_seed


def clone_tree(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return tuple(clone_tree(v) for v in value)
    if isinstance(value, list):
        return [clone_tree(v) for v in value]
    return value


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _fail(verdict: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "verdict": verdict, "message": message[:1500], **extra}


class Worker:
    def __init__(self, rank: int, world_size: int, device: str, workdir: Path | None = None,
                 monitor: integrity.CollectiveMonitor | None = None, guard: integrity.Guard | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(f"cuda:{rank % max(torch.cuda.device_count(), 1)}" if device == "cuda" else "cpu")
        self.workdir = workdir  # the pool's private folder: audit outputs travel through it
        self.monitor = monitor or integrity.CollectiveMonitor()
        self.guard = guard or integrity.Guard()
        self.problems: dict[str, Problem] = {}
        self.candidates: dict[str, Any] = {}
        self.candidate_calls = 0
        self.audit_inputs: dict[str, tuple] = {}
        self.baseline_threads: set[int] = set()

    # -- setup ----------------------------------------------------------------------------------
    def init_process_group(self, init_file: str) -> None:
        kwargs: dict[str, Any] = {}
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            kwargs["device_id"] = self.device  # eager NCCL communicator: no lazy init inside a timed call
        else:
            torch.set_num_threads(1)  # W ranks share few cores; oversubscription only adds noise
        dist.init_process_group(
            "nccl" if self.device.type == "cuda" else "gloo",
            init_method=f"file://{init_file}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(minutes=30),  # the parent's watchdog, not gloo/NCCL, decides what a hang is
            **kwargs,
        )

    def problem(self, path: str) -> Problem:
        if path not in self.problems:
            self.problems[path] = load_problem_spec(path)
        return self.problems[path]

    def generator(self, seed: int, trial: int, rank: int) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(rank_seed(seed, trial, rank))
        return gen

    def inputs(self, problem: Problem, shape: dict, seed: int, trial: int, rank: int | None = None,
               device: torch.device | None = None) -> tuple:
        rank = self.rank if rank is None else rank
        device = device or self.device
        gen = torch.Generator(device=device)
        gen.manual_seed(rank_seed(seed, trial, rank))
        return tuple(problem.make_inputs(shape, rank, self.world_size, gen, device))

    def probe_inputs(self, problem: Problem, shape: dict, seed: int, rank: int | None = None) -> tuple:
        """The precision probe's inputs of `rank`: its ordinary draw with the main tensors replaced."""
        rank = self.rank if rank is None else rank
        base = self.inputs(problem, shape, seed, integrity.PROBE_TRIAL, rank)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(rank_seed(seed, integrity.PROBE_TRIAL, rank) + (1 << 14))
        return integrity.precision_probe_inputs(base, problem.dtype, gen)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def call_candidate(self, fn: Any) -> Any:
        """`fn` with its torch.distributed traffic counted, except on the rank's very first call."""
        def counted() -> bool:
            self.candidate_calls += 1
            return self.candidate_calls > 1

        return self.monitor.watch(fn, counted)

    # -- requests -------------------------------------------------------------------------------
    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op == "ping":
            return {"ok": True}
        if op == "validate":
            return self.validate(req)
        if op == "load_candidate":
            return self.load_candidate(req)
        if op == "check":
            return self.check(req)
        if op == "audit_prepare":
            return self.audit_prepare(req)
        if op == "audit_run":
            return self.audit_run(req)
        if op == "time":
            return self.time(req)
        if op == "trace":  # the reference's collectives and FLOPs, for the roofline
            from harness import tracing

            return tracing.trace_in_worker(self, req)
        if op == "profile":  # per-rank kernel timeline of reference or candidate
            from harness import profiling

            return profiling.profile_in_worker(self, req)
        raise ValueError(f"unknown op {op!r}")

    def validate(self, req: dict[str, Any]) -> dict[str, Any]:
        """The distributed reference against the single-process oracle, over several trials. Every trial
        runs on every rank even after a failure, so the ranks' collectives stay matched."""
        problem = self.problem(req["problem"])
        shape = problem.shape(req["shape"])
        worst = 0.0
        failure: dict[str, Any] | None = None
        for trial in range(req["trials"]):
            mine = self.inputs(problem, shape, req["seed"], trial)
            out = problem.solution(*clone_tree(mine))
            self.sync()
            # Every rank's inputs, drawn on this device (a CUDA generator's stream differs from the CPU's),
            # then handed to the oracle on the CPU.
            everyone = [_to_cpu(self.inputs(problem, shape, req["seed"], trial, r)) for r in range(self.world_size)]
            expected = problem.oracle(shape, self.world_size, everyone)
            if failure is not None:
                continue
            if len(expected) != self.world_size:
                failure = _fail(failures.INFRA_ERROR, f"oracle returned {len(expected)} outputs for "
                                                      f"{self.world_size} ranks")
                continue
            result = compare_outputs(expected[self.rank], _to_cpu(out), problem.atol, problem.rtol)
            if not result["ok"]:
                failure = _fail(result["verdict"], f"reference disagrees with oracle on rank {self.rank}, "
                                                   f"trial {trial}: {result['message']}", trial=trial)
            elif not same_values(mine, self.inputs(problem, shape, req["seed"], trial)):
                failure = _fail(failures.OUTPUT_MISMATCH, "make_inputs is not reproducible from the seed",
                                trial=trial)
            else:
                worst = max(worst, result.get("max_abs_err", 0.0))
        return failure or {"ok": True, "max_abs_err": worst}

    def load_candidate(self, req: dict[str, Any]) -> dict[str, Any]:
        problem = self.problem(req["problem"])
        if not self.candidates and not self.guard.captured:
            # Everything the worker relies on, as it is before the first line of candidate code runs.
            self.guard.capture(extra=[("worker", sys.modules[__name__]), ("worker.Worker", Worker)])
            self.baseline_threads = {t.ident for t in threading.enumerate() if t.ident is not None}
        try:
            self.candidates[req["candidate"]] = load_candidate(Path(req["candidate"]), problem.solution)
        except CandidateError as err:
            return {"ok": False, "verdict": err.verdict, "message": err.message, "evidence": err.evidence}
        return {"ok": True}

    def check(self, req: dict[str, Any]) -> dict[str, Any]:
        """Candidate vs reference on fresh inputs per trial, then stress trials (one rank late) and the
        precision probe. The candidate runs first, on its own copy; its output is copied on the caller's
        stream the moment it returns; the reference's outputs are poisoned before they are freed."""
        problem = self.problem(req["problem"])
        call = self.call_candidate(self.candidates[req["candidate"]].solution)
        shape = problem.shape(req["shape"])
        config = IntegrityConfig.from_dict(req.get("integrity"))
        seed = integrity.mixed_seed(req["seed"], req.get("salt", 0))
        monitored = self.monitor.state()
        run = _CheckRun(self, problem, config)
        for trial in integrity.check_schedule(req["trials"], config, self.world_size):
            if trial.kind == "probe":
                pristine = self.probe_inputs(problem, shape, seed)
            else:
                pristine = self.inputs(problem, shape, seed, trial.index)
            theirs = clone_tree(pristine)
            if trial.kind == "stress":
                integrity.skew(self.rank, trial, config, self.device, seed)
            try:
                live = call(*theirs)
                at_return = snapshot(live) if output_issue(live) is None else None
                self.sync()
            except Exception as exc:  # its peers may now wait in a collective: the parent's grace ends it
                return {**run.summary(monitored), **_fail(
                    failures.RUNTIME_ERROR, f"rank {self.rank} raised {type(exc).__name__} in trial {trial.index}: "
                                            f"{exc}", trial=trial.index, evidence=trimmed_traceback(exc))}
            expected = problem.solution(*clone_tree(pristine))
            self.sync()
            run.judge(trial, pristine, theirs, live, at_return, expected,
                      lambda expected=expected: self._probe_validity(problem, shape, seed, expected))
        run.finish()
        return {**run.summary(monitored), **(run.failure or {"ok": True})}

    def _probe_validity(self, problem: Problem, shape: dict, seed: int, expected: Any) -> str | None:
        """None when the reference is itself exact enough on the probe inputs (it matches the oracle
        within half the tolerance), else why the probe cannot judge this problem."""
        if problem.oracle is None:
            return "the problem has no oracle"
        everyone = [_to_cpu(self.probe_inputs(problem, shape, seed, r)) for r in range(self.world_size)]
        try:
            oracle = problem.oracle(shape, self.world_size, everyone)[self.rank]
        except Exception as exc:
            return f"the oracle failed on probe inputs: {type(exc).__name__}: {exc}"[:300]
        result = compare_outputs(oracle, _to_cpu(expected), problem.atol / 2, problem.rtol / 2)
        return None if result["ok"] else f"the reference is not exact on probe inputs: {result['message']}"[:300]

    # -- the audit: inputs drawn before the candidate exists, judged by the parent ------------------
    def audit_prepare(self, req: dict[str, Any]) -> dict[str, Any]:
        """Before any candidate is loaded: draw the audit inputs from a salt the candidate never sees,
        keep them, and hand the reference's outputs to the parent through the pool's folder."""
        if self.candidates:
            return _fail(failures.INFRA_ERROR, "audit_prepare after a candidate was loaded")
        problem = self.problem(req["problem"])
        shape = problem.shape(req["shape"])
        seed = integrity.mixed_seed(req["seed"], req["salt"])
        inputs = self.inputs(problem, shape, seed, integrity.AUDIT_TRIAL)
        expected = problem.solution(*clone_tree(inputs))
        self.sync()
        description = channel.write_tree(self._audit_file("expected"), expected)
        poison_(expected)
        self.audit_inputs[req["key"]] = inputs
        return {"ok": True, "expected": description}

    def audit_run(self, req: dict[str, Any]) -> dict[str, Any]:
        """One candidate call on the kept audit inputs; its raw outputs go to the parent."""
        inputs = self.audit_inputs.pop(req["key"])
        call = self.call_candidate(self.candidates[req["candidate"]].solution)
        monitored = self.monitor.state()
        try:
            live = call(*clone_tree(inputs))
            at_return = snapshot(live) if output_issue(live) is None else None
            self.sync()
        except Exception as exc:
            return _fail(failures.RUNTIME_ERROR, f"rank {self.rank} raised {type(exc).__name__} in the audit "
                                                 f"trial: {exc}", evidence=trimmed_traceback(exc))
        if at_return is None:
            return _fail(failures.OUTPUT_MISMATCH, f"rank {self.rank}, audit trial: {output_issue(live)}",
                         flags=[integrity.LAZY_OUTPUT])
        if not same_values(at_return, live):
            flag = integrity.UNSYNCHRONIZED_WORK if self.device.type == "cuda" else integrity.LAZY_OUTPUT
            return _fail(failures.OUTPUT_MISMATCH, f"rank {self.rank}, audit trial: the output changed after the "
                                                   f"call returned (work left running)", flags=[flag])
        description = channel.write_tree(self._audit_file("output"), at_return)
        return {"ok": True, "output": description, "collectives": self.monitor.since(monitored)}

    def _audit_file(self, what: str) -> Path:
        folder = self.workdir or Path("/tmp")
        return folder / f"audit-{what}-rank{self.rank}.bin"

    # -- timing ---------------------------------------------------------------------------------
    def time(self, req: dict[str, Any]) -> dict[str, Any]:
        problem = self.problem(req["problem"])
        shape = problem.shape(req["shape"])
        config = IntegrityConfig.from_dict(req.get("integrity"))
        seed = integrity.mixed_seed(req["seed"], req.get("salt", 0))

        def make_set(i: int) -> tuple:
            return self.inputs(problem, shape, seed, req["trial_base"] + i)

        timing_config = dict(req["config"])
        if req["candidate"] is None:
            # The reference: same loop (and same call wrapper), its outputs poisoned as they are freed.
            call = self.monitor.watch(problem.solution, lambda: False)
            try:
                result = timing.time_function(call, make_set, self.device, {**timing_config, "fresh_iters": 0},
                                              on_output=lambda loop, index, out: poison_(out))
            except Exception as exc:
                return _fail(failures.INFRA_ERROR, f"rank {self.rank}: the reference raised "
                                                   f"{type(exc).__name__} while timed: {exc}",
                             evidence=trimmed_traceback(exc))
            return {"ok": True, **result}

        call = self.call_candidate(self.candidates[req["candidate"]].solution)
        monitored = self.monitor.state()
        checker = _TimedOutputs(problem, self.sync)
        try:
            result = timing.time_function(call, make_set, self.device,
                                          {**timing_config, "fresh_iters": config.fresh_iters},
                                          prepare=checker.prepare, on_output=checker.check)
            mutated, wrong = checker.finish()
            # Most specific first: changed inputs explain wrong outputs; work left running explains a
            # timed output read too early.
            probe = self._completion_probes(problem, call, make_set, req, config)
            left_running = probe is not None and bool(
                set(probe.get("flags", [])) & {integrity.UNSYNCHRONIZED_WORK, integrity.LAZY_OUTPUT})
            failure = mutated or (probe if left_running else None) or wrong or probe
        except Exception as exc:
            return {**_fail(failures.RUNTIME_ERROR, f"rank {self.rank} raised {type(exc).__name__} while "
                                                    f"timed: {exc}", evidence=trimmed_traceback(exc)),
                    "collectives": self.monitor.since(monitored)}
        extra = {"collectives": self.monitor.since(monitored)}
        if failure is not None:
            return {**failure, **extra}
        return {"ok": True, **result, **extra}

    def _completion_probes(self, problem: Problem, call: Any, make_set: Any, req: dict[str, Any],
                           config: IntegrityConfig) -> dict[str, Any] | None:
        """Untimed calls after timing, on never-seen inputs, each output copied on the caller's stream
        at return (GPU: with other streams held back) and compared with itself later and with the
        reference: work left on a side stream or finished after return shows here. Every rank makes
        every call (they hold collectives); the first failure is returned."""
        first: dict[str, Any] | None = None
        for j in range(config.completion_probes):
            inputs = make_set(integrity.COMPLETION_TRIAL_OFFSET + j)
            expected = problem.solution(*clone_tree(inputs))
            self.sync()
            timing._device_barrier(self.device, torch.zeros(1, device=self.device))
            live, at_return, later = integrity.call_with_snapshots(call, inputs, self.device, config)
            if first is None:
                first = self._judge_probe(problem, live, at_return, later, expected)
            poison_(expected)
        return first

    def _judge_probe(self, problem: Problem, live: Any, at_return: Any, later: Any,
                     expected: Any) -> dict[str, Any] | None:
        if at_return is None:
            return _fail(failures.OUTPUT_MISMATCH, f"rank {self.rank}, after timing: {output_issue(live)}",
                         flags=[integrity.LAZY_OUTPUT])
        if not same_values(at_return, later):
            flag = integrity.UNSYNCHRONIZED_WORK if self.device.type == "cuda" else integrity.LAZY_OUTPUT
            right_later = compare_outputs(expected, later, problem.atol, problem.rtol)["ok"]
            return _fail(failures.OUTPUT_MISMATCH,
                         f"rank {self.rank}: the output was still being written after the call returned (it "
                         f"differs between a copy on the caller's stream at return and one after all device "
                         f"work{'; only the later copy is right' if right_later else ''})", flags=[flag])
        result = compare_outputs(expected, at_return, problem.atol, problem.rtol)
        if not result["ok"]:
            return _fail(result["verdict"], f"rank {self.rank}, untimed call after timing: {result['message']}",
                         flags=[integrity.TIMED_OUTPUT_WRONG])
        return None

    # -- integrity of the process itself ----------------------------------------------------------
    def thread_flags(self) -> list[str]:
        if not self.candidates:
            return []
        alive = {t.ident for t in threading.enumerate() if t.ident is not None}
        return [integrity.SPAWNED_THREADS] if alive - self.baseline_threads else []


class _CheckRun:
    """The verdict of one check request, trial by trial: the first failure counts, flags accumulate."""

    def __init__(self, worker: Worker, problem: Problem, config: IntegrityConfig) -> None:
        self.worker = worker
        self.problem = problem
        self.config = config
        self.failure: dict[str, Any] | None = None
        self.flags: set[str] = set()
        self.notes: dict[str, str] = {}
        self.worst_abs = self.worst_rel = 0.0
        # The previous call: its live output, the copy taken at return, its expected output, its verdict.
        self.previous: tuple[Any, Any, Any, bool] | None = None

    def fail(self, trial: Trial, reply: dict[str, Any], *flags: str) -> None:
        self.flags.update(flags)
        if self.failure is None:
            self.failure = {**reply, "trial": trial.index, "trial_kind": trial.kind}

    def judge(self, trial: Trial, pristine: tuple, theirs: tuple, live: Any, at_return: Any, expected: Any,
              probe_validity: Any) -> None:
        """`probe_validity()` says why the precision probe cannot judge this problem (None: it can). It
        runs the oracle on every rank's probe inputs, so it is only asked when the probe fails."""
        rank, tol = self.worker.rank, (self.problem.atol, self.problem.rtol)
        where = f"rank {rank}, trial {trial.index}" + ("" if trial.kind == "normal" else f" ({trial.kind})")
        self._look_back(live)
        failed = True
        if at_return is None:
            self.fail(trial, _fail(failures.OUTPUT_MISMATCH, f"{where}: {output_issue(live)}"), integrity.LAZY_OUTPUT)
        elif not same_values(at_return, live):
            flag = integrity.UNSYNCHRONIZED_WORK if self.worker.device.type == "cuda" else integrity.LAZY_OUTPUT
            self.fail(trial, _fail(failures.OUTPUT_MISMATCH, f"{where}: the output changed after the call "
                                                             f"returned (work left running)"), flag)
        elif not same_values(theirs, pristine):
            self.fail(trial, _fail(failures.OUTPUT_MISMATCH, f"rank {rank} modified its inputs in trial "
                                                             f"{trial.index}"), integrity.MUTATES_INPUTS)
        else:
            result = compare_outputs(expected, at_return, *tol)
            if result["ok"]:
                failed = False
                self.worst_abs = max(self.worst_abs, result.get("max_abs_err", 0.0))
                self.worst_rel = max(self.worst_rel, result.get("max_rel_err", 0.0))
            elif self.failure is not None:
                pass  # only the first failure is reported and diagnosed; later ones follow from it
            elif trial.kind == "probe" and (note := probe_validity()) is not None:
                failed = False  # the probe cannot judge this problem
                self.notes["precision_probe"] = f"skipped: {note}"
            else:
                flags = self._diagnose(trial, live, expected, result)
                self.fail(trial, _fail(result["verdict"], f"{where}: {result['message']}",
                                       max_abs_err=result.get("max_abs_err"),
                                       max_rel_err=result.get("max_rel_err")), *flags)
        if self.previous is not None:
            poison_(self.previous[2])
        self.previous = (live, at_return, expected, failed)

    def _diagnose(self, trial: Trial, live: Any, expected: Any, result: dict[str, Any]) -> list[str]:
        """Name the likely hack behind a wrong answer."""
        tol = (self.problem.atol, self.problem.rtol)
        flags = []
        if trial.kind == "stress":
            flags.append(integrity.RACE)
        if trial.kind == "probe":
            flags.append(integrity.REDUCED_PRECISION)
        if self.previous is not None and compare_outputs(self.previous[2], snapshot(live), *tol)["ok"]:
            flags.append(integrity.STALE_OUTPUT)
            result["message"] += " (the output equals the previous call's answer: stale result)"
        time.sleep(self.config.lazy_delay_s)
        self.worker.sync()
        if output_issue(live) is None and compare_outputs(expected, snapshot(live), *tol)["ok"]:
            flags.append(integrity.LAZY_OUTPUT)
            result["message"] += f" (the output became right {self.config.lazy_delay_s:g} s after the call returned)"
        return flags

    def _look_back(self, live: Any) -> None:
        """After a new call: did the previous call's output change? Then it was filled late (lazy) or its
        buffer is reused across calls (informational)."""
        if self.previous is None or self.previous[1] is None:
            return
        old_live, old_copy, old_expected, old_failed = self.previous
        if old_live is live or same_values(old_live, old_copy):
            return
        tol = (self.problem.atol, self.problem.rtol)
        if old_failed and compare_outputs(old_expected, snapshot(old_live), *tol)["ok"]:
            self.flags.add(integrity.LAZY_OUTPUT)
            if self.failure is not None:
                self.failure["message"] += " (that output was filled in during the next call)"
        else:
            self.flags.add(integrity.OUTPUT_REUSED)

    def finish(self) -> None:
        """After the last call: does its output still change on its own?"""
        if self.previous is None:
            return
        live, at_return, expected, failed = self.previous
        if at_return is not None and not failed:
            time.sleep(self.config.lazy_delay_s)
            self.worker.sync()
            if not same_values(at_return, live):
                self.flags.add(integrity.LAZY_OUTPUT)
                if self.failure is None:
                    self.failure = _fail(failures.OUTPUT_MISMATCH, f"rank {self.worker.rank}: the last "
                                                                   f"output changed after the call returned")
        poison_(expected)
        self.previous = None

    def summary(self, monitored: Any) -> dict[str, Any]:
        return {"flags": sorted(self.flags), "notes": self.notes, "max_abs_err": self.worst_abs,
                "max_rel_err": self.worst_rel, "collectives": self.worker.monitor.since(monitored)}


class _TimedOutputs:
    """Every timed call's output checked against the reference for its input set (on the device, no
    synchronization in the loop), and every input set checked unchanged after timing."""

    def __init__(self, problem: Problem, sync: Any) -> None:
        self.problem = problem
        self.sync = sync
        self.expected: dict[tuple[str, int], Any] = {}
        self.prints: list[tuple[tuple, Any]] = []
        self.counts: list[tuple[str, int, torch.Tensor]] = []
        self.structure: str | None = None

    def prepare(self, sets: list[tuple], fresh: list[tuple]) -> None:
        for kind, group in (("rotated", sets), ("fresh", fresh)):
            for i, inputs in enumerate(group):
                self.expected[(kind, i)] = self.problem.solution(*clone_tree(inputs))
                self.prints.append((inputs, integrity.fingerprint(inputs)))
        self.sync()

    def check(self, loop: str, index: int, out: Any) -> None:
        expected = self.expected[("fresh" if loop == "fresh" else "rotated", index)]
        issue = output_issue(out) or structure_issue(expected, out)
        if issue is not None:
            self.structure = self.structure or f"{loop} call on input set {index}: {issue}"
            return
        self.counts.append((loop, index, count_mismatches(expected, out, self.problem.atol, self.problem.rtol)))

    def finish(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """(a failure if an input set changed, a failure if a timed output was wrong); poisons the
        expected outputs."""
        self.sync()
        try:
            mutated = wrong = None
            for inputs, before in self.prints:
                if not integrity.same_fingerprint(before, integrity.fingerprint(inputs)):
                    mutated = _fail(failures.OUTPUT_MISMATCH, "an input set changed while it was timed: the "
                                                              "candidate modifies its inputs",
                                    flags=[integrity.MUTATES_INPUTS])
                    break
            if self.structure is not None:
                wrong = _fail(failures.OUTPUT_MISMATCH, f"a timed call's output is not comparable: {self.structure}",
                              flags=[integrity.TIMED_OUTPUT_WRONG])
            elif self.counts:
                bad = torch.stack([c.to("cpu") for _, _, c in self.counts]).tolist()
                found = [(loop, index, n) for (loop, index, _), n in zip(self.counts, bad) if n > 0]
                if found:
                    loop, index, n = found[0]
                    wrong = _fail(failures.OUTPUT_MISMATCH,
                                  f"{len(found)} of {len(bad)} timed calls gave wrong outputs although the check "
                                  f"passed; first: a {loop} call on input set {index}, {n} elements outside "
                                  f"tolerance", flags=[integrity.TIMED_OUTPUT_WRONG])
            return mutated, wrong
        finally:
            for expected in self.expected.values():
                poison_(expected)
            self.expected.clear()


def serve(worker: Worker, requests: Connection, replies: Connection) -> None:
    sealer: channel.ReplySealer | None = None
    # Held by this frame from the start: replacing Worker or Guard attributes later changes nothing here,
    # and a candidate that rewrites the check's code object is caught by the identity test below.
    guard, violations = worker.guard, integrity.Guard.violations
    violations_code = violations.__code__
    while True:
        req = requests.recv()
        op = req.get("op")
        if op == "exit":
            break
        started = time.perf_counter()
        if op == "seal" and sealer is None and not worker.candidates:
            sealer = channel.ReplySealer(req.pop("key"))
            reply: dict[str, Any] = {"ok": True}
        else:
            try:
                reply = worker.handle(req)
            except Exception as exc:  # a bug in a problem or the harness: not the candidate's fault
                reply = _fail(failures.INFRA_ERROR, f"rank {worker.rank}: {type(exc).__name__}: {exc}",
                              evidence=trimmed_traceback(exc))
        if worker.candidates and guard.captured and (req.get("integrity") or {}).get("guard", True):
            rewritten = violations.__code__ is not violations_code
            changed = ["the integrity check itself"] if rewritten else violations(guard)
            if changed:
                reply = _fail(failures.RUNTIME_ERROR, f"rank {worker.rank}: the candidate replaced what the harness "
                                                      f"relies on: {', '.join(changed[:12])}",
                              flags=[integrity.TAMPERING])
            reply["flags"] = sorted(set(reply.get("flags", [])) | set(worker.thread_flags()))
        reply["rank"] = worker.rank
        reply["seconds"] = time.perf_counter() - started
        if sealer is not None:
            nonce = str(req.get("nonce", ""))
            try:
                sealed = sealer.seal(reply, nonce)
            except (TypeError, ValueError) as exc:  # an op whose reply is not JSON: the harness's bug
                sealed = sealer.seal({**_fail(failures.INFRA_ERROR, f"rank {worker.rank}: reply to {op!r} is "
                                                                    f"not JSON: {exc}"), "rank": worker.rank}, nonce)
            replies.send_bytes(sealed)
        else:
            replies.send(reply)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="pkb-agent rank worker (started by harness.pool)")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--init-file", required=True)
    parser.add_argument("--request-fd", type=int, required=True)
    parser.add_argument("--reply-fd", type=int, required=True)
    args = parser.parse_args(argv)
    requests = Connection(args.request_fd, readable=True, writable=False)
    replies = Connection(args.reply_fd, readable=False, writable=True)
    monitor = integrity.CollectiveMonitor()
    monitor.install()  # before the problem or any candidate binds torch.distributed's functions
    worker = Worker(args.rank, args.world_size, args.device, Path(args.init_file).parent, monitor)
    started = time.perf_counter()
    try:
        worker.init_process_group(args.init_file)
    except Exception as exc:
        replies.send({"ok": False, "rank": args.rank, "verdict": failures.INFRA_ERROR,
                      "message": f"process group init failed: {exc}", "evidence": trimmed_traceback(exc)})
        return
    replies.send({"ok": True, "rank": args.rank, "op": "ready", "seconds": time.perf_counter() - started,
                  "pid": os.getpid()})
    serve(worker, requests, replies)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter and process-group teardown: it can block on peers and proves nothing here.
    os._exit(0)


if __name__ == "__main__":
    main()
