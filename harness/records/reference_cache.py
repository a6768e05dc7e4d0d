"""Reference timings, cached per problem source, shape, world size, device, hardware and timing config.

The reference is timed with exactly the candidate's protocol; caching only saves repeating it. Only the
trusted side writes the cache (the harness process, after timing the reference in a pool that never
loaded a candidate), and sandboxes cannot see the cache folder at all. Without a sandbox a candidate
runs as the harness's user and could write the file, so every entry carries an HMAC-SHA256 tag under a
key kept beside it (mode 0600): an entry whose tag does not verify for its key is ignored, and the
reference is timed again. (Without a sandbox the candidate can read that key too; with one, it cannot
see the folder.) Every file here is read as hostile (harness.common.hostile_files): a link, a FIFO, a folder or
garbage planted at the cache's, its key's or its lock's path makes a lookup miss and a store skip, never
an evaluation fail or hang.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.common.hostile_files import HostileFile, Missing, read_bytes, read_json, replace_file
from harness.records.cache_dir import cache_root
from harness.records.results import TimingStats

CACHE_LIMIT = 64 << 20  # bytes of the cache file read (an entry is about 1 KB)


def cache_file() -> Path:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return root / "reference_timings.json"


def _parse_key(data: bytes) -> bytes | None:
    text = data.decode("ascii", errors="replace").strip()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        return None
    return bytes.fromhex(text)


def _key() -> bytes:
    """The signing key: read as hostile (a file planted there must not block, crash or be trusted when
    malformed); made on first use; replaced when what stands there is not a key (entries signed with the
    lost key then fail their tags and the reference is timed again)."""
    path = cache_file().with_name("reference_timings.key")
    for _ in range(3):
        try:
            key = _parse_key(read_bytes(path, 256))
        except Missing:
            key = None
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".key-")
            with os.fdopen(fd, "w") as f:  # mkstemp makes it 0600
                f.write(secrets.token_hex(32))
            try:
                os.link(tmp, path)  # first writer wins; a concurrent one reads the winner's key
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
            continue
        except HostileFile:
            key = None
        if key is not None:
            return key
        replace_file(path, secrets.token_hex(32).encode(), mode=0o600)
    raise OSError(f"{path}: no usable signing key could be made")


def _tag(key: str, stats: dict[str, Any]) -> str:
    body = json.dumps({"key": key, "stats": stats}, sort_keys=True).encode()
    return hmac.new(_key(), body, hashlib.sha256).hexdigest()


def _read(path: Path) -> dict[str, object]:
    """The cache's entries, unchecked (lookup checks each); {} when the file is missing, not a plain file, too
    large or not a JSON object."""
    try:
        data = read_json(path, CACHE_LIMIT)
    except (OSError, HostileFile):
        return {}
    return data if isinstance(data, dict) else {}


def lookup(key: str, cv_max: float | None = None) -> TimingStats | None:
    """The cached stats, or None when absent, malformed, not signed by this cache's key, (with `cv_max`) less
    stable than that (an entry cached before stability was required is timed again), or the cache cannot be
    read at all. Never raises: a planted cache must not stop an honest evaluation."""
    entry = _read(cache_file()).get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("stats"), dict):
        return None
    try:
        if not hmac.compare_digest(str(entry.get("tag", "")), _tag(key, entry["stats"])):
            return None
        stats = TimingStats.model_validate(entry["stats"])
    except (OSError, ValueError, TypeError):
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
    one node) each add their entry instead of the last writer dropping the others'. The lock file is opened
    without following a link or blocking on a FIFO; anything but a plain file there (planted) is replaced
    by one first."""
    lock = path.with_name(path.name + ".lock")
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(lock, flags, 0o600)
    except OSError:  # a link (ELOOP) or a folder
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        replace_file(lock, b"", mode=0o600)
        fd = os.open(lock, flags, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{lock.name} is not a plain file")
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def store(key: str, stats: TimingStats) -> bool:
    """Locked read-modify-write, replaced atomically: no entry is lost to a concurrent writer, and a
    reader (which takes no lock) never sees a half-written file. False (nothing stored) where the cache's
    files cannot be used: the evaluation goes on, the reference is timed again next time."""
    try:
        path = cache_file()
        with _locked(path):
            data = _read(path)
            dumped = stats.model_dump()
            data[key] = {"stats": dumped, "tag": _tag(key, dumped)}
            replace_file(path, json.dumps(data, indent=1, sort_keys=True).encode(), mode=0o600)
        return True
    except OSError:
        return False
