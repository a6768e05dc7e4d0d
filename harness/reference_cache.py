"""Reference timings, cached per problem source, shape, world size, device, hardware and timing config.

The reference is timed with exactly the candidate's protocol; caching only saves repeating it.
"""

from __future__ import annotations

import json
import os
import tempfile
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


def store(key: str, stats: TimingStats) -> None:
    """Atomic read-modify-write: a concurrent reader never sees a half-written file."""
    path = cache_file()
    data = _read(path)
    data[key] = stats.model_dump()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ref-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
