"""Which PKB solution files use NVLink multicast, which must never run on the machines this project uses.

A program that creates multicast objects (cuMulticastCreate, NVLS, PTX `multimem.*`) can put a shared
host's GPUs out of service, so such files are skipped before anything runs them, with the line that gave
them away. The test is textual and deliberately broad: a file that only mentions multicast in a comment or
in a fallback it never takes is skipped too (read, never imported: the files are candidate code).

Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

# The words that give multicast away, as the device machines' notes name them (case-insensitive).
MULTICAST_TERMS = ("multicast", "multimem", "nvls", "cuMulticast")
_PATTERN = re.compile("|".join(re.escape(t) for t in MULTICAST_TERMS), re.IGNORECASE)


def multicast_reason(source: str | Path) -> str | None:
    """One line saying why a file (a path, or its text) must not run here, or None when it mentions none
    of MULTICAST_TERMS."""
    text = Path(source).read_text(errors="replace") if isinstance(source, Path) else source
    for number, line in enumerate(text.splitlines(), 1):
        m = _PATTERN.search(line)
        if m:
            snippet = line[max(0, m.start() - 30):m.end() + 50].strip()
            return (f"uses NVLink multicast ('{m.group(0)}' at line {number}: {snippet!r}); "
                    "multicast must not run on these machines")
    return None


def split_multicast(paths: Iterable[Path]) -> tuple[list[Path], dict[Path, str]]:
    """(files that may run, {file: why it is skipped}) in the order given."""
    runnable: list[Path] = []
    skipped: dict[Path, str] = {}
    for path in paths:
        reason = multicast_reason(Path(path))
        if reason is None:
            runnable.append(Path(path))
        else:
            skipped[Path(path)] = reason
    return runnable, skipped
