"""Reference timings, cached per problem source, shape, world size, device, hardware and timing config.

The reference is timed with exactly the candidate's protocol; caching only saves repeating it. Only the
trusted side writes the cache (the harness process, after timing the reference in a pool that never
loaded a candidate), and sandboxes cannot see the cache folder at all. Without a sandbox a candidate
runs as the harness's user and could write the file, so every entry carries an HMAC-SHA256 tag under a
key kept beside it (mode 0600): an entry whose tag does not verify for its key is ignored, and the
reference is timed again. (Without a sandbox the candidate can read that key too; with one, it cannot
see the folder.)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.cache_dir import cache_root
from harness.results import TimingStats


def cache_file() -> Path:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return root / "reference_timings.json"


def _key() -> bytes:
    path = cache_file().with_name("reference_timings.key")
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".key-")
    with os.fdopen(fd, "w") as f:  # mkstemp makes it 0600
        f.write(secrets.token_hex(32))
    try:
        os.link(tmp, path)  # first writer wins; a concurrent one reads the winner's key
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return bytes.fromhex(path.read_text().strip())


def _tag(key: str, stats: dict[str, Any]) -> str:
    body = json.dumps({"key": key, "stats": stats}, sort_keys=True).encode()
    return hmac.new(_key(), body, hashlib.sha256).hexdigest()


def _read(path: Path) -> dict[str, object]:
    """The cache's entries, unchecked (lookup checks each); {} when the file is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def lookup(key: str, cv_max: float | None = None) -> TimingStats | None:
    """The cached stats, or None when absent, malformed, not signed by this cache's key, or (with `cv_max`)
    less stable than that: an entry cached before stability was required is timed again."""
    entry = _read(cache_file()).get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("stats"), dict):
        return None
    if not hmac.compare_digest(str(entry.get("tag", "")), _tag(key, entry["stats"])):
        return None
    try:
        stats = TimingStats.model_validate(entry["stats"])
    except ValueError:
        return None
    if cv_max is not None and not stable(stats, cv_max):
        return None
    return stats.model_copy(update={"cached": True})


def stable(stats: TimingStats, cv_max: float) -> bool:
    """Whether a timing holds still enough to be reused: its coefficient of variation at most `cv_max`."""
    return stats.cv <= cv_max


def time_until_stable(measure: Callable[[], TimingStats], cv_max: float,
                      attempts: int) -> tuple[TimingStats, dict[str, Any]]:
    """Time with `measure` until a timing is stable, at most `attempts` times; the steadiest timing (lowest CV)
    and the record of what happened (every attempt's CV; whether the one used is stable, the condition for
    caching it)."""
    timings: list[TimingStats] = []
    for _ in range(max(1, attempts)):
        timings.append(measure())
        if stable(timings[-1], cv_max):
            break
    best = min(timings, key=lambda t: t.cv)
    return best, {"cv": best.cv, "cv_max": cv_max, "stable": stable(best, cv_max), "attempts": len(timings),
                  "attempt_cvs": [round(t.cv, 4) for t in timings], "from_cache": False}


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
        dumped = stats.model_dump()
        data[key] = {"stats": dumped, "tag": _tag(key, dumped)}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ref-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
