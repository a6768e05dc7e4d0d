"""Where the trusted side keeps an evaluation's files: one folder per evaluation or pool under a private
root, `<TMPDIR>/pkb-<uid>`, that only the harness's user may enter (mode 0700, checked on every use).

No sandbox binds the root or anything in it, except what one sandbox must reach: its own scratch folder
(writable) and the evaluation's read-only copy of the candidate. So reference outputs, copied inputs and
cache keys stay out of every rank's sight whatever TMPDIR is: inside /tmp (the sandbox's /tmp is its own),
elsewhere, or the very folder the candidate file was saved in (the candidate is copied; its folder is
never bound). When the harness runs as root, ranks also run as an unprivileged uid on the host
(harness.launch.sandbox.policy), for whom the root is closed. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from harness.launch.sandbox.namespace import start_time

ROOT_PREFIX = "pkb-"
# Every folder made here names its maker ("pid starttime"): harness.launch.leftovers.reap_stale_folders removes
# those whose maker was killed before it could (a `pkb run` stopped with SIGKILL, a Ray worker killed
# mid-evaluation).
OWNER_FILE = "owner"


class PrivateRootUnsafe(RuntimeError):
    """The private root exists but is not a folder of this user that only this user may enter."""


def private_root_path() -> Path:
    """Where the private root is (it may not exist)."""
    return Path(tempfile.gettempdir()) / f"{ROOT_PREFIX}{os.geteuid()}"


def private_root() -> Path:
    """`<TMPDIR>/pkb-<euid>`, created 0700 if missing. A root another user made, a link, or one that others
    may enter (a shared /tmp where someone planted it first) is refused rather than used."""
    root = private_root_path()
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise PrivateRootUnsafe(f"{root} must be a folder owned by uid {os.geteuid()} with mode 0700 "
                                f"(found mode {stat.filemode(info.st_mode)}, owner {info.st_uid}); remove it")
    return root


def private_folder(prefix: str) -> Path:
    """A new folder (0700) under the private root. Retried when a concurrent clean-up removed the empty root
    between its creation and this folder's."""
    for _ in range(5):
        try:
            folder = Path(tempfile.mkdtemp(prefix=prefix, dir=private_root()))
        except FileNotFoundError:
            continue
        (folder / OWNER_FILE).write_text(f"{os.getpid()} {start_time(os.getpid()) or ''}".strip() + "\n")
        return folder
    raise PrivateRootUnsafe("the private root kept disappearing while a folder was made in it")


def remove_private(folder: Path) -> None:
    """Remove a folder made by private_folder, and the root with it once nothing else is in it (so an
    evaluation leaves nothing behind in TMPDIR)."""
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: another evaluation's folder is in it
        folder.parent.rmdir()


def stage_file(source: bytes, name: str, folder: Path) -> Path:
    """`source` written as `folder/name` (folder 0755, file 0644, neither writable by a sandbox): the copy a
    sandbox imports, so the file's own folder never has to be bound."""
    folder.mkdir(mode=0o755, exist_ok=True)
    os.chmod(folder, 0o755)
    path = folder / Path(name).name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(source)
    return path


def hand_over(path: Path, uid: int) -> None:
    """`path` and everything in it made `uid`'s (and its group's), links not followed: a folder the sandbox's
    ranks write into when they run as that uid on the host."""
    os.chown(path, uid, uid, follow_symlinks=False)
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)
