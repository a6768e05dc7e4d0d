"""No secret of the harness's environment in anything the project writes.

Every record, transcript, log and report passes through `redact_*` before it is written (harness.launch.pool's
rank logs, agent.rundir's atomic writes, the tools' records, the event log, the search archive, the
LangGraph checkpoints, what `pkb eval` prints). The secrets are the values of this process's environment
variables whose names end in one of SECRET_SUFFIXES (`ANTHROPIC_API_KEY`, `GITHUB_TOKEN`, ...), read at
each call, so a key set after start-up is covered too.

What is replaced: the raw value; its hexadecimal form (either case); its base64 form at each of the three
alignments a longer base64 text can put it in (the part of the encoding that does not depend on the
neighbouring bytes); its JSON-escaped form. Values shorter than MIN_LENGTH are left alone (they would
match ordinary text). Not covered, and listed in tests/exploits/README.md: a value split across writes or
lines, or encoded any other way (reversed, XORed, compressed, URL-escaped beyond JSON's escapes, one
character per line); a secret that is not in an environment variable with such a name.

Standard library only.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from typing import Any

SECRET_SUFFIXES = ("_API_KEY", "_TOKEN", "_SECRET")
MIN_LENGTH = 8


def secret_names(environ: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    return sorted(k for k, v in env.items() if k.upper().endswith(SECRET_SUFFIXES) and len(v) >= MIN_LENGTH)


def _forms(value: str) -> list[bytes]:
    raw = value.encode("utf-8", "surrogateescape")
    forms = {raw, raw.hex().encode(), raw.hex().upper().encode(), json.dumps(value)[1:-1].encode()}
    for shift in range(3):
        # The encoding of `raw` preceded by `shift` unknown bytes: drop the characters those bytes touch and
        # the last group, which the bytes after it touch; what is left appears whatever the neighbours are.
        encoded = base64.b64encode(b"\0" * shift + raw).rstrip(b"=")
        lead = (shift * 4 + 2) // 3  # characters that hold a bit of the unknown bytes before
        core = encoded[lead:4 * (shift + len(raw)) // 3]  # ... and the last, partial one
        if len(core) >= MIN_LENGTH:
            forms.add(core)
            forms.add(core.replace(b"+", b"-").replace(b"/", b"_"))  # the URL-safe alphabet
    return sorted(forms, key=len, reverse=True)


def _table(environ: Mapping[str, str] | None) -> list[tuple[bytes, str]]:
    env = os.environ if environ is None else environ
    return [(form, name) for name in secret_names(env) for form in _forms(env[name])]


def redact_bytes(data: bytes, *, same_length: bool = False, environ: Mapping[str, str] | None = None) -> bytes:
    """`data` with every form of every secret replaced by `[redacted:NAME]`; `same_length` replaces each
    byte by '*' instead (for binary formats that record lengths: msgpack, pickle)."""
    for form, name in _table(environ):
        if form in data:
            data = data.replace(form, b"*" * len(form) if same_length else f"[redacted:{name}]".encode())
    return data


def redact_text(text: str, environ: Mapping[str, str] | None = None) -> str:
    table = _table(environ)
    if not table:
        return text
    data = text.encode("utf-8", "surrogateescape")
    for form, name in table:
        if form in data:
            data = data.replace(form, f"[redacted:{name}]".encode())
    return data.decode("utf-8", "surrogateescape")


def redact_value(value: Any, environ: Mapping[str, str] | None = None) -> Any:
    """A JSON-like value (dicts, lists, strings, numbers) with every string redacted, keys included."""
    if not _table(environ):
        return value

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return redact_text(v, environ)
        if isinstance(v, dict):
            return {walk(k) if isinstance(k, str) else k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(walk(x) for x in v) if isinstance(v, list) else tuple(walk(x) for x in v)
        return v

    return walk(value)


def contains_secret(data: bytes | str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The names of the secrets some form of which appears in `data` (tests, audits)."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    return sorted({name for form, name in _table(environ) if form in raw})
