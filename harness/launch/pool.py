"""A group of W rank processes that the harness can always kill, and whose replies it reads as data.

A pool is one launcher process (harness.rank.launcher) that starts the W `harness.rank.worker`
processes; for a pool that loads candidate code (role "candidate") the launcher runs inside a sandbox
(harness.launch.sandbox: its own PID, user, network and IPC namespaces, a read-only filesystem, one writable
scratch folder), so killing the sandbox ends every process the ranks started. Pools that only run
references and problem code (role "trusted": reference timing, validation, tracing) skip the sandbox.

Each rank has four pipes: requests (harness -> rank), replies, events (collectives as the rank's
monitor sees them, written as they happen) and its stdout+stderr, which the harness drains while it
waits and caps (a rank that writes more than `output_cap` bytes fails the pool). Replies after the
"seal" request are JSON with an HMAC over the request's nonce and the body (harness.common.channel); nothing a
rank writes after that point is unpickled. A rank runs hostile code, so a reply is a claim: the judge
(harness.judge) decides from the data in it, never from a verdict it states.

When a request overruns, `Hang.stacks` holds every rank's Python stack (py-spy where installed, else
the worker's faulthandler), taken before the pool is killed: harness.judge.watchdog reads them to tell
ranks that wait on each other (deadlock) from ranks that are busy (timeout).

Beside this module: the reply protocol and the draining of the pipes (harness.launch.replies), stack
capture (harness.launch.stacks), and what a killed harness left behind (harness.launch.leftovers).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, cast

from harness import cancel
from harness.common import channel, failures, hostile_files
from harness.common.paths import REPO_ROOT
from harness.common.safe_env import SAFE_ENV
from harness.emulation import layout
from harness.launch import leftovers
from harness.launch.replies import RankPipes, drain, keyed_by_rank, parse_frame
from harness.launch.sandbox import EXT_MOUNT, SandboxInfo, SandboxPolicy, clean_environment, probe
from harness.launch.sandbox.limits import SandboxLimits
from harness.launch.sandbox.memory import MemoryCgroup
from harness.launch.sandbox.namespace import children as _children
from harness.launch.sandbox.namespace import pid_namespace_members as _pid_namespace_members
from harness.launch.sandbox.namespace import sandbox_init as _sandbox_init
from harness.launch.sandbox.policy import SANDBOX_UID
from harness.launch.sandbox.private import OWNER_FILE, hand_over, private_folder, remove_private
from harness.launch.sandbox.watch import SandboxWatch
from harness.launch.stacks import capture as capture_stacks
from harness.records.cache_dir import cache_root
from harness.records.redaction import redact_bytes

OUTPUT_CAP = 64 << 20  # bytes of stdout+stderr a pool's ranks may write together
# The candidate's own folders in its scratch (TMPDIR, caches, HOME), made when the pool starts.
SCRATCH_DIRS = ("tmp", "cache", "home")


class PoolError(RuntimeError):
    """The pool itself failed (could not start): an infrastructure error."""


class RankMisbehaved(RuntimeError):
    """A rank broke a limit of its sandbox (output volume, process count, memory, tmpfs, scratch): the
    candidate's failure. `evidence`: the limits in force and what was measured, where known."""

    def __init__(self, rank: int | None, message: str, evidence: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.evidence = evidence


class Hang(RuntimeError):
    """Some ranks did not answer in time. `replies` holds what the others said; `stacks` every rank's
    stack at the moment the limit ran out (empty where none could be taken)."""

    def __init__(self, missing: list[int], replies: dict[int, dict[str, Any]], timeout: float,
                 stacks: dict[int, str] | None = None) -> None:
        super().__init__(f"ranks {missing} did not answer within {timeout:.0f} s")
        self.missing = missing
        self.replies = replies
        self.timeout = timeout
        self.stacks = stacks or {}


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
                 gpus: list[int] | None = None, rank_prefix: dict[int, list[str]] | None = None,
                 role: str = "trusted", extensions: Path | None = None, output_cap: int = OUTPUT_CAP,
                 fsize_limit: int = 16 << 30, nofile_limit: int = 16384,
                 sandbox: bool = True, visible: tuple[Path, ...] = (), ranks_per_gpu: int = 1,
                 sandbox_limits: SandboxLimits | None = None) -> None:
        """`gpus`: physical GPU indices, one per rank (default: 0..W-1), exported as CUDA_VISIBLE_DEVICES
        so rank r sees its GPU as cuda:r and two pools on disjoint GPU sets never collide.
        `rank_prefix`: a command to wrap one rank's process with (e.g. a profiler), keyed by rank.
        `role`: "candidate" for pools that load candidate code (sandboxed), "trusted" for the rest.
        `extensions`: the folder mounted as the sandbox's torch extension folder (candidate pools).
        `sandbox=False` runs a candidate pool without its sandbox (Nsight Compute needs the GPU's
        performance counters, which a user namespace cannot reach); the record says so.
        `visible`: files or folders a sandbox must see read-only: the candidate's copy, a problem's file or
        checkout (harness.launch.sandbox.mounts binds the rest from facts).
        `ranks_per_gpu` > 1: ranks share GPUs (gpus may then repeat), join gloo, and a candidate pool's
        ranks get harness.emulation's symmetric memory.
        `sandbox_limits`: memory, tmpfs and scratch limits of a sandboxed pool (default: the integrity
        settings' defaults for W ranks)."""
        if role not in ("trusted", "candidate"):
            raise ValueError(f"unknown pool role {role!r}")
        self.world_size = world_size
        self.device = device
        self.start_timeout = start_timeout
        self.extra_env = env or {}
        self.keep_logs = keep_logs
        if gpus is not None and len(gpus) != world_size:
            raise ValueError(f"{world_size} ranks need one GPU entry each, got {gpus}")
        self.ranks_per_gpu = ranks_per_gpu
        self.gpus = gpus
        self.rank_prefix = rank_prefix or {}
        self.role = role
        self.extensions = extensions
        self.visible = visible
        self.output_cap = output_cap
        self.limits = {"nofile": nofile_limit, "fsize": fsize_limit}
        if role != "candidate":
            self.sandbox = SandboxInfo("none", reason="trusted pool")
        elif not sandbox:
            self.sandbox = SandboxInfo("none", reason="asked to run unsandboxed (Nsight Compute profiling)")
        else:
            self.sandbox = probe()
        self.sandbox_limits = sandbox_limits or SandboxLimits.for_ranks(world_size)
        self.ranks: list[RankPipes] = []
        self.folder: Path | None = None  # under the private root: owner file, sandbox log, scratch
        self.scratch: Path | None = None
        # The scratch held open from before any rank started: the one way the harness touches what the
        # ranks wrote there (harness.common.hostile_files).
        self.scratch_files: hostile_files.Folder | None = None
        self._policy: SandboxPolicy | None = None
        self._cgroup: MemoryCgroup | None = None
        self._watch: SandboxWatch | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._status_fd: int | None = None
        self._status_buffer = b""
        self.start_seconds = 0.0
        self.last_span_s = 0.0
        self._last_reply_at = 0.0
        # The reply channel: one key per rank once sealed (None before), the current request's nonce,
        # and the bytes read from each rank's reply pipe that do not yet make a whole frame.
        self._keys: dict[int, bytes] | None = None
        self._nonce = ""
        # In every rank's environment, so inherited by all they start: kill() finds by it what left
        # the ranks' sessions (unsandboxed pools).
        self._marker = f"{leftovers.POOL_MARKER}={secrets.token_hex(12)}"  # matches leftovers.MARKER_LINE
        self._buffers: dict[int, bytearray] = {}
        self._process_check_at = 0.0
        self._started_at = 0.0
        self._killer: int | None = None  # harness.cancel's key for this pool's processes

    @property
    def sandboxed(self) -> bool:
        return self.sandbox.backend == "bwrap"

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> RankPool:
        self.launch()
        return self.wait_ready()

    def launch(self) -> RankPool:
        """Start the processes; wait_ready() waits for them. Between the two the harness may do other work."""
        self._started_at = time.perf_counter()
        leftovers.reap_stale_folders()
        self.folder = folder = private_folder(leftovers.FOLDER_PREFIX)
        (folder / OWNER_FILE).write_text(f"{leftovers.process_identity(os.getpid()) or ''}\n{self._marker}\n")
        self.scratch = self._make_scratch(folder / "scratch")
        child_fds: list[int] = []
        entries = []
        visible_gpus, device_index = self._placement()
        for rank in range(self.world_size):
            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
            ev_r, ev_w = os.pipe()
            log_r, log_w = os.pipe()
            os.set_blocking(ev_r, False)
            os.set_blocking(log_r, False)
            child_fds += [req_r, rep_w, ev_w, log_w]
            entries.append({"rank": rank, "request_fd": req_r, "reply_fd": rep_w, "events_fd": ev_w,
                            "log_fd": log_w, "prefix": self.rank_prefix.get(rank, []),
                            "args": ["--device-index", str(device_index[rank])] if device_index else []})
            self.ranks.append(RankPipes(rank, Connection(req_w, readable=False), Connection(rep_r, writable=False),
                                    ev_r, log_r))
        status_r, status_w = os.pipe()
        os.set_blocking(status_r, False)
        child_fds.append(status_w)
        self._status_fd = status_r
        spec = {"ranks": entries, "status_fd": status_w, "limits": self.limits,
                "worker_args": ["--world-size", str(self.world_size), "--device", self.device,
                                "--init-file", str(self.scratch / "rendezvous"), "--role", self.role,
                                *(["--emulate"] if self.ranks_per_gpu > 1 else [])]}
        command = [sys.executable, "-m", "harness.rank.launcher", json.dumps(spec)]
        env = worker_env(self.device, self.extra_env)
        env[leftovers.POOL_MARKER] = self._marker.split("=", 1)[1]
        if visible_gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_gpus
        if self.role == "candidate":
            env = clean_environment(env, self.scratch)
            if self.sandboxed:
                if self.extensions is not None:
                    env["TORCH_EXTENSIONS_DIR"] = EXT_MOUNT
                self._policy = SandboxPolicy(scratch=self.scratch, extensions=self.extensions, hide=(cache_root(),),
                                             gpus=self.device == "cuda", visible=self.visible,
                                             limits=self.sandbox_limits, info=self.sandbox)
                command = self._policy.bwrap_command(command, REPO_ROOT)
                self._cgroup = MemoryCgroup.create(folder.name, self.sandbox_limits.memory_bytes)
                if self._cgroup is not None:
                    command = self._cgroup.join_command(command)
            elif self.extensions is not None:
                env["TORCH_EXTENSIONS_DIR"] = str(self.extensions)
        with open(folder / "sandbox.log", "wb") as sandbox_log:
            self.proc = subprocess.Popen(command, pass_fds=child_fds, stdin=subprocess.DEVNULL, stdout=sandbox_log,
                                         stderr=subprocess.STDOUT, env=env, cwd=str(REPO_ROOT),
                                         start_new_session=True)
        if self._policy is not None:
            watched = [self.scratch, *([self.extensions] if self.extensions is not None else [])]
            self._watch = SandboxWatch(self.sandbox_limits, self.proc.pid, watched, kill=self._kill_sandbox,
                                       cgroup=self._cgroup, names=self._rank_name).start()
        for fd in child_fds:
            os.close(fd)
        # Ctrl-C of the command ends this pool's processes from the main thread at once; this thread then
        # sees the pipes close (or its next poll) and cleans up with kill().
        self._killer = cancel.register(self._signal_processes)
        return self

    @property
    def _host_uid_switch(self) -> bool:
        return self.sandboxed and self.sandbox.host_uid_switch

    def _give_to_sandbox(self, path: Path) -> None:
        """Make `path` (and what is in it) the sandbox's uid's, where ranks run as their own uid on the host."""
        if self._host_uid_switch:
            hand_over(path, SANDBOX_UID)

    def _make_scratch(self, scratch: Path) -> Path:
        """The scratch folder and the candidate's own folders in it (TMPDIR, caches, HOME). Where ranks run as
        another uid, the scratch stays the harness's (sticky, writable by all: ranks create files in it but
        cannot remove or replace what the harness made) and those folders are the ranks'. Everything inside
        the scratch is made through its held folder (harness.common.hostile_files), as every later access is."""
        scratch.mkdir(mode=0o700)
        if self._host_uid_switch:
            os.chmod(scratch, 0o1777)
        self.scratch_files = files = hostile_files.Folder.open(scratch)
        for sub in SCRATCH_DIRS:
            files.make_dir(sub, 0o700)
            self._give_to_sandbox(scratch / sub)
        if self.extensions is not None:
            self._give_to_sandbox(self.extensions)
        return scratch

    def exchange_dir(self, name: str, writable: bool) -> Path:
        """A folder of the scratch for files the harness and the ranks exchange, made before any candidate code
        runs (so none can have put a link in its place). `writable`: the ranks write into it (outputs); else
        only the harness does (inputs), and where ranks run as another uid they cannot."""
        assert self.scratch is not None and self.scratch_files is not None
        path = self.scratch / name
        self.scratch_files.make_dir(name, 0o755 if not writable else 0o700)
        if writable:
            self._give_to_sandbox(path)
        return path

    def _rank_name(self, pid: int) -> str:
        named = [r.rank for r in self.ranks if r.host_pid == pid]
        return f"rank {named[0]}" if named else f"process {pid}"

    def _kill_sandbox(self) -> None:
        """From the watch's thread: end the sandbox (bwrap's group; its PID namespace dies with it). The
        harness's thread then finds the ranks gone and the watch's reason."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _limit_reached(self, failed: bool) -> None:
        """Raise RankMisbehaved naming the sandbox's limit when the watch killed the sandbox, or when ranks
        failed (`failed`) and a limit explains it (a full tmpfs, the cgroup's OOM kill)."""
        if self._watch is None or self._keys is None:
            return  # no candidate code ran before the channel was sealed
        reason = self._watch.breach or (self._watch.explain() if failed else None)
        if reason:
            measured = {"limits": self.sandbox_limits.record(), "peak_memory_bytes": self._watch.peak_bytes,
                        "memory": self._cgroup.record() if self._cgroup is not None else {"backend": "watchdog"}}
            raise RankMisbehaved(None, reason, evidence=json.dumps(measured))

    def record(self) -> dict[str, Any]:
        """integrity.sandbox: the sandbox in force, its uid model, what it bound, its limits and how memory was
        limited (a cgroup or the watchdog)."""
        if self._policy is None:
            return self.sandbox.record()
        out = self._policy.record(REPO_ROOT)
        out["memory"] = self._cgroup.record() if self._cgroup is not None else {"backend": "watchdog"}
        return out

    def _signal_processes(self) -> None:
        """SIGKILL of the pool's session and of whatever carries its marker: signals only, no pipe or folder is
        touched, so any thread may call it while the pool's owner is inside a request."""
        proc = self.proc
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # sandboxed: bwrap's init, and so the namespace, dies with it
        except (ProcessLookupError, PermissionError):
            pass
        channel.kill_session(proc.pid)
        channel.kill_marked(self._marker)

    def _placement(self) -> tuple[str | None, list[int]]:
        """(CUDA_VISIBLE_DEVICES for the pool, each rank's device index under it). Physical GPUs one per
        rank (`gpus`, which may repeat when ranks share GPUs), or the visible ones in order."""
        if self.device != "cuda":
            return None, []
        per_rank = self.gpus
        if per_rank is None:
            if self.ranks_per_gpu <= 1:
                return None, []  # rank r uses cuda:r (or r modulo the visible GPUs)
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible:
                ids = [int(x) for x in visible.split(",") if x.strip().isdigit()]
            else:
                import torch

                ids = list(range(torch.cuda.device_count()))
            per_rank = layout.rank_gpus(self.world_size, self.ranks_per_gpu, ids)
        return layout.visible_devices(list(per_rank))

    def wait_ready(self) -> RankPool:
        try:
            replies = self._collect(self.start_timeout, grace=5.0)
        except cancel.Cancelled:
            self.kill()  # a pool entered with `with` has no __exit__ when its start fails
            raise
        except Hang as hang:
            self.kill()
            raise PoolError(f"rank processes did not start: {hang}; {self._log_tails(hang.missing)}") from hang
        bad = [r for r in replies.values() if not r.get("ok")]
        if bad:
            tails = self._log_tails([bad[0].get("rank", 0)])
            self.kill()
            raise PoolError(f"rank {bad[0].get('rank')} failed to start: {bad[0].get('message')}\n"
                            f"{bad[0].get('evidence', '')}{tails}")
        for r in self.ranks:
            r.inner_pid = replies[r.rank].get("pid")
        self._find_host_pids()
        self._seal()
        self.start_seconds = time.perf_counter() - self._started_at
        return self

    def _find_host_pids(self) -> None:
        """Map each rank's own pid (as it sees it, inside the sandbox's PID namespace) to the host's."""
        if not self.sandboxed or self.proc is None:
            for r in self.ranks:
                r.host_pid = r.inner_pid
            return
        wanted = {r.inner_pid: r for r in self.ranks}
        stack = [self.proc.pid]
        while stack:
            pid = stack.pop()
            chain = leftovers.inner_pids(pid)
            if len(chain) > 1 and chain[-1] in wanted:
                wanted[chain[-1]].host_pid = pid
            stack.extend(_children(pid))

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
        except cancel.Cancelled:
            self.kill()
            raise
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
        return bool(self.ranks) and self.proc is not None and self.proc.poll() is None \
            and all(r.returncode is None for r in self.ranks)

    @property
    def sealed(self) -> bool:
        return self._keys is not None

    def pids(self) -> list[int]:
        """Host pids of the rank workers."""
        return [r.host_pid for r in self.ranks if r.host_pid is not None]

    def close(self, timeout: float = 10.0) -> None:
        """Ask every rank to exit; kill whatever has not exited by the deadline (at once after Ctrl-C)."""
        if cancel.requested():
            self.kill()
            return
        for r in self.ranks:
            try:
                r.requests.send({"op": "exit"})
            except (OSError, ValueError):
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """End every process of the pool, close the pipes, remove the pool's folder.

        Sandboxed: SIGKILL of bwrap takes its init with it (--die-with-parent), and the kernel then ends
        every process of the sandbox's PID namespace. Unsandboxed: the launcher's session, then every
        process carrying the pool's marker (what called setsid)."""
        if self._watch is not None:
            self._watch.stop()
        if self._killer is not None:
            cancel.unregister(self._killer)
            self._killer = None
        proc = self.proc
        if proc is not None:
            init = _sandbox_init(proc.pid) if self.sandboxed else None
            members = _pid_namespace_members(init) if init is not None else []
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            channel.kill_session(proc.pid)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            channel.kill_session(proc.pid)
            if self.sandboxed:
                for pid in members:  # normally gone with the namespace's init already
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            channel.kill_marked(self._marker)
        if self._cgroup is not None:
            self._cgroup.remove()  # and with it whatever is still in it
            self._cgroup = None
        for r in self.ranks:
            for conn in (r.requests, r.replies):
                try:
                    conn.close()
                except OSError:
                    pass
            for fd in (r.events_fd, r.log_fd):
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self._status_fd is not None:
            try:
                os.close(self._status_fd)
            except OSError:
                pass
            self._status_fd = None
        if self.keep_logs is not None and self.folder is not None:
            self.keep_logs.mkdir(parents=True, exist_ok=True)
            for r in self.ranks:
                hostile_files.replace_file(self.keep_logs / f"rank{r.rank}.log", redact_bytes(bytes(r.log)))
        self.ranks = []
        self.proc = None
        if self.scratch_files is not None:
            self.scratch_files.close()
            self.scratch_files = None
        self._keys = None
        self._buffers = {}
        if self.folder is not None:
            remove_private(self.folder)
            self.folder = None

    # -- requests -------------------------------------------------------------------------------
    def request(self, message: dict[str, Any] | dict[int, dict[str, Any]], timeout: float,
                grace: float = 5.0, build_allowance: float = 0.0) -> list[dict[str, Any]]:
        """Send one request to every rank (the same message, or one per rank keyed by rank); return the
        replies in rank order. `last_span_s` is the harness's own time from the first send to the last
        reply.

        Raises Hang (with every rank's stack) when a rank has not answered by `timeout`, or within
        `grace` seconds of another rank reporting a failure (its peers are then usually stuck in a
        collective); RankMisbehaved when a rank breaks a limit of its sandbox. A rank that reported a
        native build starting (a build inside a call) gets up to `build_allowance` seconds from then.
        """
        self._limit_reached(failed=False)  # the watch ended the sandbox between two requests
        if not self.alive:
            raise PoolError("the rank pool is not running")
        per_rank = message if keyed_by_rank(message) else None
        self._nonce = secrets.token_hex(16)  # a reply to an earlier request can never pass for this one's
        started = self._last_reply_at = time.perf_counter()
        for r in self.ranks:
            body = per_rank[r.rank] if per_rank is not None else message
            r.requests.send({**body, "nonce": self._nonce})
        replies = self._collect(timeout, grace, build_allowance)
        # Up to the last reply: the harness's own chores after it (the sandbox's process count, a scan of
        # /proc that takes tens of milliseconds on a busy machine) are no part of what the ranks took.
        self.last_span_s = self._last_reply_at - started
        return [replies[i] for i in range(self.world_size)]

    def building(self, ranks: list[int] | None = None) -> list[int]:
        """Ranks inside a native build right now (from their build events)."""
        return [r.rank for r in self.ranks if r.building_since is not None and (ranks is None or r.rank in ranks)]

    def build_seconds(self) -> float:
        """The longest time any rank spent in native builds inside calls so far."""
        return max((r.build_seconds for r in self.ranks), default=0.0)

    def _collect(self, timeout: float, grace: float, build_allowance: float = 0.0) -> dict[int, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        replies: dict[int, dict[str, Any]] = {}
        by_conn = {r.replies: r for r in self.ranks}

        def take(r: RankPipes, reply: dict[str, Any] | None) -> None:
            nonlocal deadline
            if reply is None:
                return  # part of a message: keep reading until the deadline
            replies[r.rank] = reply
            self._last_reply_at = time.perf_counter()
            if not reply.get("ok"):
                deadline = min(deadline, time.monotonic() + grace)

        if self._keys is not None:
            for r in self.ranks:  # a frame already buffered (extra bytes from an earlier read) comes first
                take(r, parse_frame(self._buffers[r.rank], self._keys[r.rank], self._nonce, r.rank))
        while len(replies) < self.world_size:
            cancel.check()  # Ctrl-C: the pool is being killed; its caller's cleanup ends it for good
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(self.world_size)) - set(replies))
                builds = [r.building_since for r in self.ranks if r.rank in missing and r.building_since is not None]
                if builds and not any(not rep.get("ok") for rep in replies.values()):
                    remaining = min(builds) + build_allowance - time.monotonic()
                if remaining <= 0:
                    self._limit_reached(failed=True)  # ranks stuck because a full /dev/shm failed a peer
                    raise Hang(missing, replies, timeout, self.stacks())
            pending = [r.replies for r in self.ranks if r.rank not in replies]
            # The ranks' output and event pipes are read while waiting, so a rank that writes a lot
            # never blocks on a full pipe (and one that writes too much is stopped).
            by_fd = {fd: (r, kind) for r in self.ranks for fd, kind in ((r.log_fd, "log"), (r.events_fd, "events"))
                     if fd >= 0}
            ready = wait([*pending, *by_fd], timeout=min(remaining, 0.5))
            for item in ready:
                if isinstance(item, int):
                    r, kind = by_fd[item]
                    self._drain(r, kind)
                    continue
                r = by_conn[cast(Connection, item)]  # wait() returns what it was given: these, and the fds above
                take(r, self._read_sealed(r) if self._keys is not None else self._read_startup(r))
            self._watch_processes()
            self._limit_reached(failed=False)
        for r in self.ranks:
            self._drain(r, "log")
            self._drain(r, "events")
        self._limit_reached(failed=any(not reply.get("ok") for reply in replies.values()))
        return replies

    def _drain(self, r: RankPipes, kind: str) -> None:
        drain(r, kind, self._over_cap)

    def _over_cap(self, r: RankPipes) -> None:
        total = sum(x.log_bytes for x in self.ranks)
        if total > self.output_cap:
            raise RankMisbehaved(r.rank, f"the ranks wrote more than {self.output_cap >> 20} MiB to stdout "
                                         f"and stderr (rank {r.rank} wrote {r.log_bytes >> 20} MiB)")

    def take_events(self) -> dict[int, dict[str, int]]:
        """Collectives each rank's monitor reported since the last call (drained now)."""
        out = {}
        for r in self.ranks:
            self._drain(r, "events")
            if r.events:
                out[r.rank] = dict(r.events)
            r.events.clear()
        return out

    def _watch_processes(self) -> None:
        """At most once a second: a sandbox holding more processes than its limit fails the pool (a fork
        bomb must not take the machine; RLIMIT_NPROC does not bind when the harness runs as root)."""
        now = time.monotonic()
        if not self.sandboxed or self.proc is None or now < self._process_check_at:
            return
        self._process_check_at = now + 1.0
        inside = _sandbox_init(self.proc.pid)
        if inside is None:
            return
        count = len(_pid_namespace_members(inside))
        limit = self.sandbox_limits.processes
        if count > limit:
            raise RankMisbehaved(None, f"the ranks started {count} processes, more than the sandbox's limit of {limit}")

    def net_bytes(self) -> int | None:
        """Bytes sent over the sandbox's loopback since it started (gloo and NCCL socket traffic between
        its ranks), read from outside; None where the pool has no network namespace of its own."""
        if not self.sandboxed or self.proc is None:
            return None
        inside = _sandbox_init(self.proc.pid)
        if inside is None:
            return None
        try:
            for line in Path(f"/proc/{inside}/net/dev").read_text().splitlines():
                name, _, rest = line.partition(":")
                if name.strip() == "lo":
                    return int(rest.split()[8])  # transmitted bytes (on loopback every byte is also received)
        except (OSError, ValueError, IndexError):
            return None
        return None

    def stacks(self, timeout: float = 15.0) -> dict[int, str]:
        """Every live rank's Python stack (harness.launch.stacks)."""

        def log_length(rank: int) -> int:
            return len(self.ranks[rank].log)

        def log_since(rank: int, mark: int) -> str:
            self._drain(self.ranks[rank], "log")
            return bytes(self.ranks[rank].log[mark:]).decode(errors="replace")

        return capture_stacks({r.rank: r.host_pid for r in self.ranks if r.host_pid}, log_length, log_since, timeout)

    def _read_startup(self, r: RankPipes) -> dict[str, Any]:
        """Before sealing only the worker's own code has run (no problem, no candidate): pickle is safe."""
        try:
            # Only the worker's own startup code has sent on this pipe, and it sends dicts.
            return cast("dict[str, Any]", r.replies.recv())
        except (EOFError, OSError):
            return self._death_reply(r)

    def _read_sealed(self, r: RankPipes) -> dict[str, Any] | None:
        """What is readable now on rank r's reply pipe: a reply, or None for 'not a whole frame yet'."""
        try:
            chunk = os.read(r.replies.fileno(), 1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            return self._death_reply(r)
        self._buffers[r.rank] += chunk
        assert self._keys is not None
        return parse_frame(self._buffers[r.rank], self._keys[r.rank], self._nonce, r.rank)

    def _read_status(self, wait_s: float) -> None:
        """Exit codes the launcher reported (a line per rank that ended)."""
        deadline = time.monotonic() + wait_s
        while self._status_fd is not None:
            ready, _, _ = select.select([self._status_fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return
            try:
                chunk = os.read(self._status_fd, 4096)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                return
            *lines, self._status_buffer = (self._status_buffer + chunk).split(b"\n")
            for line in lines:
                try:  # the launcher runs in the sandbox: its lines are claims, kept only when well-formed
                    entry = json.loads(line)
                    rank = int(entry["rank"])
                    if 0 <= rank < len(self.ranks):
                        self.ranks[rank].returncode = int(entry["returncode"])
                except (ValueError, KeyError, IndexError, TypeError, RecursionError):
                    continue
            if time.monotonic() >= deadline:
                return

    def _death_reply(self, r: RankPipes) -> dict[str, Any]:
        """The reply of a rank whose process is gone. `died` marks it as the root failure: its peers then
        fail on the broken connection, and their replies must not be taken for the cause."""
        if r.returncode is None:
            self._read_status(5.0)
        code = r.returncode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        self._drain(r, "log")
        return {"ok": False, "rank": r.rank, "verdict": failures.RUNTIME_ERROR, "died": True,
                "message": f"rank {r.rank} process {how}", "evidence": self._log_tail(r)}

    def _log_tail(self, r: RankPipes, limit: int = 3000) -> str:
        return bytes(r.log[-limit:]).decode(errors="replace")

    def _log_tails(self, ranks: list[int]) -> str:
        for r in self.ranks:
            self._drain(r, "log")
        sandbox = ""
        if self.folder is not None:
            try:  # the launcher's output: what ranks can reach of it is bounded here, never read whole
                sandbox = hostile_files.read_tail(self.folder / "sandbox.log", 2000).decode(errors="replace")
            except (OSError, hostile_files.HostileFile):
                pass
        text = "\n".join(f"[rank {r.rank} log]\n{self._log_tail(r)}" for r in self.ranks if r.rank in ranks)
        return text + (f"\n[sandbox]\n{sandbox}" if sandbox.strip() else "")

