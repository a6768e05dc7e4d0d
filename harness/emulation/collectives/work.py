"""Work objects of the host collectives. Rank side; torch only.

Collectives finish before they return (every rank waits for the data it needs), so their Work is already
complete. A receive is posted when it is called and finished when it is waited on: `irecv` must not
block, or two ranks that each post a receive before their send (as batch_isend_irecv lets them) would
wait for each other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

# Private names the stubs do not list (torch's own Python process-group tests use both).
_create_work_from_future: Any = c10d._create_work_from_future  # type: ignore[attr-defined]
_Work: Any = c10d.Work


def _future(result: list[torch.Tensor]) -> torch.futures.Future[list[torch.Tensor]]:
    devices: list[int | str | torch.device] = [*sorted({str(t.device) for t in result if t.device.type == "cuda"})]
    future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future(devices=devices or None)
    future.set_result(result)
    return future


def completed(result: list[torch.Tensor]) -> dist.Work:
    """A Work that is done: wait() returns at once, its future holds `result`."""
    work: dist.Work = _create_work_from_future(_future(result))
    return work


class PendingReceive(_Work):  # type: ignore[misc]  # a base typed Any (above)
    """A posted receive: `finish` takes the frame and writes the tensor, once, on the first wait."""

    def __init__(self, finish: Callable[[], None], result: list[torch.Tensor]) -> None:
        super().__init__()
        self._finish: Callable[[], None] | None = finish
        self._result = result
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    def _complete(self) -> None:
        with self._lock:
            if self._finish is not None:
                finish, self._finish = self._finish, None
                try:
                    finish()
                except BaseException as err:
                    self._error = err
            if self._error is not None:
                raise self._error

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._complete()
        return True

    def get_future(self) -> Any:
        self._complete()
        return _future(self._result)

    def is_completed(self) -> bool:
        return self._finish is None

    def is_success(self) -> bool:
        return self._finish is None and self._error is None

    def result(self) -> list[torch.Tensor]:
        self._complete()
        return self._result
