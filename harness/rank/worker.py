"""The per-rank worker process. Rank side: torch, the standard library, harness.rank, the problem module
and (role "candidate") the candidate. It decides nothing: it answers requests with data.

Started by harness.rank.launcher (inside the sandbox for role "candidate"), one process per rank. It
joins the process group, then answers requests read from a private pipe until told to exit. After the
"seal" request, replies are signed JSON (harness.common.channel).

Two roles, two sets of requests:
- "trusted" (a pool that never loads candidate code): draws inputs from seeds, runs the reference,
  writes inputs and expected outputs as files for the judge (harness.rank.reference_side), times the
  reference; also validation, tracing and profiling of references.
- "candidate": takes inputs as files, one call at a time, and hands back what the candidate returned
  (harness.rank.candidate_side); times it with the same per-iteration protocol (harness.rank.timed).
  It never sees a seed, an expected output or the trial schedule.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from harness.common import channel, failures, messages
from harness.common.flags import SPAWNED_THREADS
from harness.common.seeds import rank_seed
from harness.emulation import collectives
from harness.problems.problem import Problem
from harness.problems.registry import load_problem_spec
from harness.rank import candidate_side, reference_side
from harness.rank.candidate import trimmed_traceback
from harness.rank.refill import Draw
from harness.rank.timed import TimedSession
from harness.rank.tripwires import CollectiveMonitor, Guard, active_modes

ROLES = ("trusted", "candidate")


def _fail(verdict: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "verdict": verdict, "message": message[:1500], **extra}


class Worker:
    def __init__(self, rank: int, world_size: int, device: str, role: str = "trusted",
                 monitor: CollectiveMonitor | None = None, guard: Guard | None = None,
                 device_index: int | None = None, emulate: bool = False) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        self.rank = rank
        self.world_size = world_size
        self.role = role
        # The pool says which visible GPU each rank uses (ranks may share one); else rank r uses cuda:r.
        index = device_index if device_index is not None else rank % max(torch.cuda.device_count(), 1)
        self.device = torch.device(f"cuda:{index}" if device == "cuda" else "cpu")
        self.emulate = emulate
        self.monitor = monitor or CollectiveMonitor()
        self.guard = guard or Guard()
        self.problems: dict[str, Problem] = {}
        self.candidates: dict[str, Any] = {}
        self.candidate_calls = 0
        self.groups: dict[tuple[int, ...] | None, Any] = {}
        self.timing: TimedSession | None = None
        # trusted: the sets ref_sets drew
        self.timing_sets: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]] | None = None
        self.timing_draw: Draw | None = None  # how timed calls draw their inputs (None: they use the sets)
        self.previous: tuple[Any, Any] | None = None  # candidate: last call's live output and its copy
        self.baseline_threads: set[int] = set()

    # -- setup ----------------------------------------------------------------------------------
    def init_process_group(self, init_file: str) -> None:
        kwargs: dict[str, Any] = {}
        # CPU runs and ranks that share GPUs (NCCL refuses two ranks on one GPU) join the host collectives:
        # NCCL's operations and shapes, which gloo lacks in part (harness.emulation.collectives).
        backend = collectives.register()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            if not self.emulate and torch.cuda.device_count() >= self.world_size:
                backend = "nccl"
                kwargs["device_id"] = self.device  # eager NCCL communicator: no lazy init inside a timed call
        else:
            torch.set_num_threads(1)  # W ranks share few cores; oversubscription only adds noise
        dist.init_process_group(
            backend,
            init_method=f"file://{init_file}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(minutes=30),  # the parent's watchdog, not gloo/NCCL, decides what a hang is
            **kwargs,
        )
        self.groups[None] = dist.group.WORLD

    def problem(self, spec: str) -> Problem:
        if spec not in self.problems:
            self.problems[spec] = load_problem_spec(spec)
        return self.problems[spec]

    def inputs(self, problem: Problem, shape: dict[str, Any], seed: int, trial: int, rank: int | None = None,
               device: torch.device | None = None) -> tuple[Any, ...]:
        rank = self.rank if rank is None else rank
        device = device or self.device
        gen = torch.Generator(device=device)
        gen.manual_seed(rank_seed(seed, trial, rank))
        return tuple(problem.make_inputs(shape, rank, self.world_size, gen, device))

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- requests -------------------------------------------------------------------------------
    def handle(self, message: messages.Request) -> dict[str, Any]:
        """Answer one typed request (harness.common.messages) by the handler its role's table names."""
        handler = HANDLERS[self.role].get(message.op)
        if handler is None:
            return _fail(failures.INFRA_ERROR, f"op {message.op!r} is not served by a {self.role} rank")
        try:
            return handler(self, message)
        except _OutOfOrder as err:
            return _fail(failures.INFRA_ERROR, str(err))

    def thread_flags(self) -> list[str]:
        if not self.candidates:
            return []
        alive = {t.ident for t in threading.enumerate() if t.ident is not None}
        return [SPAWNED_THREADS] if alive - self.baseline_threads else []


# -- the requests each role serves, and who answers them ----------------------------------------------
def _ping(worker: Worker, message: messages.Ping) -> dict[str, Any]:
    return {"ok": True}


def _timing(worker: Worker, op: str) -> TimedSession:
    if worker.timing is None:
        raise _OutOfOrder(f"{op} before time_begin")
    return worker.timing


class _OutOfOrder(Exception):
    """A timing request without its time_begin: the harness's own mistake."""


def _time_prepare(worker: Worker, message: messages.TimePrepare) -> dict[str, Any]:
    return _timing(worker, message.op).prepare(message)


def _time_call(worker: Worker, message: messages.TimeCall) -> dict[str, Any]:
    return _timing(worker, message.op).call(message)


def _time_end(worker: Worker, message: messages.TimeEnd) -> dict[str, Any]:
    reply, worker.timing = _timing(worker, message.op).finish(message), None
    return reply


def _trace(worker: Worker, message: messages.Trace) -> dict[str, Any]:
    """The reference's collectives and FLOPs, for the roofline."""
    from harness.rank import tracing  # deferred: only a trusted pool that traces loads it

    return tracing.trace_in_worker(worker, message)


def _profile(worker: Worker, message: messages.Profile) -> dict[str, Any]:
    """A per-rank kernel timeline of the reference or the candidate."""
    from harness.rank import timeline  # deferred: only a pool that profiles loads it

    return timeline.profile_in_worker(worker, message)


# Each handler takes the request class harness.common.messages.REQUESTS names for its op and role.
Handler = Callable[[Worker, Any], dict[str, Any]]
_TIMING: dict[str, Handler] = {"time_prepare": _time_prepare, "time_call": _time_call, "time_end": _time_end}
HANDLERS: dict[str, dict[str, Handler]] = {
    "trusted": {"ping": _ping, "validate": reference_side.validate, "trace": _trace, "profile": _profile,
                "ref_trials": reference_side.trials, "ref_sets": reference_side.timing_sets,
                "time_begin": reference_side.time_begin, **_TIMING},
    "candidate": {"ping": _ping, "setup": candidate_side.setup, "load_candidate": candidate_side.load,
                  "call": candidate_side.call, "time_begin": candidate_side.time_begin, "profile": _profile,
                  **_TIMING},
}


def serve(worker: Worker, requests: Connection, replies: Connection) -> None:
    from harness.common.flags import TAMPERING  # a local of this frame, bound before any candidate code runs

    sealer: channel.ReplySealer | None = None
    # Held by this frame from the start: replacing Worker or Guard attributes later changes nothing here,
    # and a candidate that rewrites the check's code object is caught by the identity test below. A
    # determined candidate defeats all of it: the guard is a tripwire, the judge decides.
    guard, violations, modes_active = worker.guard, Guard.violations, active_modes
    violations_code = violations.__code__
    while True:
        try:
            message, nonce = messages.parse_request(requests.recv(), worker.role)
        except messages.ProtocolError as err:  # the judge sent it: the harness's own bug
            message, nonce = None, ""
            reply: dict[str, Any] = _fail(failures.INFRA_ERROR, f"rank {worker.rank}: bad request: {err}")
        if isinstance(message, messages.Exit):
            break
        op = message.op if message is not None else "?"
        started = time.perf_counter()
        if message is None:
            pass
        elif isinstance(message, messages.Seal):
            if sealer is None and not worker.candidates:
                sealer = channel.ReplySealer(message.key)
                reply = {"ok": True}
            else:
                reply = _fail(failures.INFRA_ERROR, f"rank {worker.rank}: the channel is sealed already")
            message = None  # the key lives on in the sealer's MAC only
        else:
            try:
                reply = worker.handle(message)
            except Exception as exc:
                # On a trusted rank: a bug in a problem or the harness. On a candidate rank the judge
                # decides what it was (a failure inside a call is reported by the call itself).
                reply = _fail(failures.INFRA_ERROR if worker.role == "trusted" else failures.RUNTIME_ERROR,
                              f"rank {worker.rank}: {type(exc).__name__}: {exc}", evidence=trimmed_traceback(exc))
        if guard.captured:
            rewritten = violations.__code__ is not violations_code
            changed = ["the integrity check itself"] if rewritten else violations(guard)
            modes = modes_active()
            threads = worker.thread_flags()
        if guard.captured and worker.candidates:
            # (A trusted rank captures the guard for the reference's timing and runs the same checks, so both
            # sides of a timing comparison pay the same per-request work; only a candidate's rank is judged
            # by them.)
            if changed:
                reply = _fail(failures.RUNTIME_ERROR, f"rank {worker.rank}: the candidate replaced what the harness "
                                                      f"relies on: {', '.join(changed[:12])}", flags=[TAMPERING])
            if modes:  # a mode left active: it gains nothing in the harness's reads (pristine), but is named
                reply["tripwire"] = modes[:8]
            reply["flags"] = sorted(set(reply.get("flags", [])) | set(threads) | ({TAMPERING} if modes else set()))
        reply["rank"] = worker.rank
        reply["seconds"] = time.perf_counter() - started
        if sealer is not None:
            try:
                sealed = sealer.seal(reply, nonce)
            except (TypeError, ValueError) as exc:  # an op whose reply is not JSON: the harness's bug
                sealed = sealer.seal({**_fail(failures.INFRA_ERROR, f"rank {worker.rank}: reply to {op!r} is "
                                                                    f"not JSON: {exc}"), "rank": worker.rank}, nonce)
            replies.send_bytes(sealed)
        else:
            replies.send(reply)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="pkb-agent rank worker (started by harness.rank.launcher)")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--init-file", required=True)
    parser.add_argument("--request-fd", type=int, required=True)
    parser.add_argument("--reply-fd", type=int, required=True)
    parser.add_argument("--events-fd", type=int, default=None)
    parser.add_argument("--role", choices=ROLES, default="trusted")
    parser.add_argument("--device-index", type=int, default=None, help="this rank's GPU among the visible ones")
    parser.add_argument("--emulate", action="store_true", help="ranks share GPUs: emulated symmetric memory")
    args = parser.parse_args(argv)
    # The harness's fallback for stacks when py-spy is missing: a dump of every thread on SIGUSR1.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    requests = Connection(args.request_fd, readable=True, writable=False)
    replies = Connection(args.reply_fd, readable=False, writable=True)
    monitor = CollectiveMonitor(args.events_fd)
    monitor.install()  # before the problem or any candidate binds torch.distributed's functions
    worker = Worker(args.rank, args.world_size, args.device, args.role, monitor, device_index=args.device_index,
                    emulate=args.emulate)
    started = time.perf_counter()
    try:
        worker.init_process_group(args.init_file)
    except Exception as exc:
        replies.send({"ok": False, "rank": args.rank, "verdict": failures.INFRA_ERROR,
                      "message": f"process group init failed: {exc}", "evidence": trimmed_traceback(exc)})
        return
    if args.emulate and args.role == "candidate" and args.device == "cuda":
        # Before the guard's capture and before any problem or candidate: the candidate sees this API.
        from harness.emulation import install

        install()
    replies.send({"ok": True, "rank": args.rank, "op": "ready", "seconds": time.perf_counter() - started,
                  "pid": os.getpid()})
    serve(worker, requests, replies)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter and process-group teardown: it can block on peers and proves nothing here.
    os._exit(0)


if __name__ == "__main__":
    main()
