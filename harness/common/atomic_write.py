"""The project's one atomic writer, and the rule for writing a path a user named (`--out`).

`replace_atomically` writes a fresh random name beside the target (O_EXCL | O_NOFOLLOW: nothing there is
written through), flushes it to disk and renames it over the target: a reader sees the old file or the new
one, never half of one, whatever moment the writer dies at; whatever stood at the name (a link, a FIFO) is
replaced, never followed. Every file the project writes atomically goes through it (run records, the
harness's cache, reports).

`write_out` is for a path a user gave on the command line, where replacing is right for regular files
only: `pkb report --out /dev/null` run as root replaced /dev/null with a regular file, and an `--out` that
is a link replaced the link instead of writing its target. The rule, stated in every refusal:
- a regular file (through any links: the link's target is written, the link stays) or a new name is
  replaced atomically, keeping the old file's permission bits (and, as root, its owner);
- the null device, this process's own stdout or stderr (`/dev/stdout`, `/dev/stderr`, a terminal that is
  one of them) and a pipe or FIFO with a reader are written through;
- anything else (another device, a folder, a socket, a FIFO nobody reads) is refused, and nothing under
  /dev, /proc or /sys is ever created or replaced.
Standard library only.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_NOCTTY | _O_CLOEXEC
NULL_DEVICE = os.makedev(1, 3)  # Linux's /dev/null, wherever its node lies
SYSTEM_TREES = ("/dev", "/proc", "/sys")  # never a place to create or replace a file in
RULE = ("--out writes a regular file (replaced atomically) or a new one, or writes through the null device, "
        "this command's stdout or stderr, or a pipe or FIFO someone reads; nothing else")


class OutRefused(OSError):
    """A path `write_out` will not write; its strerror is one line naming the path and the rule."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EINVAL, message)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


# The names _temporary_name gives: what a writer killed between its write and its rename leaves behind.
_LEFTOVER = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")


def replace_atomically(path: Path, data: bytes, mode: int = 0o666, *, owner: tuple[int, int] | None = None) -> None:
    """Write `data` to a new random name beside `path` (created with `mode`, less the umask; `owner`
    (uid, gid) set where given), flush it to disk, then rename it over `path`."""
    path = Path(path)
    tmp = _temporary_name(path)
    fd = os.open(tmp, _NEW_FLAGS, mode)
    try:
        try:
            if owner is not None:
                os.fchown(fd, *owner)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove_leftovers(folder: Path) -> list[Path]:
    """Remove, in `folder` and below, the temporary files of writers killed between their write and their rename
    (a `pkb run` stopped with SIGKILL): regular files named as replace_atomically names them, no link followed.
    Only for a folder no writer is using (a resumed sample's, before it runs again). Returns what was removed."""
    removed = []
    for top, _, files in os.walk(folder):  # os.walk does not descend into links to folders
        for name in files:
            path = Path(top) / name
            if _LEFTOVER.fullmatch(name) and stat.S_ISREG(os.lstat(path).st_mode):
                path.unlink()
                removed.append(path)
    return removed


def _in_system_tree(path: str) -> bool:
    return any(path == top or path.startswith(top + "/") for top in SYSTEM_TREES)


def _own_stream(info: os.stat_result) -> int | None:
    """1 or 2 where `info` is the file this process's stdout or stderr writes to; None otherwise."""
    for fd in (1, 2):
        try:
            mine = os.fstat(fd)
        except OSError:
            continue
        if (mine.st_dev, mine.st_ino) == (info.st_dev, info.st_ino):
            return fd
    return None


def _kind(mode: int) -> str:
    return ("a folder" if stat.S_ISDIR(mode) else "a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a FIFO" if stat.S_ISFIFO(mode) else "a special file")


def _write_through(path: Path, data: bytes, flags: int) -> None:
    fd = os.open(path, os.O_WRONLY | _O_NOCTTY | _O_CLOEXEC | flags)
    try:
        os.set_blocking(fd, True)
        _write_all(fd, data)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class OutPlan:
    """How write_out will write a path: "replace" `target` (with `mode` and `owner`), or write "through"
    `target` (`flags` to open it with), or to this process's own `stream` (1 or 2)."""

    how: str
    target: Path
    mode: int = 0o666
    owner: tuple[int, int] | None = None
    flags: int = 0
    stream: int = 0


def check_out(path: Path | str) -> OutPlan:
    """How write_out would write `path`, decided without writing: OutRefused for what the rule refuses. A
    command calls it before its work, so that a bad --out is said at once."""
    path = Path(path)
    try:
        info = os.stat(path)  # through links: what the user's path names
    except FileNotFoundError:
        target = Path(os.path.realpath(path))  # a dangling link: its target is created
        if _in_system_tree(str(target)):
            raise OutRefused(f"{path}: nothing is created under {', '.join(SYSTEM_TREES)}; {RULE}") from None
        return OutPlan("replace", target)
    stream = _own_stream(info)
    if stream is not None:  # /dev/stdout and the like: whatever stdout is (a terminal, a pipe, a file)
        return OutPlan("stream", path, stream=stream)
    if stat.S_ISREG(info.st_mode):
        target = Path(os.path.realpath(path))
        if _in_system_tree(str(target)):
            raise OutRefused(f"{path} is a file under {'/'.join(target.parts[:2])}: never replaced; {RULE}")
        owner = (info.st_uid, info.st_gid) if os.geteuid() == 0 else None
        return OutPlan("replace", target, stat.S_IMODE(info.st_mode), owner)
    if stat.S_ISCHR(info.st_mode) and info.st_rdev == NULL_DEVICE:
        return OutPlan("through", path)
    if stat.S_ISFIFO(info.st_mode):
        return OutPlan("through", path, flags=os.O_NONBLOCK)  # nobody reading: ENXIO at once, never a wait
    raise OutRefused(f"{path} is {_kind(info.st_mode)}; {RULE}")


def write_out(path: Path | str, data: bytes) -> None:
    """Write `data` to a path a user named, by the rule in this module's docstring; OutRefused (an OSError
    whose strerror is one line) for what the rule refuses, OSError for what the system refuses."""
    plan = check_out(path)
    if plan.how == "stream":
        (sys.stdout if plan.stream == 1 else sys.stderr).flush()
        _write_all(plan.stream, data)
    elif plan.how == "through":
        try:
            _write_through(plan.target, data, plan.flags)
        except OSError as err:
            if err.errno == errno.ENXIO:
                raise OutRefused(f"{path} is a FIFO nobody reads; {RULE}") from None
            raise
    else:
        plan.target.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(plan.target, data, plan.mode, owner=plan.owner)
