"""The reply channel and process hygiene of a rank pool whose ranks run untrusted code. Parent and worker.

- Replies are JSON with an HMAC-SHA256 over the request's nonce and the body, keyed per rank; the key
  arrives on the rank's private request pipe before any candidate code exists (harness.launch.pool.RankPool
  seals every pool at start), and the parent reads raw bytes with a deadline and never unpickles.
- Killing a rank's process group is not enough to end everything it started: RankPool.kill also
  sweeps each rank's session (kill_session) and then every process carrying the pool's environment
  marker (kill_marked: what called setsid), a compile stopped at its limit has its session swept and
  its build locks removed (harness.compiling.compile), and kill_orphaned_builds ends compilers whose harness
  process died.
- Outputs and inputs travel as files, not on this channel (harness.rank.transport).

tests/exploits/README.md says what this does and does not protect against.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import stat
from pathlib import Path
from typing import Any, Protocol

import torch

from harness.common import failures, hostile_files
from harness.common.integrity import TAMPERING

# -- the reply channel ------------------------------------------------------------------------------
MAC_BYTES = 32
MAX_REPLY_BYTES = 64 << 20


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (torch.dtype, torch.device, Path)):
        return str(value)
    raise TypeError(f"reply field of type {type(value).__name__} is not JSON")


class _Mac(Protocol):
    """What the seal uses of an HMAC object: OpenSSL's (_hashlib.HMAC) and the stdlib's (hmac.HMAC) both fit."""

    def copy(self) -> _Mac: ...
    def update(self, msg: bytes, /) -> None: ...
    def digest(self) -> bytes: ...


def _new_mac(key: bytes) -> _Mac:
    try:  # OpenSSL's HMAC object: a C type the candidate cannot patch (the key is not kept in Python)
        import _hashlib

        return _hashlib.hmac_new(key, digestmod="sha256")
    except (ImportError, AttributeError, ValueError):
        return hmac.new(key, digestmod=hashlib.sha256)


class ReplySealer:
    """Worker side: serializes a reply as JSON and prefixes HMAC-SHA256(key, nonce || body)."""

    def __init__(self, key: bytes) -> None:
        self._mac = _new_mac(key)

    def seal(self, reply: dict[str, Any], nonce: str) -> bytes:
        body = json.dumps(reply, default=_json_default, separators=(",", ":")).encode()
        mac = self._mac.copy()
        mac.update(nonce.encode() + b"\0" + body)
        return mac.digest() + body


def open_sealed(data: bytes, key: bytes, nonce: str) -> dict[str, Any] | None:
    """The reply if its MAC is right for this key and request nonce, else None. Never unpickles."""
    if len(data) < MAC_BYTES:
        return None
    mac, body = data[:MAC_BYTES], data[MAC_BYTES:]
    want = hmac.new(key, nonce.encode() + b"\0" + body, hashlib.sha256).digest()
    if not hmac.compare_digest(mac, want):
        return None
    try:
        reply = json.loads(body)
    except ValueError:
        return None
    return reply if isinstance(reply, dict) else None


def forged_reply(rank: int, why: str) -> dict[str, Any]:
    return {"ok": False, "rank": rank, "verdict": failures.RUNTIME_ERROR, "flags": [TAMPERING],
            "message": f"rank {rank}: {why}: something in the rank process wrote to the harness's reply "
                       f"channel, so nothing it says can be trusted"}


def _live_processes() -> list[tuple[int, int, Path]]:
    """(pid, session id, /proc entry) of every live (non-zombie) process but this one."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                found.append((int(entry.name), int(fields[3]), entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _has_env(entry: Path, assignment: bytes) -> bool:
    """Whether the process started with `NAME=value` in its environment (unreadable: no)."""
    try:
        return assignment in (entry / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _kill(pids: list[int]) -> int:
    killed = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            continue
    return killed


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is `sid`."""
    return [pid for pid, session, _ in _live_processes() if session == sid]


def kill_session(sid: int) -> int:
    """SIGKILL every process of session `sid`; returns how many. Killing a process group is not enough:
    ninja starts every compiler in a group of its own (and any code can call setpgid), but only setsid
    leaves the session, and a process started with start_new_session=True leads its own."""
    return _kill(session_members(sid))


# A process that left its rank's session (setsid) may fork again between two sweeps: sweep until a
# pass finds nothing, at most this many times.
MARKED_SWEEPS = 5


def kill_marked(assignment: str) -> int:
    """SIGKILL every process whose environment holds `assignment` (`NAME=value`, unique to one rank
    pool and inherited by everything its ranks start), wherever it went: this reaches a process that
    called setsid and so left the rank's session. A process started with a scrubbed environment
    still escapes (tests/exploits/README.md)."""
    marker, killed = assignment.encode(), 0
    for _ in range(MARKED_SWEEPS):
        found = _kill([pid for pid, _, entry in _live_processes() if _has_env(entry, marker)])
        if not found:
            break
        killed += found
    return killed


def _leads_live_session(sid: int) -> bool:
    try:
        fields = Path(f"/proc/{sid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[3]) == sid


def kill_orphaned_builds(extensions_dir: Path) -> int:
    """SIGKILL what is left of native builds whose harness-side process is gone: processes whose
    environment names this extensions folder and whose session leader (the precompile process, or a
    rank worker) has exited. A compile killed at its time limit leaves its compiler running when only
    its process group was killed, and so does a harness process killed mid-compile."""
    marker = f"TORCH_EXTENSIONS_DIR={extensions_dir}".encode()
    own_session = os.getsid(0)
    orphans = [pid for pid, sid, entry in _live_processes()
               if sid != own_session and _has_env(entry, marker)
               and not _leads_live_session(sid)]  # else a build or rank still owned by a live harness
    return _kill(orphans)


def remove_build_locks(extensions_dir: Path, since: float) -> list[str]:
    """Delete torch's build locks (`<extension>/lock`) created at or after `since` (a time.time()), for a
    build that was stopped: torch waits forever on a lock whose holder died, so every later build of
    an extension with that name (the next attempt at the same kernel) would time out too. A build of
    the same name started by another evaluation inside that window loses its lock: the price of not
    knowing which process holds which lock."""
    removed: list[str] = []
    # The folder is the build's, written by candidate code: no link in it is followed (a folder linked
    # from it would have a lock of some other build removed).
    try:
        folder = hostile_files.Folder.open(extensions_dir)
    except hostile_files.HostileFile:
        return removed
    with folder:
        for name, kind in folder.entries():
            if kind != "dir":
                continue
            try:
                with folder.sub(name) as build:
                    info = os.stat("lock", dir_fd=build.fd, follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode) and info.st_mtime >= since:
                        os.unlink("lock", dir_fd=build.fd)
                        removed.append(name)
            except (OSError, hostile_files.HostileFile):
                continue
    return removed
