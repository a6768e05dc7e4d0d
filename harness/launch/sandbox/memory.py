"""A sandbox's memory: a cgroup whose limit the kernel enforces, where this process can make one, else a
measure read from outside through /proc for harness.launch.sandbox.watch to enforce. Standard library only.

- cgroup v2: a child of this process's cgroup when `memory` is enabled in its cgroup.subtree_control
  (a delegated subtree, or a machine's root cgroup); memory.max, no swap, memory.oom.group (an OOM
  kill ends the whole sandbox), memory.events' oom_kill counter, memory.stat's anon and shmem.
- cgroup v1: a child in the memory hierarchy's folder of this process, where writable (root on a machine
  whose memory controller is on v1); memory.limit_in_bytes (and memsw where swap is accounted),
  memory.oom_control's oom_kill counter, memory.stat's total_rss and total_shmem.
Every page the sandbox touches is charged there, the tmpfs pages of its /tmp and /dev/shm and memfds
included. The sandbox joins the cgroup before bubblewrap runs (`join_command`), so nothing it starts can
be outside it. The kernel's limit sits HEADROOM above the setting: harness.launch.sandbox.watch ends the sandbox
when its anonymous and shared memory (`charged_bytes`) pass the setting, which is quick; at the kernel's
limit the sandbox would first thrash (its code pages evicted and read back) for up to a minute before the
OOM killer acts, so the kernel's limit is only the backstop for a burst faster than the watch.

Without one, `measure` counts the proportional anonymous memory of the sandbox's processes and the larger
of their shared mappings and what the sandbox's /tmp and /dev/shm hold (shared pages counted once). It is
read every quarter second: a burst between two reads can go over before it is seen, and shared memory
that is neither mapped nor in those tmpfs mounts (an unmapped memfd, a tmpfs mounted in a nested user
namespace) is not counted (tests/exploits/README.md).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from harness.launch.sandbox.namespace import start_time

# A sandbox's cgroup is named after the harness process that made it (pid and start time), so the next
# harness can remove those whose maker is gone without touching a live one (`sweep_orphans`).
_NAME = re.compile(r"pkb-(\d+)-(\d+)-[\w.-]+")


def headroom(limit_bytes: int) -> int:
    """How far above the setting the kernel's own limit sits (see the module's docstring)."""
    return max(512 << 20, limit_bytes // 8)


@dataclass
class MemoryCgroup:
    path: Path
    version: int  # 1 or 2

    @classmethod
    def create(cls, tag: str, limit_bytes: int) -> MemoryCgroup | None:
        """A new cgroup for a sandbox (`tag`: its folder's name) whose kernel limit is `limit_bytes` plus
        headroom(limit_bytes), or None where this process cannot make one."""
        limit_bytes += headroom(limit_bytes)
        parent = _own_memory_cgroup()
        if parent is None:
            return None
        folder, version = parent
        group = cls(folder / f"pkb-{os.getpid()}-{start_time(os.getpid()) or 0}-{tag}", version)
        try:
            os.mkdir(group.path)
        except OSError:
            return None
        try:
            if version == 2:
                group._write("memory.max", str(limit_bytes))
                group._write("memory.swap.max", "0", optional=True)
                group._write("memory.oom.group", "1", optional=True)
            else:
                group._write("memory.limit_in_bytes", str(limit_bytes))
                group._write("memory.memsw.limit_in_bytes", str(limit_bytes), optional=True)
        except OSError:
            group.remove()
            return None
        return group

    def _write(self, name: str, value: str, optional: bool = False) -> None:
        try:
            (self.path / name).write_text(value)
        except OSError:
            if not optional:
                raise

    def join_command(self, command: list[str]) -> list[str]:
        """`command` run from a shell that first moves itself into this cgroup (exit 97 if it cannot)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" || exit 97; exec "$@"', str(self.path / "cgroup.procs"), *command]

    def oom_kills(self) -> int:
        """Processes the kernel killed for this cgroup's limit so far."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def charged_bytes(self) -> int | None:
        """Anonymous and shared (tmpfs, memfd) memory charged to the cgroup now: what the setting limits
        (page cache of files it read is reclaimable and not counted)."""
        names = ("anon", "shmem") if self.version == 2 else ("total_rss", "total_shmem")
        try:
            stat = dict(line.split() for line in (self.path / "memory.stat").read_text().splitlines())
            return sum(int(stat.get(n, "0")) for n in names)
        except (OSError, ValueError):
            return None

    def peak_bytes(self) -> int | None:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):
            return None

    def record(self) -> dict[str, object]:
        return {"backend": f"cgroup_v{self.version}", "path": str(self.path)}

    def remove(self, wait_s: float = 30.0) -> list[int]:
        """Kill whatever is still in the cgroup and remove it; returns the pids that had to be killed."""
        killed: list[int] = []
        deadline = time.monotonic() + wait_s
        while True:
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                pids = []
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            try:
                os.rmdir(self.path)
                return killed
            except FileNotFoundError:
                return killed
            except OSError:
                if time.monotonic() > deadline:
                    return killed
                time.sleep(0.05)


def sweep_orphans() -> list[Path]:
    """Remove the sandboxes' cgroups whose harness process is gone (killed before it could remove them),
    ending what is still in them."""
    parent = _own_memory_cgroup()
    removed: list[Path] = []
    if parent is None:
        return removed
    for path in parent[0].glob("pkb-*"):
        match = _NAME.fullmatch(path.name)
        if match is None or start_time(int(match.group(1))) == match.group(2):
            continue  # not one of ours, or its maker is alive
        MemoryCgroup(path, parent[1]).remove(wait_s=5.0)
        removed.append(path)
    return removed


def memory_cgroup_parent() -> Path | None:
    """The folder sandboxes' cgroups are made in, or None where none can be (a test looks there for leftovers)."""
    found = _own_memory_cgroup()
    return found[0] if found else None


def _own_memory_cgroup() -> tuple[Path, int] | None:
    """This process's cgroup folder in a hierarchy with the memory controller that lets it make children
    there: (folder, version), or None."""
    try:
        cgroups = Path("/proc/self/cgroup").read_text().splitlines()
        mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    v1_path = v2_path = None
    for line in cgroups:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in controllers.split(","):
            v1_path = path
        elif hierarchy == "0" and not controllers:
            v2_path = path
    for line in mountinfo:
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        root, mountpoint, fstype, options = fields[3], fields[4], fields[sep + 1], fields[sep + 3].split(",")
        if fstype == "cgroup" and "memory" in options and v1_path is not None:
            folder = _inside(mountpoint, root, v1_path)
            if folder is not None and (folder / "memory.limit_in_bytes").exists() and os.access(folder, os.W_OK):
                return folder, 1
        if fstype == "cgroup2" and v2_path is not None:
            folder = _inside(mountpoint, root, v2_path)
            try:
                enabled = folder is not None and "memory" in (folder / "cgroup.subtree_control").read_text().split()
            except OSError:
                enabled = False
            if folder is not None and enabled and os.access(folder, os.W_OK):
                return folder, 2
    return None


def _inside(mountpoint: str, root: str, path: str) -> Path | None:
    """Where cgroup `path` lies under a mount of the hierarchy whose root is `root`."""
    try:
        relative = os.path.relpath(path, root)
    except ValueError:
        return None
    if relative.startswith(".."):
        return None
    folder = Path(mountpoint) / relative if relative != "." else Path(mountpoint)
    return folder if folder.is_dir() else None


# -- without a cgroup: measured from outside ---------------------------------------------------------
def process_memory(pid: int) -> tuple[int, int]:
    """(anonymous, shared) bytes of a process, proportional (a page shared by n processes counts 1/n):
    smaps_rollup's Pss_Anon and Pss_Shmem, else status's RssAnon and RssShmem."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        fields = {k: v for k, _, v in (line.partition(":") for line in text.splitlines())}
        if "Pss_Anon" in fields:
            return _kib(fields["Pss_Anon"]), _kib(fields.get("Pss_Shmem", "0 kB"))
    except OSError:
        pass
    try:
        fields = dict(line.partition(":")[::2] for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return _kib(fields.get("RssAnon", "0 kB")), _kib(fields.get("RssShmem", "0 kB"))
    except OSError:
        return 0, 0


def _kib(value: str) -> int:
    try:
        return int(value.split()[0]) * 1024
    except (ValueError, IndexError):
        return 0


def tmpfs_used(path: str) -> tuple[int, int] | None:
    """(bytes used, size) of the file system at `path`, or None where it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize


def measure(pids: list[int], tmpfs: list[str]) -> tuple[int, dict[int, int]]:
    """The sandbox's memory (see the module's docstring) and each process's own share."""
    anon = shared = 0
    each = {}
    for pid in pids:
        a, s = process_memory(pid)
        anon, shared = anon + a, shared + s
        each[pid] = a + s
    held = sum(used for used, _ in filter(None, (tmpfs_used(p) for p in tmpfs)))
    return anon + max(shared, held), each
