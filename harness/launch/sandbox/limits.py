"""The resource limits of one sandbox, from the per-rank settings in harness.common.integrity.IntegrityConfig
(`rank_memory_bytes`, `rank_shm_bytes`, `rank_tmp_bytes`, `rank_scratch_bytes`, `rank_scratch_files`): a
sandbox holds W ranks and gets W times each. How they are enforced: harness.launch.sandbox.memory (a cgroup, or
a watchdog on memory) and harness.launch.sandbox.watch (scratch bytes and files, full tmpfs); /tmp and /dev/shm
are tmpfs mounts of their size (harness.launch.sandbox.mounts).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.common.integrity import IntegrityConfig

# The settings' names, for messages: a candidate that goes over is told which setting it went over.
SETTING = {"memory": "rank_memory_bytes", "shm": "rank_shm_bytes", "tmp": "rank_tmp_bytes",
           "scratch": "rank_scratch_bytes", "files": "rank_scratch_files"}


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


@dataclass(frozen=True)
class SandboxLimits:
    ranks: int
    memory_bytes: int
    shm_bytes: int
    tmp_bytes: int
    scratch_bytes: int
    scratch_files: int

    @classmethod
    def for_ranks(cls, ranks: int, checks: IntegrityConfig | None = None) -> SandboxLimits:
        c = checks or IntegrityConfig()
        return cls(ranks=ranks, memory_bytes=ranks * c.rank_memory_bytes, shm_bytes=ranks * c.rank_shm_bytes,
                   tmp_bytes=ranks * c.rank_tmp_bytes, scratch_bytes=ranks * c.rank_scratch_bytes,
                   scratch_files=ranks * c.rank_scratch_files)

    def describe(self, what: str) -> str:
        """'W x per-rank setting = total' for a message, e.g. the memory limit."""
        total = {"memory": self.memory_bytes, "shm": self.shm_bytes, "tmp": self.tmp_bytes,
                 "scratch": self.scratch_bytes, "files": self.scratch_files}[what]
        amount = str(total) if what == "files" else gib(total)
        return f"{amount} ({self.ranks} x integrity setting {SETTING[what]})"

    def record(self) -> dict[str, int]:
        return {"memory_bytes": self.memory_bytes, "shm_bytes": self.shm_bytes, "tmp_bytes": self.tmp_bytes,
                "scratch_bytes": self.scratch_bytes, "scratch_files": self.scratch_files}
