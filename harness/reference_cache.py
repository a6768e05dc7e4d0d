"""Reference timings, cached per problem source, shape, world size, device, hardware and timing config.

The reference is timed with exactly the candidate's protocol; caching only saves repeating it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.results import TimingStats


def cache_file() -> Path:
    root = Path(os.environ.get("PKB_CACHE_DIR", Path.home() / ".cache" / "pkb-agent"))
    root.mkdir(parents=True, exist_ok=True)
    return root / "reference_timings.json"


def _read(path: Path) -> dict[str, dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def lookup(key: str) -> TimingStats | None:
    entry = _read(cache_file()).get(key)
    if entry is None:
        return None
    try:
        stats = TimingStats.model_validate(entry)
    except ValueError:
        return None
    return stats.model_copy(update={"cached": True})


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside the cache: concurrent evaluations (pkb run --concurrency, several runs on
    one node) each add their entry instead of the last writer dropping the others'."""
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def store(key: str, stats: TimingStats) -> None:
    """Locked read-modify-write, replaced atomically: no entry is lost to a concurrent writer, and a
    reader (which takes no lock) never sees a half-written file."""
    path = cache_file()
    with _locked(path):
        data = _read(path)
        data[key] = stats.model_dump()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ref-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
