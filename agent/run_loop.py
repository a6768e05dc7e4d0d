"""The run loop: a run's samples handed to `concurrency` threads as slots free up, an infra_error sample judged
again after each of the run's waits (config.infra_waits_s), and Ctrl-C stopping the run (agent.interrupts).

Samples are never queued in the pool all at once: on Ctrl-C nothing is queued there, and only the running ones
have anything to stop. An infra_error sample waits in `later`, holding no slot, until its wait is over; a
lasting cause (harness.common.failures.LASTING_INFRA_CAUSES) meets this machine again, so it is not waited for.
A provider error that ends the run (agent.graph_state.FatalProviderError) stops handing out samples; an outage
that outlasts the retries leaves its sample unfinished for `--resume`; an internal error ends its sample only.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from agent import interrupts
from agent.graph_state import FatalProviderError, TransientProviderError
from agent.sample_spec import SampleSpec
from harness import cancel
from harness.common import failures

Record = dict[str, Any]


def is_infra(record: Record | None) -> bool:
    """A finished sample whose verdict is the harness's failure, not the model's."""
    return record is not None and record.get("verdict") == failures.INFRA_ERROR


@dataclass
class RunSummary:
    run_id: str
    total: int
    records: list[Record] = field(default_factory=list)  # finished samples (this call and before)
    skipped: int = 0  # finished before this call: not redone
    interrupted: list[str] = field(default_factory=list)  # provider outages: unfinished, --resume continues
    errors: list[str] = field(default_factory=list)  # internal errors: unfinished
    fatal: str | None = None  # the provider error that ended the run

    @property
    def infra_records(self) -> list[Record]:
        """Finished samples still in infra_error: the run is incomplete while there are any."""
        return [r for r in self.records if is_infra(r)]

    @property
    def infra_errors(self) -> int:
        return len(self.infra_records)

    @property
    def complete(self) -> bool:
        return len(self.records) == self.total


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped the run: the running samples' evaluations were stopped, queued samples never
    started, finished ones are on disk. `still_running`: sample threads left in a model call (the caller ends the
    process without waiting for them)."""

    def __init__(self, summary: RunSummary, still_running: int) -> None:
        super().__init__(f"run {summary.run_id} interrupted: {len(summary.records)} of {summary.total} finished")
        self.summary = summary
        self.still_running = still_running


@dataclass(frozen=True)
class Job:
    """A sample to run, or (`again`) to judge again after `after_wait_s`."""

    spec: SampleSpec
    again: bool = False
    after_wait_s: float | None = None


@dataclass(frozen=True)
class _Later:
    """An infra_error sample waiting until `due` (the loop's clock) to be judged again; `record` is on disk."""

    due: float
    spec: SampleSpec
    record: Record
    wait_s: float


@dataclass
class RunLoop:
    """One pass over a run's jobs. `run_sample` and `rejudge` do one sample's work (agent.sample_life, through the
    Runner); `sleep` (by default one that Ctrl-C ends at once) and `clock` are injectable, so tests never wait."""

    summary: RunSummary
    concurrency: int
    run_sample: Callable[[SampleSpec], Record]
    rejudge: Callable[[SampleSpec, float | None], Record]
    log: Any
    waits: list[float]  # the waits before each judgement again of an infra_error
    sleep: Callable[[float], None]
    clock: Callable[[], float]
    on_sample: Callable[[Record, bool], None] | None = None  # every finished record, and whether it was before
    on_interrupt: Callable[[int], None] | None = None  # Ctrl-C, with the number of running samples, at once
    # Set by a provider error that ends the run: no sample starts after it (the Runner's, for all its passes).
    abort: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _later: list[_Later] = field(default_factory=list)  # infra_error samples waiting to be judged again
    _judged: dict[str, int] = field(default_factory=dict)  # judgements of each sample in this pass

    def run(self, jobs: list[Job]) -> None:
        """Every job; raises RunInterrupted on Ctrl-C (the summary then holds what finished)."""
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="sample")
        queue = list(jobs)
        running: set[Future[None]] = set()
        left = 0  # sample threads still running after Ctrl-C
        try:
            while queue or running or self._later:
                if cancel.requested():  # Ctrl-C (agent.interrupts): polled, never raised into this loop
                    raise KeyboardInterrupt
                if self.abort.is_set():
                    self._settle()
                queue.extend(Job(w.spec, again=True, after_wait_s=w.wait_s) for w in self._due())
                while (queue and len(running) < self.concurrency and not self.abort.is_set()
                       and not cancel.requested()):
                    running.add(pool.submit(self._one, queue.pop(0)))
                if not running:
                    with self._lock:
                        first = min((w.due for w in self._later), default=None)
                    if first is None or self.abort.is_set():
                        break
                    # Nothing else to do: wait for the next judgement (Ctrl-C ends the wait at once)
                    self.sleep(max(0.0, first - self.clock()))
                    continue
                done, _ = wait(running, timeout=interrupts.CANCEL_POLL_S, return_when=FIRST_COMPLETED)
                for f in done:
                    f.result()  # a sample stopped by Ctrl-C raises Cancelled: it stays in `running`, counted
                    running.discard(f)
        except (KeyboardInterrupt, cancel.Cancelled):
            self._settle()  # finished (in infra_error) on disk: --resume or --retry-infra judges them again
            left = self._stop(running)
            raise RunInterrupted(self.summary, left) from None
        finally:
            # after Ctrl-C, threads still in a model call are not waited for (the process ends)
            pool.shutdown(wait=not left, cancel_futures=True)
        self._settle()

    def _due(self) -> list[_Later]:
        """The waiting samples whose wait is over, taken out of `later`."""
        with self._lock:
            due = [w for w in self._later if w.due <= self.clock()]
            for w in due:
                self._later.remove(w)
        return due

    def _settle(self) -> None:
        """Infra samples that will not be judged again in this pass: finished as they are."""
        with self._lock:
            self.summary.records.extend(w.record for w in self._later)
            self._later.clear()

    def _one(self, job: Job) -> None:
        spec, summary = job.spec, self.summary
        if self.abort.is_set():
            return
        try:
            record = self.rejudge(spec, job.after_wait_s) if job.again else self.run_sample(spec)
        except FatalProviderError as err:
            self.abort.set()
            with self._lock:
                summary.fatal = summary.fatal or str(err)
            return
        except TransientProviderError as err:
            with self._lock:
                summary.interrupted.append(f"{spec.thread_id}: {err}")
            return
        except Exception as err:  # an internal error ends this sample, not the run
            self.log.error("sample_crashed", sample=spec.thread_id, error=f"{type(err).__name__}: {err}",
                           traceback=traceback.format_exc())
            with self._lock:
                summary.errors.append(f"{spec.thread_id}: {type(err).__name__}: {err}")
            return
        if self._waits_again(spec, record):
            return
        if self.on_sample:
            self.on_sample(record, False)

    def _waits_again(self, spec: SampleSpec, record: Record) -> bool:
        """Whether the sample waits to be judged again (its n-th judgement in infra_error, n within the waits);
        else its record is finished in the summary."""
        with self._lock:
            self._judged[spec.thread_id] = n = self._judged.get(spec.thread_id, 0) + 1
            if (is_infra(record) and record.get("infra_cause") not in failures.LASTING_INFRA_CAUSES
                    and n <= len(self.waits)):
                wait_s = self.waits[n - 1]
                self._later.append(_Later(self.clock() + wait_s, spec, record, wait_s))
                self.log.info("sample_infra_wait", sample=spec.thread_id, judgement=n, wait_s=wait_s,
                              infra_cause=record.get("infra_cause"))
                return True
            self.summary.records.append(record)
        return False

    def _stop(self, running: set[Future[None]]) -> int:
        """Ctrl-C: say so at once, stop the running samples' evaluations (agent.interrupts), keep the finished
        ones; returns how many sample threads are still running (in a model call)."""
        summary = self.summary
        busy = interrupts.interrupted(running)
        if self.on_interrupt is not None:
            self.on_interrupt(busy)
        self.log.info("run_interrupted", running=busy, finished=len(summary.records), total=summary.total)
        left = interrupts.stop_work(running)
        self.log.info("run_stopped", still_running=left, finished=len(summary.records), total=summary.total)
        return left
