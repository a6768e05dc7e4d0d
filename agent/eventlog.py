"""The structlog event log of a run: JSON objects appended to events.jsonl, one per line, from any thread.

Shared by `pkb run` (agent.runner) and `pkb search` (agent.search); kept apart from both so that a command
can log without importing the other's dependencies.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import structlog

from harness.records.redaction import redact_text


def _redacted(logger: Any, _method: str, line: Any) -> Any:
    return redact_text(line) if isinstance(line, str) else line


def open_event_log(path: Path) -> tuple[Any, IO[str]]:
    """A structlog logger appending JSON lines to `path` (thread-safe; one object per line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, 2)
            torn = f.read(1) != b"\n"  # a run killed mid-write left half a line: start on a fresh one
    else:
        torn = False
    handle = open(path, "a", buffering=1)
    if torn:
        handle.write("\n")
    logger = structlog.wrap_logger(
        structlog.PrintLogger(handle),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(default=str),
            _redacted,  # the rendered line: no value of the harness's secrets reaches the file
        ],
        context_class=dict,
        cache_logger_on_first_use=False,
    )
    return logger, handle
