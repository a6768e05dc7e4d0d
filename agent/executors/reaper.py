"""No rank process outlives a Ray worker that died.

Ray kills a dead worker's own process group, but the harness starts every rank in a session of its own (so
that it can kill a rank with everything the candidate spawned): those would survive a worker killed
mid-evaluation, holding their GPUs. While an evaluation runs, `reap_on_death` keeps a watcher beside it:

    python -m agent.executors.reaper PARENT_PID [FOLDER ...]

The watcher, in a session of its own too, notes the parent's children that lead a session. When its stdin
closes without the word "done" (the parent is gone), it kills those groups, as the harness would have, and
removes the folders the dead evaluation left: the ones it was given and each rank group's rendezvous folder
(harness.launch.pool's pkb-pool-*). Standard library only, here and in the packages above it (the watcher starts
in a fraction of a second); Linux /proc (elsewhere it does nothing).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POLL_S = 0.5  # how often the watcher looks at the parent's children
DONE = b"done"  # what the parent writes when the evaluation ended normally
# `python -m` resolves this module from the working directory first: the watcher runs this very checkout's
# code even where another copy of pkb-agent is installed.
CHECKOUT = Path(__file__).resolve().parents[2]


def children(parent: int) -> set[int]:
    """The parent's child processes, from every one of its threads."""
    found: set[int] = set()
    try:
        tids = os.listdir(f"/proc/{parent}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{parent}/task/{tid}/children") as f:
                found.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return found


def leads_session(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[3]) == pid
    except (OSError, ValueError, IndexError):
        return False


def pool_folder(pid: int) -> str | None:
    """The rendezvous folder a rank process names on its command line (harness.launch.pool's pkb-pool-*), if any."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    if "--init-file" in args[:-1]:
        folder = os.path.dirname(args[args.index("--init-file") + 1])
        if os.path.basename(folder).startswith("pkb-pool-"):
            return folder
    return None


def watch(parent: int, folders: list[str]) -> None:
    """Until stdin says "done" (return) or closes (the parent died: reap, then return)."""
    me = os.getpid()
    groups: dict[int, str | None] = {}  # pid of a session-leading child -> its pool folder, if any
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if ready:
            if sys.stdin.buffer.read(len(DONE)) == DONE:
                return
            for pgid, folder in groups.items():
                if leads_session(pgid):
                    try:
                        os.killpg(pgid, signal.SIGKILL)
                    except OSError:
                        pass
                if folder:
                    folders.append(folder)
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)
            return
        groups = {p: groups[p] if p in groups else pool_folder(p)
                  for p in children(parent) if p != me and leads_session(p)}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    watch(int(args[0]), list(args[1:]))
    return 0


@contextmanager
def reap_on_death(*folders: Path) -> Iterator[subprocess.Popen[bytes] | None]:
    """While the block runs, a watcher kills this process's session-leading children if this process dies,
    and removes `folders` and their rendezvous folders."""
    if not Path("/proc/self/task").is_dir():
        yield None
        return
    watcher = subprocess.Popen([sys.executable, "-m", "agent.executors.reaper", str(os.getpid()), *map(str, folders)],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd=CHECKOUT, start_new_session=True)
    try:
        yield watcher
    finally:
        try:
            assert watcher.stdin is not None
            watcher.stdin.write(DONE)
            watcher.stdin.close()
        except OSError:
            pass
        try:
            watcher.wait(timeout=10)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()


if __name__ == "__main__":
    sys.exit(main())
