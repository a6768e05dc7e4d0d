"""A group of W rank processes that the harness can always kill, and whose verdicts it can trust.

Each rank is a `python -m harness.worker` process in its own session; killing the pool kills every
process left in those sessions (a compiler under ninja, anything the candidate spawned), not just the
ranks' process groups. Requests travel on private pipes; replies too, but a candidate runs inside the
rank and can write to its reply pipe, so every pool is sealed: once the ranks are up, and before any
candidate or reference code is imported, each rank gets a random key on its request pipe, and from
then on every reply is JSON with an HMAC over the request's nonce and the body (harness.channel). The
parent reads raw bytes with a deadline and never unpickles what a rank wrote after that point. The
candidate's stdout and stderr go to per-rank log files. Rendezvous uses a FileStore in a private
temporary folder: no port is opened, so none can be left behind.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from harness import channel, failures

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



# -- folders of pools whose harness was killed -----------------------------------------------------
# A pool removes its folder when closed or killed, but a harness killed with SIGKILL (a `pkb run` stopped
# mid-evaluation) cannot: its ranks die of a broken pipe and the folder stays. Every pool notes its
# owner (pid and process start time, so a recycled pid is not mistaken for it) and, on start, removes
# the folders whose owner is gone.
FOLDER_PREFIX = "pkb-pool-"
OWNER_FILE = "owner"
# Every rank of a pool, and so everything a rank starts, carries POOL_MARKER=<random hex> in its
# environment; the owner file keeps it, so what outlived a killed harness can be found too.
POOL_MARKER = "PKB_POOL"
_MARKER_LINE = re.compile(rf"{POOL_MARKER}=[0-9a-f]{{24}}")
LEGACY_AGE_S = 3600.0  # a folder without an owner file (an older version's) counts as stale after this


def _process_identity(pid: int) -> str | None:
    """'pid starttime' on Linux (starttime from /proc: unique per boot), 'pid' elsewhere; None if no such
    process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f"{pid} {f.read().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return None if Path("/proc/self/stat").exists() else str(pid)


def _owner_alive(identity: str) -> bool:
    fields = identity.split()
    if not fields or not fields[0].isdigit():
        return False
    return _process_identity(int(fields[0])) == identity


def reap_stale_folders(root: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove pool folders under `root` (the temp folder) whose owning harness process is gone, and end
    the processes that pool's ranks left behind."""
    removed = []
    now = time.time() if now is None else now
    for folder in Path(root or tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        marker = None
        try:
            identity, _, rest = (folder / OWNER_FILE).read_text().partition("\n")
            identity, rest = identity.strip(), rest.strip()
            # Only a well-formed marker: the folder is writable by candidates, and a line such as
            # PATH=/usr/bin would otherwise name every process of this user.
            marker = rest if _MARKER_LINE.fullmatch(rest) else None
        except FileNotFoundError:
            try:
                stale = now - folder.stat().st_mtime > LEGACY_AGE_S  # young: a pool still writing its owner
            except OSError:
                continue
        except OSError:
            continue
        else:
            stale = bool(identity) and not _owner_alive(identity)
        if stale and folder.is_dir():
            if marker:
                channel.kill_marked(marker)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


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
    """W worker processes joined in one process group, with a sealed reply channel. Use as a context
    manager."""

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
        # The reply channel: one key per rank once sealed (None before), the current request's nonce,
        # and the bytes read from each rank's reply pipe that do not yet make a whole frame.
        self._keys: dict[int, bytes] | None = None
        self._nonce = ""
        # In every rank's environment, so inherited by all they start: kill() finds by it what left
        # the ranks' sessions.
        self._marker = f"{POOL_MARKER}={secrets.token_hex(12)}"  # matches _MARKER_LINE
        self._buffers: dict[int, bytearray] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> RankPool:
        started = time.perf_counter()
        reap_stale_folders()
        self.tmp = tempfile.TemporaryDirectory(prefix=FOLDER_PREFIX)
        (Path(self.tmp.name) / OWNER_FILE).write_text(f"{_process_identity(os.getpid()) or ''}\n{self._marker}\n")
        init_file = Path(self.tmp.name) / "rendezvous"
        env = worker_env(self.device, self.extra_env)
        env[POOL_MARKER] = self._marker.split("=", 1)[1]
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
        self._seal()
        self.start_seconds = time.perf_counter() - started
        return self

    def _seal(self) -> None:
        """Give each rank its reply key. The worker has imported nothing but the harness yet (no problem,
        no candidate), so the key reaches it before anything untrusted runs in its process; the key
        never appears in its environment or command line."""
        keys = {r.rank: secrets.token_bytes(32) for r in self.ranks}
        self._nonce = secrets.token_hex(16)
        try:
            for r in self.ranks:
                r.requests.send({"op": "seal", "key": keys[r.rank], "nonce": self._nonce})
            self._keys = keys
            self._buffers = {r.rank: bytearray() for r in self.ranks}
            replies = self._collect(self.start_timeout, grace=5.0)
        except (Hang, OSError) as err:
            self.kill()
            raise PoolError(f"rank processes did not take their reply keys: {err}") from err
        bad = [r for r in replies.values() if not r.get("ok")]
        if bad:
            self.kill()
            raise PoolError(f"rank {bad[0].get('rank')} failed to seal its channel: {bad[0].get('message')}")

    def __enter__(self) -> RankPool:
        return self.start() if not self.ranks else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return bool(self.ranks) and all(r.proc.poll() is None for r in self.ranks)

    @property
    def sealed(self) -> bool:
        return self._keys is not None

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
        """SIGKILL every rank's whole session, reap the ranks, close pipes, remove the temp folder.

        A process group is not enough: ninja starts every compiler in a group of its own and any code
        can call setpgid, but only setsid leaves the session each rank leads (start_new_session); what
        did call setsid is found by the pool's marker in its environment."""
        for r in self.ranks:
            try:
                os.killpg(r.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            channel.kill_session(r.proc.pid)
        for r in self.ranks:
            try:
                r.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            # What left the rank's process group and was started after the first sweep.
            channel.kill_session(r.proc.pid)
            for conn in (r.requests, r.replies):
                try:
                    conn.close()
                except OSError:
                    pass
        if self.ranks:
            channel.kill_marked(self._marker)  # what left the sessions (setsid) with the marker
        if self.keep_logs is not None and self.tmp is not None:
            self.keep_logs.mkdir(parents=True, exist_ok=True)
            for r in self.ranks:
                if r.log.exists():
                    (self.keep_logs / r.log.name).write_bytes(r.log.read_bytes()[-200_000:])
        self.ranks = []
        self._keys = None
        self._buffers = {}
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
        self._nonce = secrets.token_hex(16)  # a reply to an earlier request can never pass for this one's
        for r in self.ranks:
            r.requests.send({**message, "nonce": self._nonce})
        replies = self._collect(timeout, grace)
        return [replies[i] for i in range(self.world_size)]

    def _collect(self, timeout: float, grace: float) -> dict[int, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        replies: dict[int, dict[str, Any]] = {}
        by_conn = {r.replies: r for r in self.ranks}

        def take(r: _Rank, reply: dict[str, Any] | None) -> None:
            nonlocal deadline
            if reply is None:
                return  # part of a message: keep reading until the deadline
            replies[r.rank] = reply
            if not reply.get("ok"):
                deadline = min(deadline, time.monotonic() + grace)

        if self._keys is not None:
            for r in self.ranks:  # a frame already buffered (extra bytes from an earlier read) comes first
                take(r, self._parse(r))
        while len(replies) < self.world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(self.world_size)) - set(replies))
                raise Hang(missing, replies, timeout)
            pending = [r.replies for r in self.ranks if r.rank not in replies]
            for conn in wait(pending, timeout=min(remaining, 0.5)):
                r = by_conn[conn]
                take(r, self._read_sealed(r) if self._keys is not None else self._read_startup(r))
        return replies

    def _read_startup(self, r: _Rank) -> dict[str, Any]:
        """Before sealing only the worker's own code has run (no problem, no candidate): pickle is safe."""
        try:
            return r.replies.recv()
        except (EOFError, OSError):
            return self._death_reply(r)

    def _read_sealed(self, r: _Rank) -> dict[str, Any] | None:
        """What is readable now on rank r's reply pipe: a reply, or None for 'not a whole frame yet'."""
        try:
            chunk = os.read(r.replies.fileno(), 1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            return self._death_reply(r)
        self._buffers[r.rank] += chunk
        return self._parse(r)

    def _parse(self, r: _Rank) -> dict[str, Any] | None:
        """One signed reply from rank r's buffered bytes, a tampering reply, or None for 'not yet'."""
        buf = self._buffers[r.rank]
        if len(buf) < 4:
            return None
        (size,) = struct.unpack("!i", bytes(buf[:4]))  # multiprocessing.Connection's frame header
        if size < 0 or size > channel.MAX_REPLY_BYTES:
            buf.clear()
            return channel.forged_reply(r.rank, f"a reply announced {size} bytes")
        if len(buf) < 4 + size:
            return None
        frame = bytes(buf[4:4 + size])
        del buf[:4 + size]
        assert self._keys is not None
        reply = channel.open_sealed(frame, self._keys[r.rank], self._nonce)
        if reply is None or reply.get("rank") != r.rank:
            return channel.forged_reply(r.rank, "a reply failed authentication")
        return reply

    def _death_reply(self, r: _Rank) -> dict[str, Any]:
        """The reply of a rank whose process is gone. `died` marks it as the root failure: its peers then
        fail on the broken connection, and their replies must not be taken for the cause."""
        try:
            code = r.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return {"ok": False, "rank": r.rank, "verdict": failures.RUNTIME_ERROR, "died": True,
                "message": f"rank {r.rank} process {how}", "evidence": self._log_tail(r)}

    def _log_tail(self, r: _Rank, limit: int = 3000) -> str:
        try:
            return r.log.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def _log_tails(self, ranks: list[int]) -> str:
        return "\n".join(f"[rank {r.rank} log]\n{self._log_tail(r)}" for r in self.ranks if r.rank in ranks)
