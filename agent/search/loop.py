"""The search loop: decide, propose, evaluate, record; keep `window` candidates in flight; resume after any kill.

Slots 0, 1, 2, ... are decided in order by this thread. Deciding slot g reads only the candidates of slots
below g - window + 1 (it first waits until those are evaluated), so every decision, and with a seeded
model every proposal, is a function of the seed and of those results alone, never of which evaluation
happened to finish first. Deciding (agent.search.decide) means: record the stops that are now due
(agent.search.stopping), pick the problem (agent.search.budget: warm-up, then the largest gap), make the
island migrations that are due, and pick the parent(s) (agent.search.strategies), with a random.Random
seeded by the run's seed and g. Each problem's roofline bound is measured once first (agent.search.bounds).

Each decided slot then runs in a worker thread: the model call (agent.search.proposer; never inside a
device lease), the candidate written to the run folder, the evaluation (agent.search.scoring, through the
executor: on this node inside a DeviceScheduler lease with native code built first, or as a Ray task),
and the result recorded. Each step is one transaction of the archive, so a search killed at any moment
resumes exactly where it was: evaluated slots are kept, a proposed slot is evaluated without asking the
model again, a decided slot asks the model, and deciding goes on from the next slot. The same seed and a
deterministic evaluator give the same archive however often the search is killed
(tests/agent/search/test_search_kill.py).

When no problem is left active (or the search budget is spent), the loop waits for what is in flight,
then (agent.search.final) re-measures the `remeasure_top` best distinct trusted kernels of each problem
(agent.remeasure, the function `pkb rescore` calls too): `remeasure` fresh evaluations each, on fresh seeds,
the reference timed beside each, the held-out shapes checked. Only a kernel trusted on every round can be reported as a
problem's best, and of those the one with the best re-measured median is (agent.search.summary).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from agent import interrupts
from agent.eventlog import open_event_log
from agent.executors.interface import Executor, as_evaluate
from agent.executors.local import LocalExecutor
from agent.rundir import write_text_atomic
from agent.scheduler import DeviceScheduler
from agent.search import bounds, episode, stopping
from agent.search.archive import DECIDED, EVALUATED, PROPOSED, Archive, Candidate
from agent.search.config import SearchConfig
from agent.search.decide import decide
from agent.search.final import FinalRemeasure
from agent.search.layout import SearchDir
from agent.search.proposer import FatalModelError, Proposal, Proposer, TransientModelError
from agent.search.scoring import (
    EvaluateFn,
    bound_on_node,
    outcome,
    score,
    trusted,
    unevaluated,
)
from agent.usage import PriceTable
from harness import cancel
from harness.problems.problem import Problem

OUTAGE_WAIT_S = 1800.0  # how long a slot waits for a provider that is down before the search stops
OUTAGE_PAUSES_S = (5.0, 15.0, 60.0, 300.0)  # between attempts, the last one repeated
INTERNAL_ERROR = "internal_error"


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped the search: running evaluations were stopped, the archive is consistent.
    `still_running`: slots left in a model call (the caller ends the process without waiting for them)."""

    def __init__(self, run_id: str, still_running: int) -> None:
        super().__init__(f"search {run_id} interrupted")
        self.still_running = still_running


@dataclass
class SearchSummary:
    run_id: str
    stop_reason: str
    decided: int
    evaluated: int
    errors: list[str] = field(default_factory=list)


def search_stop_reason(archive: Archive) -> str:
    """Why the search as a whole ended: the meta record (fatal model, outage, interrupt) or the stops."""
    stored = archive.meta("stop_reason")
    if stored:
        return stored
    reasons = [s.reason for s in archive.stops().values()]
    spent = sorted({r for r in reasons if r.startswith(stopping.SEARCH_BUDGET)})
    return spent[0] if spent else stopping.ALL_STOPPED


def propose_waiting(propose: Callable[[], Proposal], outage_wait_s: float, aborted: Callable[[], bool],
                    sleep: Callable[[float], None], log: Any) -> Proposal:
    """The model's answer; a provider that is down is waited for, up to `outage_wait_s` in all (and not once
    the search is being stopped)."""
    waited = 0.0
    pauses = list(OUTAGE_PAUSES_S)
    while True:
        try:
            return propose()
        except TransientModelError as err:
            pause = pauses.pop(0) if len(pauses) > 1 else pauses[0]
            if waited + pause > outage_wait_s or aborted():
                raise
            log.warning("provider_down", error=str(err), waited_s=waited, pause_s=pause)
            sleep(pause)  # cancel.sleep: Ctrl-C ends the pause at once (Cancelled)
            waited += pause


class Search:
    """One search over `problems`; `run()` starts it or continues it from its archive."""

    def __init__(self, directory: SearchDir, config: SearchConfig, problems: Sequence[Problem], *,
                 executor: Executor | None = None, evaluate: EvaluateFn | None = None,
                 bound: Callable[[Problem], dict[str, Any]] | None = None, prices: PriceTable | None = None,
                 model_factory: Callable[[int], Any] | None = None, topology: dict[str, Any] | None = None,
                 on_change: Callable[[Archive], None] | None = None, outage_wait_s: float = OUTAGE_WAIT_S,
                 sleep: Callable[[float], None] = cancel.sleep) -> None:
        self.directory = directory
        self.config = config
        self.problems = {p.name: p for p in problems}
        self.order = [p.name for p in problems]
        if executor is None:
            executor = LocalExecutor(DeviceScheduler(config.device, config.world_size,
                                                     ranks_per_gpu=config.ranks_per_gpu))
        self.executor = executor
        self.evaluate = evaluate or as_evaluate(executor)
        self.bound_fn = bound or self._bound_on_devices
        self.prices = prices
        self.model_factory = model_factory
        self.topology = topology
        self.on_change = on_change
        self.outage_wait_s = outage_wait_s
        self.sleep = sleep
        self.window = config.window
        self.archive: Archive | None = None
        self.log: Any = None
        # Built now: a real provider's client is made here, so a bad key or model fails before any work.
        self.proposer = Proposer(config, self.problems, prices=prices, topology=topology, model_factory=model_factory)
        # An agent proposer's tools take this node's leases (the evaluations' scheduler) or go to the executor.
        local = isinstance(executor, LocalExecutor)
        self.proposer.where = episode.Where(
            scheduler=getattr(executor, "scheduler", None) if local else None, executor=None if local else executor,
            world_size=config.world_size, device=config.device, shape=config.shape, topology=topology)
        self.proposer.episodes = directory.episodes
        self._abort: str | None = None
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._session = 0
        self._session_started = 0.0
        self._before_s = 0.0
        self._remeasure: FinalRemeasure | None = None
        # Called at once on Ctrl-C with the number of running slots, before they are stopped (the CLI says so).
        self.on_interrupt: Callable[[int], None] | None = None

    # -- the clock ----------------------------------------------------------------------------------------
    def elapsed_s(self) -> float:
        """Seconds the search has run, over every session."""
        return self._before_s + (time.perf_counter() - self._session_started)

    def capacity(self) -> int:
        try:
            return max(1, int(self.executor.capacity(self.config.world_size, self.config.device)))
        except Exception:
            return 1

    # -- running ------------------------------------------------------------------------------------------
    def run(self) -> SearchSummary:
        archive = self.archive = Archive(self.directory.archive)
        self.log, handle = open_event_log(self.directory.events)
        self._session = archive.start_session(self.executor.name, self.capacity())
        self._session_started = time.perf_counter()
        self._before_s = archive.active_s(exclude=self._session)
        archive.set_meta("stop_reason", "")  # a search-level stop of an earlier session no longer holds
        pool = ThreadPoolExecutor(max_workers=self.window, thread_name_prefix="search")
        in_flight: dict[int, Future[None]] = {}
        interrupted = False
        left = 0  # slots still running after Ctrl-C (in a model call)
        try:
            self.proposer.log = self.log
            bounds.record_bounds(archive, self.problems, self.order, self.bound_fn, self.log)
            self._remeasure = FinalRemeasure(archive, self.config, self.evaluate, self.problems, self._written,
                                             self.bound, self._after_round, self.log)
            unfinished = [c.id for c in archive.candidates() if c.status != EVALUATED]
            self.log.info("search_started", run_id=self.directory.path.name, strategy=self.config.strategy.name,
                          window=self.window, executor=self.executor.name, capacity=self.capacity(),
                          resumed_slots=unfinished, next_slot=archive.next_slot())
            for slot in unfinished:
                in_flight[slot] = pool.submit(self._work, slot)
            slot = archive.next_slot()
            while self._abort is None:
                self._drain(in_flight, below=slot - self.window + 1)
                if self._abort is not None or not self._decide(slot):
                    break
                in_flight[slot] = pool.submit(self._work, slot)
                slot += 1
                self._changed()
            self._drain(in_flight, below=None)
            if self._abort is None:
                self._remeasure.run(pool, self.order)
                self._errors += self._remeasure.errors
            elif self._abort != INTERNAL_ERROR:
                archive.set_meta("stop_reason", self._abort)
            reason = self._abort or search_stop_reason(archive)
            self.log.info("search_finished", stop_reason=reason, decided=archive.next_slot(),
                          elapsed_s=round(self.elapsed_s(), 3), errors=len(self._errors))
            self._heartbeat()
            self._changed()
            rows = archive.candidates()
            return SearchSummary(self.directory.path.name, reason, len(rows), sum(c.done for c in rows),
                                 list(self._errors))
        except (KeyboardInterrupt, cancel.Cancelled):  # Ctrl-C: polled (agent.interrupts), or a plain interrupt
            archive.set_meta("stop_reason", stopping.INTERRUPTED)
            self._heartbeat()
            interrupted = True
            futures = [*in_flight.values(), *(self._remeasure.futures if self._remeasure else [])]
            busy = interrupts.interrupted(futures)
            if self.on_interrupt is not None:
                self.on_interrupt(busy)
            self.log.info("search_interrupted", running=busy)
            left = interrupts.stop_work(futures)  # evaluations stopped, their processes ended
            self.log.info("search_stopped", still_running=left)
            raise SearchInterrupted(self.directory.path.name, left) from None
        finally:
            # After Ctrl-C, slots still in a model call are not waited for: the caller ends the process (the
            # archive is consistent whenever the process ends; --resume redoes what they were doing).
            pool.shutdown(wait=not interrupted, cancel_futures=True)
            handle.close()
            if not interrupted or not left:
                archive.close()
                self.archive = None

    def _changed(self) -> None:
        if self.on_change is not None and self.archive is not None:
            try:
                self.on_change(self.archive)
            except Exception:  # a live view must never stop the search
                self.log.exception("live_view_failed")

    def _heartbeat(self) -> None:
        assert self.archive is not None
        self.archive.heartbeat(self._session, self.elapsed_s() - self._before_s)

    def _drain(self, in_flight: dict[int, Future[None]], below: int | None) -> None:
        """Wait until no slot below `below` (None: no slot at all) is in flight."""
        while True:
            cancel.check()  # Ctrl-C (agent.interrupts): polled, never raised into this thread
            waiting = [f for s, f in in_flight.items() if below is None or s < below]
            finished = [s for s, f in in_flight.items() if f.done()]
            for s in finished:
                self._collect(s, in_flight[s])  # a slot stopped by Ctrl-C raises Cancelled: it stays, counted
                del in_flight[s]
            if not [s for s in in_flight if below is None or s < below]:
                return
            if waiting:
                wait(waiting, timeout=interrupts.CANCEL_POLL_S, return_when=FIRST_COMPLETED)

    def _collect(self, slot: int, future: Future[None]) -> None:
        try:
            future.result()
        except FatalModelError as err:
            self.log.error("model_fatal", slot=slot, error=str(err))
            self._set_abort(stopping.MODEL_FATAL, f"slot {slot}: {err}")
        except TransientModelError as err:
            self.log.error("provider_unavailable", slot=slot, error=str(err))
            self._set_abort(stopping.PROVIDER_UNAVAILABLE, f"slot {slot}: {err}")
        except Exception as err:  # a bug: the slot stays unfinished, --resume retries it
            self.log.error("slot_crashed", slot=slot, error=f"{type(err).__name__}: {err}",
                           traceback=traceback.format_exc())
            self._set_abort(INTERNAL_ERROR, f"slot {slot}: {type(err).__name__}: {err}")

    def _set_abort(self, reason: str, message: str) -> None:
        with self._lock:
            self._errors.append(message)
            if self._abort is None:
                self._abort = reason

    # -- bounds -------------------------------------------------------------------------------------------
    def _bound_on_devices(self, problem: Problem) -> dict[str, Any]:
        c = self.config
        return self.executor.run_on_devices(c.world_size, c.device, bound_on_node, problem, c.shape, c.world_size,
                                            c.device)

    def bound(self, problem: str) -> tuple[float | None, str | None]:
        assert self.archive is not None
        return bounds.bound(self.archive, problem)

    # -- deciding (agent.search.decide) --------------------------------------------------------------------
    def _decide(self, slot: int) -> bool:
        """Decide slot `slot`; False when the search is over."""
        assert self.archive is not None
        return decide(self.archive, self.config, self.order, slot, self.elapsed_s(), self.log)

    # -- one slot -----------------------------------------------------------------------------------------
    def _work(self, slot: int) -> None:
        archive, proposer = self.archive, self.proposer
        assert archive is not None
        c = archive.candidate(slot)
        assert c is not None
        log = self.log.bind(slot=slot, problem=c.problem)
        if c.status == DECIDED:
            parents = [p for p in (archive.candidate(i) for i in c.parents) if p is not None]
            visible = archive.candidates(c.problem, upto=slot - self.window + 1)
            messages = proposer.messages(c.problem, parents, visible, self.bound(c.problem))
            proposal = propose_waiting(partial(proposer.propose, slot, messages, c.problem), self.outage_wait_s,
                                       lambda: self._abort is not None, self.sleep, log)
            self._record_proposal(slot, c, proposal)
            log.info("proposed", has_code=proposal.source is not None, input_tokens=proposal.input_tokens,
                     output_tokens=proposal.output_tokens, model_s=round(proposal.model_s, 3))
            self._changed()
            c = archive.candidate(slot)
            assert c is not None
        if c.status == PROPOSED:
            self._evaluate(slot, c, log)
            self._changed()

    def _record_proposal(self, slot: int, c: Candidate, proposal: Proposal) -> None:
        assert self.archive is not None
        outcome = None
        path = None
        if proposal.source is None:
            assert proposal.verdict is not None
            outcome = unevaluated(proposal.verdict, proposal.note, self.elapsed_s())
        else:
            file = self.directory.candidate(c.problem, slot)
            write_text_atomic(file, proposal.source)
            path = self.directory.relative(file)
        self.archive.propose(slot, model=self.config.model, input_tokens=proposal.input_tokens,
                             output_tokens=proposal.output_tokens, cost_usd=proposal.cost_usd,
                             cost_known=proposal.cost_known, model_s=proposal.model_s, note=proposal.note,
                             source=proposal.source, sha256=proposal.sha256, path=path, outcome=outcome,
                             proposer_gpu_s=round(proposal.device_s, 6), tool_calls=proposal.tool_calls)
        self._heartbeat()  # the proposer's device time is charged: the wall clock must cover it

    def _evaluate(self, slot: int, c: Candidate, log: Any) -> None:
        assert self.archive is not None
        path = self._written(c)  # written again from the archive on resume
        log_dir = self.directory.logs(slot) if self.config.keep_logs else None
        scored = score(self.evaluate, self.problems[c.problem], path, config=self.config.eval_config(),
                       world_size=self.config.world_size, device=self.config.device, shape=self.config.shape,
                       log_dir=log_dir, log=log)
        self.archive.evaluate(slot, outcome(scored, self.bound(c.problem), self.elapsed_s()))
        self._heartbeat()
        log.info("evaluated", verdict=scored.result.verdict, speedup=scored.result.speedup,
                 flags=scored.result.flags, trusted=trusted(scored.result), seconds=round(scored.seconds, 3),
                 stages=scored.result.stages)

    def _after_round(self) -> None:
        self._heartbeat()
        self._changed()

    def _written(self, c: Candidate) -> Path:
        assert c.source is not None
        return self.directory.written(c.problem, c.id, c.source)
