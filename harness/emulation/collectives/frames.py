"""The frames the host collectives send between two ranks, and their reading. Rank side; standard library only.

A frame: a fixed header (magic, kind, key, meta length, payload length), a small JSON meta (what the
sender was doing: operation, dtype, element count), the payload. It leaves in one sendmsg straight from
the sender's memory (a small frame is one segment, so one wake-up of the reader; a large payload is never
copied in Python), and is read into a staging buffer, so one recv brings a small frame whole.
"""

from __future__ import annotations

import functools
import json
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAGIC = b"PKBL"
HEADER = struct.Struct("!4sBQIQ")  # magic, kind, key, meta bytes, payload bytes
META_LIMIT = 1 << 16
_STAGING = 1 << 18  # a read's buffer: whole frames up to this size take one recv


@dataclass
class Frame:
    meta: dict[str, Any]
    payload: memoryview


@functools.lru_cache(maxsize=4096)
def _encoded(items: tuple[tuple[str, Any], ...]) -> bytes:
    """A meta's JSON: the same few (operation, dtype, count) recur every call, and json.dumps is a tenth of a
    small send's host time."""
    return json.dumps(dict(items), separators=(",", ":")).encode()


def encode_head(kind: int, key: int, meta: dict[str, Any], payload_bytes: int) -> bytes:
    try:
        encoded = _encoded(tuple(meta.items()))
    except TypeError:  # a value that cannot be a cache key
        encoded = json.dumps(meta, separators=(",", ":")).encode()
    return HEADER.pack(MAGIC, kind, key, len(encoded), payload_bytes) + encoded


class Reader:
    """The receive side of one peer's connection. Reads what is there into a staging buffer, so one recv
    brings a small frame whole (header, meta and payload); a large payload's rest is read straight into
    its own buffer."""

    def __init__(self, peer: int, alloc: Callable[[int], memoryview]) -> None:
        self.peer = peer
        self._alloc = alloc
        self._buf = bytearray(_STAGING)
        self._have = 0  # bytes of the staging buffer not yet parsed
        self._open: tuple[int, int, dict[str, Any], memoryview] | None = None  # a frame whose payload is arriving
        self._filled = 0

    def read(self, sock: socket.socket) -> list[tuple[int, int, Frame]] | None:
        """The frames completed by what the socket has now (one recv, never waiting: nothing there reads as
        no frames); None when the peer closed its end."""
        try:
            return self._read(sock)
        except BlockingIOError:
            return []

    def _read(self, sock: socket.socket) -> list[tuple[int, int, Frame]] | None:
        if self._open is not None:
            kind, key, meta, payload = self._open
            got = sock.recv_into(payload[self._filled:], 0, socket.MSG_DONTWAIT)
            if got == 0:
                return None
            self._filled += got
            if self._filled < payload.nbytes:
                return []
            self._open = None
            return [(kind, key, Frame(meta, payload))]
        got = sock.recv_into(memoryview(self._buf)[self._have:], 0, socket.MSG_DONTWAIT)
        if got == 0:
            return None
        self._have += got
        return self._parse()

    def _parse(self) -> list[tuple[int, int, Frame]]:
        done: list[tuple[int, int, Frame]] = []
        at = 0
        view = memoryview(self._buf)
        while self._have - at >= HEADER.size:
            magic, kind, key, meta_len, payload_len = HEADER.unpack_from(self._buf, at)
            if magic != MAGIC or meta_len > META_LIMIT:
                raise ValueError(f"rank {self.peer} sent a malformed frame")
            body = at + HEADER.size + meta_len
            if self._have < body:
                break
            meta = json.loads(bytes(view[at + HEADER.size:body]).decode()) if meta_len else {}
            meta = meta if isinstance(meta, dict) else {}
            payload = self._alloc(payload_len)
            here = min(payload_len, self._have - body)
            payload[:here] = view[body:body + here]
            at = body + here
            if here < payload_len:
                self._open, self._filled = (kind, key, meta, payload), here
                break
            done.append((kind, key, Frame(meta, payload)))
        view.release()
        if at:
            self._buf[:self._have - at] = self._buf[at:self._have]
            self._have -= at
        return done


def send_all(sock: socket.socket, parts: list[memoryview], blocked: Callable[[], None] | None = None) -> None:
    """sendmsg until every byte of `parts` is in the kernel (a large payload goes in several calls). With
    `blocked`, no sendmsg waits: `blocked()` is called whenever the connection takes nothing."""
    parts = [p for p in parts if p.nbytes]
    while parts:
        if blocked is None:
            sent = sock.sendmsg(parts)
        else:
            try:
                sent = sock.sendmsg(parts, [], socket.MSG_DONTWAIT)
            except BlockingIOError:
                blocked()
                continue
        while parts and sent >= parts[0].nbytes:
            sent -= parts[0].nbytes
            parts.pop(0)
        if parts and sent:
            parts[0] = parts[0][sent:]
