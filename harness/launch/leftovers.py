"""What a killed harness leaves behind, found and removed: the folders of its pools and evaluations, and the
processes its ranks started. /proc tells a live owner from a dead one (and from a recycled pid).

A pool removes its folder when closed or killed, but a harness killed with SIGKILL (a `pkb run` stopped
mid-evaluation) cannot: its ranks die of a broken pipe and the folder stays. Every pool notes its
owner (pid and process start time, so a recycled pid is not mistaken for it) and, on start, removes
the folders whose owner is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from harness.common import channel, hostile_files
from harness.launch.sandbox.memory import sweep_orphans
from harness.launch.sandbox.private import OWNER_FILE, private_root_path

# A pool removes its folder when closed or killed, but a harness killed with SIGKILL (a `pkb run` stopped
# mid-evaluation) cannot: its ranks die of a broken pipe and the folder stays. Every pool notes its
# owner (pid and process start time, so a recycled pid is not mistaken for it) and, on start, removes
# the folders whose owner is gone.
FOLDER_PREFIX = "pkb-pool-"
# Every rank of a pool, and so everything a rank starts, carries POOL_MARKER=<random hex> in its
# environment; the owner file keeps it, so what outlived a killed harness can be found too.
POOL_MARKER = "PKB_POOL"
MARKER_LINE = re.compile(rf"{POOL_MARKER}=[0-9a-f]{{24}}")
LEGACY_AGE_S = 3600.0  # a folder without an owner file (an older version's) counts as stale after this


def process_identity(pid: int) -> str | None:
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


def owner_alive(identity: str) -> bool:
    fields = identity.split()
    if not fields or not fields[0].isdigit():
        return False
    return process_identity(int(fields[0])) == identity


def reap_stale_folders(root: Path | None = None, now: float | None = None) -> list[Path]:
    """Remove the harness's folders under `root` (default: every folder of the private root, and pool
    folders in TMPDIR, where older versions kept them) whose owning harness process is gone, and end the
    processes that a pool's ranks left behind."""
    removed = []
    now = time.time() if now is None else now
    if root is None:
        sweep_orphans()  # the memory cgroups of sandboxes whose harness was killed
    # In the private root every folder is the harness's (evaluations' too: a killed one leaves its copy of
    # the candidate and the reference's outputs); elsewhere only pool folders are.
    private = private_root_path()
    roots = [root] if root is not None else [private, Path(tempfile.gettempdir())]
    for folder in [f for r in roots for f in r.glob("*" if r == private else f"{FOLDER_PREFIX}*")]:
        marker = None
        try:
            # Not followed, never blocking, bounded: without a sandbox a candidate could have planted it.
            owner = hostile_files.read_bytes(folder / OWNER_FILE, 4096).decode(errors="replace")
            identity, _, rest = owner.partition("\n")
            identity, rest = identity.strip(), rest.strip()
            # Only a well-formed marker: the folder is writable by candidates, and a line such as
            # PATH=/usr/bin would otherwise name every process of this user.
            marker = rest if MARKER_LINE.fullmatch(rest) else None
        except (hostile_files.HostileFile, FileNotFoundError):
            try:
                stale = now - folder.stat().st_mtime > LEGACY_AGE_S  # young: a pool still writing its owner
            except OSError:
                continue
        except OSError:
            continue
        else:
            stale = bool(identity) and not owner_alive(identity)
        if stale and folder.is_dir():
            if marker:
                channel.kill_marked(marker)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    if root is None:
        with contextlib.suppress(OSError):  # not empty: live evaluations' folders are in it
            private.rmdir()
    return removed


def inner_pids(host_pid: int) -> list[int]:
    """The NSpid chain of a process: its pid as seen from each nested PID namespace, outermost first."""
    try:
        for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []
