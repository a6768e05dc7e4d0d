"""A group of W rank processes that the harness can always kill.

Each rank is a `python -m harness.worker` process in its own session (so killing its process group
also kills anything the candidate spawned). Requests and replies travel on private pipes; the
candidate's stdout and stderr go to per-rank log files. Rendezvous uses a FileStore in a private
temporary folder: no port is opened, so none can be left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from harness import failures

REPO_ROOT = Path(__file__).resolve().parent.parent

# NVLink multicast stays off on every machine this runs on, in every process the harness starts.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


class PoolError(RuntimeError):
    """The pool itself failed (could not start): an infrastructure error."""


class Hang(RuntimeError):
    """Some ranks did not answer in time. `replies` holds what the others said."""

    def __init__(self, missing: list[int], replies: dict[int, dict[str, Any]], timeout: float) -> None:
        super().__init__(f"ranks {missing} did not answer within {timeout:.0f} s")
        self.missing = missing
        self.replies = replies
        self.timeout = timeout


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen
    requests: Connection
    replies: Connection
    log: Path


def worker_env(device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(SAFE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


class RankPool:
    """W worker processes joined in one process group. Use as a context manager."""

    def __init__(self, world_size: int, device: str = "cpu", *, start_timeout: float = 120.0,
                 env: dict[str, str] | None = None, keep_logs: Path | None = None,
                 gpus: list[int] | None = None, rank_prefix: dict[int, list[str]] | None = None) -> None:
        """`gpus`: physical GPU indices, one per rank (default: 0..W-1), exported as CUDA_VISIBLE_DEVICES
        so rank r sees its GPU as cuda:r and two pools on disjoint GPU sets never collide.
        `rank_prefix`: a command to wrap one rank's process with (e.g. a profiler), keyed by rank."""
        self.world_size = world_size
        self.device = device
        self.start_timeout = start_timeout
        self.extra_env = env or {}
        self.keep_logs = keep_logs
        if gpus is not None and len(gpus) != world_size:
            raise ValueError(f"{world_size} ranks need {world_size} GPUs, got {gpus}")
        self.gpus = gpus
        self.rank_prefix = rank_prefix or {}
        self.ranks: list[_Rank] = []
        self.tmp: tempfile.TemporaryDirectory[str] | None = None
        self.start_seconds = 0.0

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> RankPool:
        started = time.perf_counter()
        self.tmp = tempfile.TemporaryDirectory(prefix="pkb-pool-")
        init_file = Path(self.tmp.name) / "rendezvous"
        env = worker_env(self.device, self.extra_env)
        if self.device == "cuda" and self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus))
        for rank in range(self.world_size):
            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
            log = Path(self.tmp.name) / f"rank{rank}.log"
            with open(log, "wb") as log_file:
                proc = subprocess.Popen(
                    [*self.rank_prefix.get(rank, []),
                     sys.executable, "-m", "harness.worker", "--rank", str(rank), "--world-size",
                     str(self.world_size), "--device", self.device, "--init-file", str(init_file),
                     "--request-fd", str(req_r), "--reply-fd", str(rep_w)],
                    pass_fds=(req_r, rep_w),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(REPO_ROOT),
                    start_new_session=True,
                )
            os.close(req_r)
            os.close(rep_w)
            self.ranks.append(_Rank(rank, proc, Connection(req_w, readable=False),
                                    Connection(rep_r, writable=False), log))
        try:
            replies = self._collect(self.start_timeout, grace=5.0)
        except Hang as hang:
            self.kill()
            raise PoolError(f"rank processes did not start: {hang}; {self._log_tails(hang.missing)}") from hang
        bad = [r for r in replies.values() if not r.get("ok")]
        if bad:
            self.kill()
            raise PoolError(f"rank {bad[0]['rank']} failed to start: {bad[0].get('message')}\n"
                            f"{bad[0].get('evidence', '')}")
        self.start_seconds = time.perf_counter() - started
        return self

    def __enter__(self) -> RankPool:
        return self.start() if not self.ranks else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return bool(self.ranks) and all(r.proc.poll() is None for r in self.ranks)

    def pids(self) -> list[int]:
        return [r.proc.pid for r in self.ranks]

    def close(self, timeout: float = 10.0) -> None:
        """Ask every rank to exit; kill whatever has not exited by the deadline."""
        for r in self.ranks:
            try:
                r.requests.send({"op": "exit"})
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + timeout
        for r in self.ranks:
            try:
                r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL every rank's whole process group, reap them, close pipes, remove the temp folder."""
        for r in self.ranks:
            try:
                os.killpg(r.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for r in self.ranks:
            try:
                r.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            for conn in (r.requests, r.replies):
                try:
                    conn.close()
                except OSError:
                    pass
        if self.keep_logs is not None and self.tmp is not None:
            self.keep_logs.mkdir(parents=True, exist_ok=True)
            for r in self.ranks:
                if r.log.exists():
                    (self.keep_logs / r.log.name).write_bytes(r.log.read_bytes()[-200_000:])
        self.ranks = []
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None

    # -- requests -------------------------------------------------------------------------------
    def request(self, message: dict[str, Any], timeout: float, grace: float = 5.0) -> list[dict[str, Any]]:
        """Send one request to every rank; return the replies in rank order.

        Raises Hang when a rank has not answered by `timeout`, or within `grace` seconds of another
        rank reporting a failure (its peers are then usually stuck in a collective).
        """
        if not self.alive:
            raise PoolError("the rank pool is not running")
        for r in self.ranks:
            r.requests.send(message)
        replies = self._collect(timeout, grace)
        return [replies[i] for i in range(self.world_size)]

    def _collect(self, timeout: float, grace: float) -> dict[int, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        replies: dict[int, dict[str, Any]] = {}
        by_conn = {r.replies: r for r in self.ranks}
        while len(replies) < self.world_size:
            pending = [r.replies for r in self.ranks if r.rank not in replies]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(self.world_size)) - set(replies))
                raise Hang(missing, replies, timeout)
            for conn in wait(pending, timeout=min(remaining, 0.5)):
                r = by_conn[conn]
                try:
                    reply = conn.recv()
                except (EOFError, OSError):
                    reply = self._death_reply(r)
                replies[r.rank] = reply
                if not reply.get("ok"):
                    deadline = min(deadline, time.monotonic() + grace)
        return replies

    def _death_reply(self, r: _Rank) -> dict[str, Any]:
        try:
            code = r.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return {"ok": False, "rank": r.rank, "verdict": failures.RUNTIME_ERROR,
                "message": f"rank {r.rank} process {how}", "evidence": self._log_tail(r)}

    def _log_tail(self, r: _Rank, limit: int = 3000) -> str:
        try:
            return r.log.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def _log_tails(self, ranks: list[int]) -> str:
        return "\n".join(f"[rank {r.rank} log]\n{self._log_tail(r)}" for r in self.ranks if r.rank in ranks)
