"""The resource limits of every sandbox, defined here once: a candidate's ranks (an evaluation's, a profile's
timeline), the compile stage, and the bash condition's shell. Standard library only (and the plain
IntegrityConfig dataclass).

- Ranks: a budget per rank derived from the evaluation's problem and shape (`RankBudget`: the bytes of one
  rank's inputs and outputs times a stated factor, plus a fixed base), capped by the per-rank integrity
  settings (`rank_memory_bytes`, `rank_shm_bytes`, `rank_tmp_bytes`, `rank_scratch_bytes`,
  `rank_scratch_files`: ceilings, no longer the figures themselves) and by the host's memory; a sandbox
  holds W ranks and gets W times each. Where the inputs' size is unknown the settings alone apply, capped
  by the host. A problem whose reference needs more declares `RANK_BUDGET` (harness.launch.sandbox.budget).
- The shell: `ShellSettings` (defaults below; `PKB_SHELL_<FIELD>` in the harness's environment overrides
  one), for one command of the bash condition.
How they are enforced: harness.launch.sandbox.memory (a cgroup, or a watchdog on memory) and
harness.launch.sandbox.watch (scratch bytes and files, processes, full tmpfs); /tmp and /dev/shm are tmpfs
mounts of their size (harness.launch.sandbox.mounts); the wall by the caller's own time limit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

from harness.common.integrity import IntegrityConfig

# The settings' names, for messages: a candidate that goes over is told which setting it went over.
SETTING = {"memory": "rank_memory_bytes", "shm": "rank_shm_bytes", "tmp": "rank_tmp_bytes",
           "scratch": "rank_scratch_bytes", "files": "rank_scratch_files", "processes": "processes per rank"}
PROCESSES_PER_RANK = 64  # processes a sandbox may hold per rank (compilers included) ...
PROCESSES_SLACK = 8  # ... plus these (the sandbox's init, the launcher)
HOST_RESERVE = 2 << 30  # memory of the host no sandbox may take: the harness, the judge, the system


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def size(n: int) -> str:
    """Bytes in the unit that reads best (KiB, MiB, GiB)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def meminfo(field: str = "MemTotal", path: Path = Path("/proc/meminfo")) -> int | None:
    """A /proc/meminfo figure in bytes (MemTotal, MemAvailable), or None where it cannot be read."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == field:
                return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_cap() -> int | None:
    """The most memory one sandbox may be given on this host: its total memory less HOST_RESERVE."""
    total = meminfo("MemTotal")
    return None if total is None else max(256 << 20, total - HOST_RESERVE)


@dataclass(frozen=True)
class RankBudget:
    """One rank's budget: factor x `io_bytes` (one rank's inputs and outputs) + base, for each limit. The
    factors: memory holds the inputs, the timing's rotated copies and the outputs several times over; the
    CPU kernels map exchange buffers of 2 W times a rank's input in /dev/shm (io counts W outputs, so 2 x io
    covers it); the harness writes each call's inputs into the scratch. The bases: an interpreter with torch
    (a CUDA rank's host side is larger: its context, the driver's pinned buffers), a build's objects."""

    memory_factor: float = 8.0
    memory_base: int = 3 << 29  # 1.5 GiB: a CPU rank with torch, gloo and a lazy build's compiler
    cuda_memory_base: int = 4 << 30
    shm_factor: float = 2.0
    shm_base: int = 64 << 20
    tmp_factor: float = 1.0
    tmp_base: int = 64 << 20
    scratch_factor: float = 16.0
    scratch_base: int = 512 << 20

    def per_rank(self, io_bytes: int, device: str) -> dict[str, int]:
        base = self.cuda_memory_base if device == "cuda" else self.memory_base
        return {"memory": base + int(self.memory_factor * io_bytes),
                "shm": self.shm_base + int(self.shm_factor * io_bytes),
                "tmp": self.tmp_base + int(self.tmp_factor * io_bytes),
                "scratch": self.scratch_base + int(self.scratch_factor * io_bytes)}


DEFAULT_BUDGET = RankBudget()


@dataclass(frozen=True)
class ShellSettings:
    """The bash condition's shell, one command: the same kinds of limit as a rank's sandbox."""

    memory_bytes: int = 4 << 30  # a compiler with torch's headers takes up to 2 GiB
    shm_bytes: int = 256 << 20
    tmp_bytes: int = 1 << 30
    scratch_bytes: int = 4 << 30  # the whole scratch folder, earlier commands' files included
    scratch_files: int = 50_000
    processes: int = 256

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None) -> ShellSettings:
        """The defaults, each overridden by PKB_SHELL_<FIELD> (e.g. PKB_SHELL_MEMORY_BYTES=1073741824)."""
        env = dict(os.environ) if env is None else env
        given = {}
        for f in fields(cls):
            text = env.get(f"PKB_SHELL_{f.name.upper()}")
            if text is not None:
                value = int(text)
                if value <= 0:
                    raise ValueError(f"PKB_SHELL_{f.name.upper()} must be positive, got {text!r}")
                given[f.name] = value
        return cls(**given)


@dataclass(frozen=True)
class SandboxLimits:
    ranks: int
    memory_bytes: int
    shm_bytes: int
    tmp_bytes: int
    scratch_bytes: int
    scratch_files: int
    processes: int = PROCESSES_PER_RANK + PROCESSES_SLACK
    wall_s: float | None = None  # enforced by the caller's time limit; here to be described and recorded
    basis: str = ""  # how the figures were chosen (the budget's inputs), for messages and the record
    names: tuple[tuple[str, str], ...] = tuple(SETTING.items())  # the setting behind each figure

    @classmethod
    def for_ranks(cls, ranks: int, checks: IntegrityConfig | None = None, *, io_bytes: int | None = None,
                  device: str = "cpu", budget: RankBudget | None = None,
                  floor: dict[str, int] | None = None) -> SandboxLimits:
        """W ranks' limits: the per-rank budget for `io_bytes` (None: the settings alone), raised to `floor`
        (a problem's RANK_BUDGET), capped by the settings and by the host (host_cap)."""
        c = checks or IntegrityConfig()
        ceiling = {"memory": c.rank_memory_bytes, "shm": c.rank_shm_bytes, "tmp": c.rank_tmp_bytes,
                   "scratch": c.rank_scratch_bytes}
        each = dict(ceiling)
        basis = f"{ranks} x the integrity settings"
        if io_bytes is not None:
            derived = (budget or DEFAULT_BUDGET).per_rank(io_bytes, device)
            for k, v in (floor or {}).items():
                derived[k] = max(derived[k], v)
            each = {k: min(derived[k], ceiling[k]) for k in ceiling}
            basis = (f"{ranks} x a rank's budget for {size(io_bytes)} of inputs and outputs "
                     f"(harness.launch.sandbox.limits.RankBudget), at most the integrity settings")
        total = {k: ranks * v for k, v in each.items()}
        host = host_cap()
        if host is not None and total["memory"] > host:
            total["memory"] = host
            basis += f", memory capped by the host ({gib(host)})"
        # tmpfs pages are memory: neither tmpfs may be larger than the memory limit
        total["shm"], total["tmp"] = min(total["shm"], total["memory"]), min(total["tmp"], total["memory"])
        return cls(ranks=ranks, memory_bytes=total["memory"], shm_bytes=total["shm"], tmp_bytes=total["tmp"],
                   scratch_bytes=total["scratch"], scratch_files=ranks * c.rank_scratch_files,
                   processes=PROCESSES_PER_RANK * ranks + PROCESSES_SLACK, basis=basis)

    @classmethod
    def for_shell(cls, settings: ShellSettings | None = None, wall_s: float | None = None) -> SandboxLimits:
        s = settings or ShellSettings.from_environment()
        host = host_cap()
        memory = min(s.memory_bytes, host) if host is not None else s.memory_bytes
        return cls(ranks=1, memory_bytes=memory, shm_bytes=min(s.shm_bytes, memory), tmp_bytes=min(s.tmp_bytes, memory),
                   scratch_bytes=s.scratch_bytes, scratch_files=s.scratch_files, processes=s.processes, wall_s=wall_s,
                   names=tuple((k, f"PKB_SHELL_{n.upper()}") for k, n in (
                       ("memory", "memory_bytes"), ("shm", "shm_bytes"), ("tmp", "tmp_bytes"),
                       ("scratch", "scratch_bytes"), ("files", "scratch_files"), ("processes", "processes"))))

    def amount(self, what: str) -> int:
        return {"memory": self.memory_bytes, "shm": self.shm_bytes, "tmp": self.tmp_bytes,
                "scratch": self.scratch_bytes, "files": self.scratch_files, "processes": self.processes}[what]

    def describe(self, what: str) -> str:
        """The limit, the setting behind it and how it was chosen, for a message, e.g. the memory limit."""
        total = self.amount(what)
        amount = str(total) if what in ("files", "processes") else gib(total)
        basis = f"; {self.basis}" if self.basis else ""
        return f"{amount} (setting {dict(self.names)[what]}{basis})"

    def summary(self) -> str:
        """One line of every limit, for a tool's description to the model."""
        parts = [f"memory {gib(self.memory_bytes)} (/tmp and /dev/shm included)", f"/tmp {gib(self.tmp_bytes)}",
                 f"/dev/shm {gib(self.shm_bytes)}", f"scratch folder {gib(self.scratch_bytes)} and "
                 f"{self.scratch_files} files", f"{self.processes} processes"]
        if self.wall_s is not None:
            parts.append(f"{self.wall_s:.0f} s")
        return ", ".join(parts)

    def with_wall(self, wall_s: float) -> SandboxLimits:
        return replace(self, wall_s=wall_s)

    def record(self) -> dict[str, object]:
        out: dict[str, object] = {"memory_bytes": self.memory_bytes, "shm_bytes": self.shm_bytes,
                                  "tmp_bytes": self.tmp_bytes, "scratch_bytes": self.scratch_bytes,
                                  "scratch_files": self.scratch_files, "processes": self.processes}
        if self.wall_s is not None:
            out["wall_s"] = self.wall_s
        if self.basis:
            out["basis"] = self.basis
        return out

