"""The search loop: decide, propose, evaluate, record; keep `window` candidates in flight; resume after any kill.

Slots 0, 1, 2, ... are decided in order by this thread. Deciding slot g reads only the candidates of slots
below g - window + 1 (it first waits until those are evaluated), so every decision, and with a seeded
model every proposal, is a function of the seed and of those results alone, never of which evaluation
happened to finish first. Deciding means: record the stops that are now due (agent.search.stopping), pick
the problem (agent.search.budget: warm-up, then the largest gap), make the island migrations that are due,
and pick the parent(s) (agent.search.strategies), with a random.Random seeded by the run's seed and g.

Each decided slot then runs in a worker thread: the model call (agent.search.proposer; never inside a
device lease), the candidate written to the run folder, the evaluation (agent.search.scoring, through the
executor: on this node inside a DeviceScheduler lease with native code built first, or as a Ray task),
and the result recorded. Each step is one transaction of the archive, so a search killed at any moment
resumes exactly where it was: evaluated slots are kept, a proposed slot is evaluated without asking the
model again, a decided slot asks the model, and deciding goes on from the next slot. The same seed and a
deterministic evaluator give the same archive however often the search is killed
(tests/agent/search/test_search_kill.py).

When no problem is left active (or the search budget is spent), the loop waits for what is in flight,
then re-measures the `remeasure_top` best distinct trusted kernels of each problem (agent.remeasure, the
function `pkb rescore` calls too): `remeasure` fresh evaluations each, on fresh seeds, the reference timed
beside each, the held-out shapes checked. Only a kernel trusted on every round can be reported as a
problem's best, and of those the one with the best re-measured median is (agent.search.summary).
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
import traceback
from collections import Counter
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
from agent.remeasure import Round
from agent.rundir import write_text_atomic
from agent.scheduler import DeviceScheduler
from agent.search import budget, episode, stopping, strategies
from agent.search.archive import DECIDED, EVALUATED, PROPOSED, Archive, Candidate
from agent.search.config import SearchConfig
from agent.search.layout import SearchDir
from agent.search.proposer import FatalModelError, Proposal, Proposer, TransientModelError, derived_seed
from agent.search.scoring import (
    SEARCH_REMEASURE,
    EvaluateFn,
    bound_of,
    bound_on_node,
    outcome,
    remeasure_kernel,
    remeasure_seeds,
    rescore_row,
    round_of,
    score,
    trusted,
    unevaluated,
)
from agent.usage import PriceTable
from harness import cancel
from harness.problems.problem import Problem
from harness.records.results import EvalResult

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
        self._rescoring: list[Future[None]] = []
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
            self._bounds()
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
                self._rescore(pool)
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
            futures = [*in_flight.values(), *self._rescoring]
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

    def _bounds(self) -> None:
        assert self.archive is not None
        known = self.archive.bounds()
        for name in self.order:
            if name in known:
                continue
            cancel.check()  # Ctrl-C between problems' bounds (agent.interrupts polls, it raises nothing here)
            try:
                record = self.bound_fn(self.problems[name])
                bound_ms, binding = bound_of(record)
                detail = {k: record.get(k) for k in ("traffic_source", "link_s", "hbm_s", "compute_s", "send_bytes",
                                                     "recv_bytes", "hbm_bytes", "flops", "notes")}
            except Exception as err:  # a problem without a bound is still searched, by speedup alone
                bound_ms, binding, detail = None, None, {"error": f"{type(err).__name__}: {err}"[:1000]}
            self.archive.set_bound(name, bound_ms, binding, detail)
            self.log.info("roofline_bound", problem=name, bound_ms=bound_ms, binding=binding,
                          error=detail.get("error"))

    def bound(self, problem: str) -> tuple[float | None, str | None]:
        assert self.archive is not None
        found = self.archive.bounds().get(problem)
        return (found[0], found[1]) if found else (None, None)

    # -- deciding -----------------------------------------------------------------------------------------
    def _decide(self, slot: int) -> bool:
        """Decide slot `slot`; False when the search is over."""
        archive = self.archive
        assert archive is not None
        c = self.config
        visible = archive.candidates(upto=slot - self.window + 1)
        decided = archive.candidates(upto=slot)
        stops = archive.stops()
        active = [p for p in self.order if p not in stops]
        total = budget.spent(decided, visible, self.elapsed_s())
        kind = budget.reached(c.budget, total)
        if kind is not None:
            for name in active:
                archive.stop(name, f"{stopping.SEARCH_BUDGET}:{kind}", slot,
                             {"limit": c.budget.given()[kind], "spent": total.amount(kind)})
                self.log.info("problem_stopped", problem=name, reason=f"{stopping.SEARCH_BUDGET}:{kind}", slot=slot)
            return False
        for name in active:
            mine = [x for x in visible if x.problem == name]
            mine_decided = [x for x in decided if x.problem == name]
            wall = self._problem_seconds(name, slot)
            decision = stopping.problem_stop(mine, c.stop, c.per_problem, budget.spent(mine_decided, mine, wall))
            if decision is not None:
                archive.stop(name, decision.reason, slot, decision.detail)
                self.log.info("problem_stopped", problem=name, reason=decision.reason, slot=slot, **decision.detail)
        stops = archive.stops()
        active = [p for p in self.order if p not in stops]
        if not active:
            return False
        counts = Counter(x.problem for x in decided)
        gaps = {name: budget.gap([x for x in visible if x.problem == name]) for name in active}
        problem = budget.choose_problem(active, dict(counts), gaps, c.warmup)
        seq = counts[problem]
        mine = [x for x in visible if x.problem == problem]
        # Only migrations of earlier slots decide this slot's: a killed attempt at this very slot may have
        # recorded some of them already.
        before = [m for m in archive.migrants(problem) if m[2] < slot]
        moves = strategies.migrations(c.strategy, seq, mine, before)
        for to_island, candidate in moves:
            archive.add_member(problem, to_island, candidate, slot)
        migrants = before + [(to_island, candidate, slot) for to_island, candidate in moves]
        uses = Counter(x.parents[0] for x in decided if x.problem == problem and x.parents)
        rng = random.Random(derived_seed(c.seed, slot, "select"))
        choice = strategies.choose(c.strategy, seq, mine, uses, migrants, rng)
        archive.decide(slot, problem, seq, choice.island, choice.parents, c.strategy.name, choice.why)
        self.log.info("decided", slot=slot, problem=problem, seq=seq, island=choice.island, parents=choice.parents,
                      **{k: v for k, v in choice.why.items() if k in ("mode", "reason")})
        return True

    def _problem_seconds(self, problem: str, slot: int) -> float:
        """Seconds the problem's candidates spent in model calls and evaluations (its wall-clock budget)."""
        if self.config.per_problem.wall_hours is None:
            return 0.0  # read only when that limit is set: it depends on the clock
        assert self.archive is not None
        rows = [r for r in self.archive.rows(("id", "problem", "model_s", "eval_s"))
                if r["problem"] == problem and r["id"] < slot]
        return sum(float(r["model_s"] or 0.0) + float(r["eval_s"] or 0.0) for r in rows)

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
            proposal = self._propose(slot, messages, c.problem, log)
            self._record_proposal(slot, c, proposal)
            log.info("proposed", has_code=proposal.source is not None, input_tokens=proposal.input_tokens,
                     output_tokens=proposal.output_tokens, model_s=round(proposal.model_s, 3))
            self._changed()
            c = archive.candidate(slot)
            assert c is not None
        if c.status == PROPOSED:
            self._evaluate(slot, c, log)
            self._changed()

    def _propose(self, slot: int, messages: list[Any], problem: str, log: Any) -> Proposal:
        """The model's answer; a provider that is down is waited for, up to outage_wait_s in all."""
        waited = 0.0
        pauses = list(OUTAGE_PAUSES_S)
        while True:
            try:
                return self.proposer.propose(slot, messages, problem)
            except TransientModelError as err:
                pause = pauses.pop(0) if len(pauses) > 1 else pauses[0]
                if waited + pause > self.outage_wait_s or self._abort is not None:
                    raise
                log.warning("provider_down", error=str(err), waited_s=waited, pause_s=pause)
                self.sleep(pause)  # cancel.sleep: Ctrl-C ends the pause at once (Cancelled)
                waited += pause

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

    # -- re-measuring -------------------------------------------------------------------------------------
    def rescore_seeds(self) -> list[int]:
        """Fresh seeds: inputs no evaluation of the search drew (their feedback never reached the model)."""
        return remeasure_seeds(self.config, SEARCH_REMEASURE)

    def _rescore(self, pool: ThreadPoolExecutor) -> None:
        seeds = self.rescore_seeds()
        futures = {name: pool.submit(self._rescore_problem, name, seeds) for name in self.order}
        self._rescoring = list(futures.values())  # what Ctrl-C has to stop
        for name, future in futures.items():
            while not future.done():  # polled, so that Ctrl-C (agent.interrupts) is noticed while it runs
                cancel.check()
                wait([future], timeout=interrupts.CANCEL_POLL_S)
            try:
                future.result()
            except Exception as err:
                self.log.error("rescore_crashed", problem=name, error=f"{type(err).__name__}: {err}",
                               traceback=traceback.format_exc())
                self._errors.append(f"rescore {name}: {type(err).__name__}: {err}")

    def _rescore_problem(self, name: str, seeds: list[int]) -> None:
        """The `remeasure_top` best distinct trusted kernels by the search's own figure, each re-measured on every
        fresh seed and the held-out shapes (agent.remeasure; a kernel's remaining seeds are skipped once one is
        not trusted): the one reported is chosen on these fresh measurements (agent.search.summary), never on
        the search's own, which favour whichever kernel was timed at a lucky moment."""
        archive = self.archive
        assert archive is not None
        ranked = sorted(strategies.trusted(archive.candidates(name)), key=strategies.rank_key, reverse=True)
        done: dict[int, dict[int, Round]] = {}
        for r in archive.rescores(name):
            done.setdefault(r.candidate, {})[r.seed] = round_of(r, self.config.device)
        seen: set[str] = set()
        picked = []
        for c in ranked:
            digest = hashlib.sha256((c.source or "").encode()).hexdigest()
            if digest not in seen:
                seen.add(digest)
                picked.append(c)
            if len(picked) == self.config.remeasure_top:
                break
        for c in picked:
            measured = remeasure_kernel(self.config, self.evaluate, self.problems[name], self._written(c), seeds,
                                        done=done.get(c.id), on_round=partial(self._record_round, c), log=self.log)
            if measured.confirmed:
                self.log.info("rescored", problem=name, candidate=c.id, seeds=seeds, search_speedup=c.speedup,
                              remeasured=measured.record()["speedup"])
            else:
                last = measured.rounds[-1]
                self.log.warning("rescore_failed", problem=name, candidate=c.id, seed=last.seed, verdict=last.verdict)

    def _written(self, c: Candidate) -> Path:
        assert c.source is not None
        return self.directory.written(c.problem, c.id, c.source)

    def _record_round(self, c: Candidate, found: Round, result: EvalResult) -> None:
        assert self.archive is not None
        self.archive.add_rescore(rescore_row(c.problem, c.id, found, self.bound(c.problem), result),
                                 eval_s=found.seconds, result=result.model_dump_json())
        self._heartbeat()
        self._changed()
