"""The reply protocol between the pool and its ranks, as data: each rank's pipes, its signed replies read
frame by frame, its output and event pipes drained while the pool waits.

Replies after the "seal" request are JSON with an HMAC over the request's nonce and the body
(harness.common.channel); nothing a rank writes after that point is unpickled. A rank runs hostile code, so a
reply is a claim: the judge (harness.judge) decides from the data in it, never from a verdict it states.
"""

from __future__ import annotations

import os
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from harness.common import channel

LOG_TAIL = 200_000  # bytes of each rank's output kept


@dataclass
class RankPipes:
    """One rank as the pool sees it: its pipes, what it wrote, what its launcher said of it."""

    rank: int
    requests: Connection
    replies: Connection
    events_fd: int
    log_fd: int
    log: bytearray = field(default_factory=bytearray)
    log_bytes: int = 0
    events: Counter[str] = field(default_factory=Counter)
    events_buffer: bytes = b""
    returncode: int | None = None
    inner_pid: int | None = None
    host_pid: int | None = None
    building_since: float | None = None  # a native build inside a call began (monotonic), not yet ended
    build_seconds: float = 0.0


def parse_frame(buf: bytearray, key: bytes, nonce: str, rank: int) -> dict[str, Any] | None:
    """One signed reply from a rank's buffered bytes (consumed), a tampering reply, or None for 'not yet'."""
    if len(buf) < 4:
        return None
    (size,) = struct.unpack("!i", bytes(buf[:4]))  # multiprocessing.Connection's frame header
    if size < 0 or size > channel.MAX_REPLY_BYTES:
        buf.clear()
        return channel.forged_reply(rank, f"a reply announced {size} bytes")
    if len(buf) < 4 + size:
        return None
    frame = bytes(buf[4:4 + size])
    del buf[:4 + size]
    reply = channel.open_sealed(frame, key, nonce)
    if reply is None or reply.get("rank") != rank:
        return channel.forged_reply(rank, "a reply failed authentication")
    return reply


def drain(r: RankPipes, kind: str, wrote: Callable[[RankPipes], None]) -> None:
    """Read what a rank's log or events pipe holds now. Logs: keep the tail, count every byte, and after
    every chunk call `wrote(r)` (the pool fails past its cap). Events: one line per collective, counted by
    name; a native build's start and end are timed."""
    fd = r.log_fd if kind == "log" else r.events_fd
    while fd >= 0:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            # The writer is gone; stop watching this descriptor.
            if kind == "log":
                os.close(fd)
                r.log_fd = -1 - r.rank  # negative: never polled again, never a real descriptor
            else:
                os.close(fd)
                r.events_fd = -101 - r.rank
            return
        if kind == "log":
            r.log_bytes += len(chunk)
            r.log += chunk
            if len(r.log) > LOG_TAIL:
                del r.log[:len(r.log) - LOG_TAIL]
            wrote(r)  # the pool's cap on what all its ranks wrote: it raises past it
        else:
            data = r.events_buffer + chunk
            *lines, r.events_buffer = data.split(b"\n")
            for line in lines:
                name = line.decode(errors="replace").strip()[:64]
                if name == "build_start":
                    r.building_since = time.monotonic()
                elif name == "build_end":
                    if r.building_since is not None:
                        r.build_seconds += time.monotonic() - r.building_since
                    r.building_since = None
                elif name:
                    r.events[name] += 1
            if len(r.events_buffer) > 4096:
                r.events_buffer = b""
