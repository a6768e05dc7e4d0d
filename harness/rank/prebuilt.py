"""A rank's first call finds the compile stage's split build complete and builds nothing.

harness.compiling.split_build builds a load_inline extension without ninja, so the build folder holds no
.ninja_log or .ninja_deps: torch's own runner, asked again in the rank's first call, would compile every
unit again (a torch-header unit is tens of seconds while the peers wait). The split build writes a stamp
instead (`STAMP`): the sha256 of every file the build depended on (its build.ninja, each unit's source, the
library). `install` makes the rank's ninja runner skip a build whose stamp still matches; anything else
(no stamp, a changed source, a build.ninja another torch wrote) is torch's own runner, as before.

The stamp lives in the candidate's own build folder and only ever decides whether the candidate's process
builds its own extension again: a forged one makes its rank load whatever library is there, which is the
candidate's code either way. It is still read as hostile (no link, bounded, strict JSON): this module runs
before the candidate is imported, and must not hang or blow up on what a previous build left. Standard
library and torch only (a rank process imports little).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.common import hostile_files

STAMP = ".pkb-split-build"
STAMP_CAP = 64 << 10  # bytes of a stamp read
FILES_CAP = 256  # files a stamp may name (an extension has a handful of units)
FILE_CAP = 1 << 30  # bytes of one file hashed (a library is tens of MB)


def _read(path: Path, cap: int) -> bytes | None:
    """The bytes of a regular file (no link followed, never blocking), or None (absent, not one, too big)."""
    try:
        return hostile_files.read_bytes(path, cap)
    except (hostile_files.HostileFile, OSError):
        return None


def _digests(files: list[Path]) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for path in files:
        data = _read(path, FILE_CAP)
        if data is None:
            return None
        out[str(path)] = hashlib.sha256(data).hexdigest()
    return out


def write_stamp(build_directory: Path, files: list[Path]) -> None:
    """After a complete build: what it depended on (`files`: build.ninja first, absolute), hashed."""
    digests = _digests(files)
    stamp = build_directory / STAMP
    if digests is None:  # a file vanished: no stamp, the next call builds
        stamp.unlink(missing_ok=True)
        return
    stamp.write_text(json.dumps({"files": digests}))


def up_to_date(build_directory: Path) -> bool:
    """Whether the stamp names this folder's build.ninja and every file it names still hashes as it says."""
    data = _read(build_directory / STAMP, STAMP_CAP)
    if data is None:
        return False
    try:
        stamp = json.loads(data)
    except ValueError:
        return False
    files = stamp.get("files") if isinstance(stamp, dict) else None
    if (not isinstance(files, dict) or not 0 < len(files) <= FILES_CAP or
            str(build_directory / "build.ninja") not in files or
            not all(isinstance(k, str) and os.path.isabs(k) and isinstance(v, str) for k, v in files.items())):
        return False
    return _digests([Path(k) for k in files]) == files


def install() -> None:
    """In a rank process, before the candidate is imported: torch's ninja runner skips a build whose split
    build stamp matches (the compile stage built it); everything else goes to the runner. Idempotent."""
    from torch.utils import cpp_extension

    original: Callable[..., Any] = cpp_extension._run_ninja_build
    if getattr(original, "__pkb_prebuilt__", False):
        return

    def run_ninja_build(build_directory: str, verbose: bool, error_prefix: str) -> None:
        if up_to_date(Path(build_directory)):
            return
        original(build_directory, verbose, error_prefix)

    run_ninja_build.__pkb_prebuilt__ = True  # type: ignore[attr-defined]  # a marker; a function type has no such field
    cpp_extension._run_ninja_build = run_ninja_build
