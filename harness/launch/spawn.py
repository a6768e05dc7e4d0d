"""Starting a pool's processes: one launcher (harness.rank.launcher) that starts the W rank workers, each with
its four pipes, inside the sandbox for a candidate pool (bwrap under a memory cgroup where one can be made); a
trusted CPU pool's launcher is forked by this process's fork server instead (harness.launch.zygote).

What a pool is asked for lives in `PoolSettings`; `spawn` starts the processes and returns what the rest of the
pool works with (`Spawned`). The pool's folder and scratch are made before (harness.launch.scratch); watching,
talking to and ending the processes are harness.launch.oversight, .exchange and .teardown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Protocol

from harness.common.paths import REPO_ROOT
from harness.common.safe_env import SAFE_ENV
from harness.emulation import layout
from harness.launch import leftovers, zygote
from harness.launch.replies import RankPipes
from harness.launch.sandbox import EXT_MOUNT, SandboxInfo, SandboxPolicy, clean_environment, probe
from harness.launch.sandbox.limits import SandboxLimits
from harness.launch.sandbox.memory import MemoryCgroup
from harness.launch.sandbox.namespace import children
from harness.records.cache_dir import cache_root, keep_inductor_cache_here

OUTPUT_CAP = 64 << 20  # bytes of stdout+stderr a pool's ranks may write together


@dataclass(frozen=True)
class PoolSettings:
    """What a pool is asked for (harness.launch.pool.RankPool's arguments, checked)."""

    world_size: int
    device: str
    role: str
    sandbox: SandboxInfo
    sandbox_limits: SandboxLimits
    start_timeout: float = 120.0
    extra_env: dict[str, str] = field(default_factory=dict)
    gpus: list[int] | None = None
    rank_prefix: dict[int, list[str]] = field(default_factory=dict)
    extensions: Path | None = None
    visible: tuple[Path, ...] = ()
    output_cap: int = OUTPUT_CAP
    limits: dict[str, int] = field(default_factory=dict)  # the launcher's rlimits: nofile, fsize
    ranks_per_gpu: int = 1

    @property
    def sandboxed(self) -> bool:
        return self.sandbox.backend == "bwrap"

    @property
    def host_uid_switch(self) -> bool:
        """Ranks run as their own uid on the host (the scratch's folders are handed to it)."""
        return self.sandboxed and self.sandbox.host_uid_switch


class LauncherProcess(Protocol):
    """What the pool knows of its launcher: its pid (the leader of its session) and whether it has ended."""

    pid: int

    def ended(self) -> bool: ...
    def wait_ended(self, timeout: float) -> bool: ...


class StartedLauncher:
    """A launcher started by this process (a child of ours)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pid = proc.pid

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def wait_ended(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


@dataclass
class Spawned:
    """The launcher's process, each rank's pipes, the launcher's status pipe, and the sandbox around them."""

    proc: LauncherProcess
    ranks: list[RankPipes]
    status_fd: int
    policy: SandboxPolicy | None = None
    cgroup: MemoryCgroup | None = None


def sandbox_for(role: str, wanted: bool) -> SandboxInfo:
    """The sandbox a pool gets: none for a trusted pool or where asked (Nsight Compute needs the GPU's counters,
    which a user namespace cannot reach), else the best this machine can make."""
    if role != "candidate":
        return SandboxInfo("none", reason="trusted pool")
    if not wanted:
        return SandboxInfo("none", reason="asked to run unsandboxed (Nsight Compute profiling)")
    return probe()


def worker_env(device: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    keep_inductor_cache_here()
    env = dict(os.environ)
    env.update(SAFE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


def placement(settings: PoolSettings) -> tuple[str | None, list[int]]:
    """(CUDA_VISIBLE_DEVICES for the pool, each rank's device index under it). Physical GPUs one per
    rank (`gpus`, which may repeat when ranks share GPUs), or the visible ones in order."""
    if settings.device != "cuda":
        return None, []
    per_rank = settings.gpus
    if per_rank is None:
        if settings.ranks_per_gpu <= 1:
            return None, []  # rank r uses cuda:r (or r modulo the visible GPUs)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            ids = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        else:
            import torch  # deferred: only a pool whose ranks share GPUs counts them here

            ids = list(range(torch.cuda.device_count()))
        per_rank = layout.rank_gpus(settings.world_size, settings.ranks_per_gpu, ids)
    return layout.visible_devices(list(per_rank))


def spawn(settings: PoolSettings, folder: Path, scratch: Path, marker: str) -> Spawned:
    """Start the launcher and its W workers (sandboxed for a candidate pool); the pipes' child ends are closed
    here once the launcher holds them. `marker`: NAME=value in every rank's environment (teardown finds by it
    what left the ranks' sessions)."""
    child_fds: list[int] = []
    entries = []
    ranks: list[RankPipes] = []
    visible_gpus, device_index = placement(settings)
    for rank in range(settings.world_size):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        ev_r, ev_w = os.pipe()
        log_r, log_w = os.pipe()
        os.set_blocking(ev_r, False)
        os.set_blocking(log_r, False)
        child_fds += [req_r, rep_w, ev_w, log_w]
        entries.append({"rank": rank, "request_fd": req_r, "reply_fd": rep_w, "events_fd": ev_w,
                        "log_fd": log_w, "prefix": settings.rank_prefix.get(rank, []),
                        "args": ["--device-index", str(device_index[rank])] if device_index else []})
        ranks.append(RankPipes(rank, Connection(req_w, readable=False), Connection(rep_r, writable=False), ev_r, log_r))
    status_r, status_w = os.pipe()
    os.set_blocking(status_r, False)
    child_fds.append(status_w)
    # CPU ranks fork from a launcher that imported the worker once (harness.rank.launcher); GPU ranks are started
    # as interpreters of their own, as they were measured on the GPU machines.
    spec = {"ranks": entries, "status_fd": status_w, "limits": settings.limits, "fork": settings.device == "cpu",
            "worker_args": ["--world-size", str(settings.world_size), "--device", settings.device,
                            "--init-file", str(scratch / "rendezvous"), "--role", settings.role,
                            *(["--emulate"] if settings.ranks_per_gpu > 1 else [])]}
    command = [sys.executable, "-m", "harness.rank.launcher", json.dumps(spec)]
    env = worker_env(settings.device, settings.extra_env)
    env[leftovers.POOL_MARKER] = marker.split("=", 1)[1]
    if visible_gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_gpus
    policy, cgroup = None, None
    if settings.role == "candidate":
        env = clean_environment(env, scratch)
        if settings.sandboxed:
            if settings.extensions is not None:
                env["TORCH_EXTENSIONS_DIR"] = EXT_MOUNT
            policy = SandboxPolicy(scratch=scratch, extensions=settings.extensions, hide=(cache_root(),),
                                   gpus=settings.device == "cuda", visible=settings.visible,
                                   limits=settings.sandbox_limits, info=settings.sandbox)
            command = policy.bwrap_command(command, REPO_ROOT)
            cgroup = MemoryCgroup.create(folder.name, settings.sandbox_limits.memory_bytes)
            if cgroup is not None:
                command = cgroup.join_command(command)
        elif settings.extensions is not None:
            env["TORCH_EXTENSIONS_DIR"] = str(settings.extensions)
    try:
        with open(folder / "sandbox.log", "wb") as sandbox_log:
            proc: LauncherProcess | None = None
            if settings.role == "trusted" and spec["fork"] and not settings.rank_prefix:
                # A trusted CPU pool's launcher forks from this process's server (harness.launch.zygote), which
                # imported the worker once; where it cannot, the launcher is started as below.
                proc = zygote.fork_launcher(spec, env, child_fds, sandbox_log.fileno())
            if proc is None:
                proc = StartedLauncher(subprocess.Popen(
                    command, pass_fds=child_fds, stdin=subprocess.DEVNULL, stdout=sandbox_log,
                    stderr=subprocess.STDOUT, env=env, cwd=str(REPO_ROOT), start_new_session=True))
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        for fd in (*child_fds, status_r):
            os.close(fd)
        for r in ranks:
            r.requests.close()
            r.replies.close()
            os.close(r.events_fd)
            os.close(r.log_fd)
        raise
    for fd in child_fds:
        os.close(fd)
    return Spawned(proc, ranks, status_r, policy, cgroup)


def find_host_pids(spawned: Spawned, sandboxed: bool) -> None:
    """Map each rank's own pid (as it sees it, inside the sandbox's PID namespace) to the host's."""
    if not sandboxed:
        for r in spawned.ranks:
            r.host_pid = r.inner_pid
        return
    wanted = {r.inner_pid: r for r in spawned.ranks}
    stack = [spawned.proc.pid]
    while stack:
        pid = stack.pop()
        chain = leftovers.inner_pids(pid)
        if len(chain) > 1 and chain[-1] in wanted:
            wanted[chain[-1]].host_pid = pid
        stack.extend(children(pid))
