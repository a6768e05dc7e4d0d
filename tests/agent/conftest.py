"""Fixtures the agent's tests share."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from harness import cancel


@pytest.fixture
def fresh_cancel() -> Iterator[None]:
    """harness.cancel is per process: a test that interrupts must leave it, and the signal handlers (the stop sets
    them to end the process on a second signal), as they were."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    cancel.reset()
    yield
    cancel.reset()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
