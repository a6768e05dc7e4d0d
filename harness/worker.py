"""The per-rank worker: the process that runs references and untrusted candidates.

One process per rank, started by harness.pool. It joins the process group, then answers requests read
from a private pipe until told to exit. It imports torch, the standard library, the problem module
and the candidate, nothing else (the GPU machine has no pydantic). Keep it small enough to audit.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness import failures, timing
from harness.candidate import CandidateError, load_candidate, trimmed_traceback
from harness.compare import compare_outputs, same_values
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


class Worker:
    def __init__(self, rank: int, world_size: int, device: str) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(f"cuda:{rank % max(torch.cuda.device_count(), 1)}" if device == "cuda" else "cpu")
        self.problems: dict[str, Problem] = {}
        self.candidates: dict[str, Any] = {}

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

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

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
        """The distributed reference against the single-process oracle, over several trials."""
        problem = self.problem(req["problem"])
        shape = problem.shape(req["shape"])
        worst = 0.0
        for trial in range(req["trials"]):
            mine = self.inputs(problem, shape, req["seed"], trial)
            out = problem.solution(*clone_tree(mine))
            self.sync()
            # Every rank's inputs, drawn on this device (a CUDA generator's stream differs from the CPU's),
            # then handed to the oracle on the CPU.
            everyone = [_to_cpu(self.inputs(problem, shape, req["seed"], trial, r)) for r in range(self.world_size)]
            expected = problem.oracle(shape, self.world_size, everyone)
            if len(expected) != self.world_size:
                return {"ok": False, "verdict": failures.INFRA_ERROR,
                        "message": f"oracle returned {len(expected)} outputs for {self.world_size} ranks"}
            result = compare_outputs(expected[self.rank], _to_cpu(out), problem.atol, problem.rtol)
            if not result["ok"]:
                return {"ok": False, "verdict": result["verdict"], "trial": trial,
                        "message": f"reference disagrees with oracle on rank {self.rank}, trial {trial}: "
                                   f"{result['message']}"}
            if not same_values(mine, self.inputs(problem, shape, req["seed"], trial)):
                return {"ok": False, "verdict": failures.OUTPUT_MISMATCH,
                        "message": "make_inputs is not reproducible from the seed"}
            worst = max(worst, result.get("max_abs_err", 0.0))
        return {"ok": True, "max_abs_err": worst}

    def load_candidate(self, req: dict[str, Any]) -> dict[str, Any]:
        problem = self.problem(req["problem"])
        try:
            self.candidates[req["candidate"]] = load_candidate(Path(req["candidate"]), problem.solution)
        except CandidateError as err:
            return {"ok": False, "verdict": err.verdict, "message": err.message, "evidence": err.evidence}
        return {"ok": True}

    def check(self, req: dict[str, Any]) -> dict[str, Any]:
        """Candidate vs reference on fresh inputs per trial; the candidate runs first on its own copy."""
        problem = self.problem(req["problem"])
        candidate = self.candidates[req["candidate"]].solution
        shape = problem.shape(req["shape"])
        flags: list[str] = []
        worst_abs = worst_rel = 0.0
        previous_expected = None
        for trial in range(req["trials"]):
            pristine = self.inputs(problem, shape, req["seed"], trial)
            theirs = clone_tree(pristine)
            try:
                got = candidate(*theirs)
                self.sync()
            except Exception as exc:
                return {"ok": False, "verdict": failures.RUNTIME_ERROR, "trial": trial,
                        "message": f"rank {self.rank} raised {type(exc).__name__} in trial {trial}: {exc}"[:600],
                        "evidence": trimmed_traceback(exc)}
            got = _snapshot(got)  # copy now: a later call must not be able to rewrite this answer
            expected = problem.solution(*clone_tree(pristine))
            self.sync()
            if not same_values(theirs, pristine):
                return {"ok": False, "verdict": failures.OUTPUT_MISMATCH, "trial": trial,
                        "flags": ["mutates_inputs"],
                        "message": f"rank {self.rank} modified its inputs in trial {trial}"}
            result = compare_outputs(expected, got, problem.atol, problem.rtol)
            if not result["ok"]:
                if previous_expected is not None and compare_outputs(
                        previous_expected, got, problem.atol, problem.rtol)["ok"]:
                    flags.append("stale_output")
                    result["message"] += " (the output equals the previous call's answer: stale result)"
                return {"ok": False, "verdict": result["verdict"], "trial": trial, "flags": flags,
                        "message": f"rank {self.rank}, trial {trial}: {result['message']}",
                        "max_abs_err": result.get("max_abs_err"), "max_rel_err": result.get("max_rel_err")}
            worst_abs = max(worst_abs, result.get("max_abs_err", 0.0))
            worst_rel = max(worst_rel, result.get("max_rel_err", 0.0))
            previous_expected = expected
        return {"ok": True, "max_abs_err": worst_abs, "max_rel_err": worst_rel, "flags": flags}

    def time(self, req: dict[str, Any]) -> dict[str, Any]:
        problem = self.problem(req["problem"])
        fn = problem.solution if req["candidate"] is None else self.candidates[req["candidate"]].solution
        shape = problem.shape(req["shape"])

        def make_set(i: int) -> tuple:
            return self.inputs(problem, shape, req["seed"], req["trial_base"] + i)

        try:
            result = timing.time_function(fn, make_set, self.device, req["config"])
        except Exception as exc:
            return {"ok": False, "verdict": failures.RUNTIME_ERROR,
                    "message": f"rank {self.rank} raised {type(exc).__name__} while timed: {exc}"[:600],
                    "evidence": trimmed_traceback(exc)}
        return {"ok": True, **result}


def _snapshot(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_snapshot(v) for v in value)
    return value


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def serve(worker: Worker, requests: Connection, replies: Connection) -> None:
    while True:
        req = requests.recv()
        if req.get("op") == "exit":
            break
        started = time.perf_counter()
        try:
            reply = worker.handle(req)
        except Exception as exc:  # a bug in a problem or the harness: not the candidate's fault
            reply = {"ok": False, "verdict": failures.INFRA_ERROR,
                     "message": f"rank {worker.rank}: {type(exc).__name__}: {exc}"[:600],
                     "evidence": trimmed_traceback(exc)}
        reply["rank"] = worker.rank
        reply["seconds"] = time.perf_counter() - started
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
    worker = Worker(args.rank, args.world_size, args.device)
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
