"""What a candidate rank does: load the candidate, make one call per request on inputs the request brings,
and hand back what came out. Rank side, inside the sandbox; it decides nothing.

A call's reply carries data only: a copy of the output taken the moment the call returned (written to
the file the request names), whether that output still changed afterwards (and then its later value),
fingerprints of the inputs after the call, whether the previous call's output changed during this one,
and the collectives the monitor saw. Every request looks alike: the rank is never told which trial it is
running, whether the trial is one that counts, or what the answer is.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from harness.common import failures, messages
from harness.rank import prebuilt, refill, transport
from harness.rank.calls import call_with_snapshots, delay, fingerprint, leaves, same_bytes
from harness.rank.candidate import CandidateError, classify_load_error, load_candidate, trimmed_traceback
from harness.rank.timed import TimedSession

if TYPE_CHECKING:
    from harness.rank.worker import Worker


def _fail(verdict: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "verdict": verdict, "message": message[:1500], **extra}


def setup(worker: Worker, req: messages.Setup) -> dict[str, Any]:
    """Before the candidate: make the import path a PKB checkout's solutions expect, and every process
    group the inputs name, in the order given (new_group is collective: every rank makes every group)."""
    spec = req.problem or ""
    if spec.startswith("pkb:"):
        from harness.problems.parallelkernelbench import checkout  # deferred: only a checkout's candidates need it

        root, _ = checkout.parse_spec(spec)
        checkout.ensure_importable(root)
    if spec:
        # Loaded now, before any candidate code: timed calls draw their inputs with its make_inputs, bound
        # here (a candidate that replaces it later draws inputs the judge's expected outputs do not match).
        problem = worker.problem(spec)
        worker.timing_draw = refill.drawer(problem, problem.shape(req.shape), worker.rank, worker.world_size,
                                           worker.device) if req.shape else None
    for ranks in req.groups:
        key = tuple(ranks) if ranks is not None else None
        if key not in worker.groups:
            worker.groups[key] = dist.new_group(list(key)) if key is not None else dist.group.WORLD
    return {"ok": True}


def watch_builds(worker: Worker) -> None:
    """Report every torch extension build (load_inline, load, and helpers built on them, such as PKB's
    compile_cuda_extension) to the harness as it starts and ends: a build that only the first call
    reveals is then limited and timed as a build, not taken for a hang."""
    from torch.utils import cpp_extension

    original = cpp_extension._jit_compile
    if getattr(original, "__pkb_builds__", False):
        return

    def jit_compile(*args: Any, **kwargs: Any) -> Any:
        worker.monitor.report("build_start")
        try:
            return original(*args, **kwargs)
        finally:
            worker.monitor.report("build_end")

    jit_compile.__pkb_builds__ = True  # type: ignore[attr-defined]  # a marker; a function type has no such field
    cpp_extension._jit_compile = jit_compile


def load(worker: Worker, req: messages.LoadCandidate) -> dict[str, Any]:
    watch_builds(worker)
    prebuilt.install()  # the compile stage's split build is complete: the first call builds nothing
    if not worker.candidates and not worker.guard.captured:
        # Everything the worker relies on, as it is before the first line of candidate code runs. (Its module
        # is looked up, not imported: harness.rank.worker imports this one.)
        worker_module = sys.modules[type(worker).__module__]
        problems = [(f"problem {spec}", p.module) for spec, p in worker.problems.items()]
        worker.guard.capture(extra=[("worker", worker_module), ("worker.Worker", worker_module.Worker), *problems])
        worker.baseline_threads = {t.ident for t in threading.enumerate() if t.ident is not None}
    collectives = worker.monitor.state()
    monitored = worker.monitor.watch(lambda: load_candidate(Path(req.candidate), req.params),
                                     lambda: True)
    try:
        worker.candidates[req.candidate] = monitored()
    except CandidateError as err:
        return {"ok": False, "verdict": err.verdict, "message": err.message, "evidence": err.evidence}
    return {"ok": True, "collectives": worker.monitor.since(collectives)}


def _plain(value: Any) -> bool:
    return transport.describe_unsupported(value) is None


def call(worker: Worker, req: messages.Call) -> dict[str, Any]:
    """One call of the candidate on the inputs in req.inputs; its output copy goes to req.output."""
    fn = worker.candidates[req.candidate].solution
    try:
        inputs = transport.load_inputs(Path(req.inputs), worker.device, worker.groups)
    except Exception as exc:  # inputs the harness wrote: a harness or machine failure
        return _fail(failures.INFRA_ERROR, f"rank {worker.rank}: inputs could not be loaded: {exc}")
    worker.candidate_calls += 1
    counted = worker.candidate_calls > 1  # the rank's first call is set-up (rendezvous, groups, builds)
    collectives = worker.monitor.state()
    watched = worker.monitor.watch(fn, lambda: counted)
    delay(req.delay_s, worker.device)
    try:
        live, at_return, later = call_with_snapshots(watched, inputs, worker.device,
                                                     float(req.lazy_delay_s), req.busy_bytes, _plain)
    except Exception as exc:  # its peers may now wait in a collective: the parent's grace ends them
        return {**_fail(failures.RUNTIME_ERROR, f"rank {worker.rank} raised {type(exc).__name__}: {exc}",
                        evidence=trimmed_traceback(exc), build=_is_build_error(exc)),
                "collectives": worker.monitor.since(collectives)}
    reply: dict[str, Any] = {"ok": True, "collectives": worker.monitor.since(collectives), "counted": counted}
    reply["previous_changed"] = _look_back(worker, req.previous_output)
    if at_return is None:
        reply["unsupported"] = transport.describe_unsupported(live)
    else:
        transport.write_tree(Path(req.output), at_return)
        if not same_bytes(at_return, later):
            transport.write_tree(Path(req.output + ".later"), later)
            reply["changed_after_return"] = True
    reply["input_fingerprint"] = fingerprint(inputs)
    if req.return_inputs:
        transport.write_tree(Path(req.return_inputs), [t for t in leaves(inputs) if isinstance(t, torch.Tensor)])
    worker.previous = (live, at_return) if at_return is not None else None
    return reply


def _look_back(worker: Worker, path: str | None) -> bool:
    """Did the previous call's output change during this call? Then its current value goes to `path`:
    the judge tells an output filled in late (lazy) from a buffer reused across calls."""
    if worker.previous is None:
        return False
    old_live, old_copy = worker.previous
    worker.previous = None
    if same_bytes(old_live, old_copy):
        return False
    if path:
        transport.write_tree(Path(path), old_live)
    return True


def _is_build_error(exc: BaseException) -> bool:
    return classify_load_error(exc) == failures.COMPILE_ERROR


def time_begin(worker: Worker, req: messages.CallTimeBegin) -> dict[str, Any]:
    """Timing's input sets on the device: drawn here from the recipes the request brings, where timed calls
    draw their inputs anew (`set_fills`), else loaded from the files the trusted pool wrote."""
    fn = worker.monitor.watch(worker.candidates[req.candidate].solution, lambda: True)
    draw = worker.timing_draw if req.set_fills is not None else None
    try:
        if req.set_fills is not None:
            if draw is None:
                raise RuntimeError("no problem was set up to draw inputs with")
            sets, fresh = [draw(dict(recipe)) for recipe in req.set_fills], []
        else:
            sets = [transport.load_inputs(Path(p), worker.device, worker.groups) for p in req.sets]
            fresh = [transport.load_inputs(Path(p), worker.device, worker.groups) for p in req.fresh]
    except Exception as exc:
        return _fail(failures.INFRA_ERROR, f"rank {worker.rank}: timing inputs could not be loaded: {exc}")
    worker.sync()
    worker.timing = TimedSession(fn, sets, fresh, worker.device, plain=transport.describe_unsupported,
                                 clone=req.clone_inputs, draw=draw)
    return {"ok": True, "input_sets": len(sets), "modules": len(sys.modules)}
