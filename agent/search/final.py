"""After the search: each problem's best kernels re-measured before one is reported (issue 44's winner's curse).

The `remeasure_top` best distinct trusted kernels of each problem by the search's own figure are re-judged on
fresh seeds (inputs no evaluation of the search drew, so their feedback never reached the model) and on the
held-out shapes, `remeasure` rounds each, by agent.remeasure (what `pkb rescore` runs too); a kernel's
remaining seeds are skipped once one is not trusted. The one reported is chosen on these measurements
(agent.search.summary), never on the search's own, which favour whichever kernel was timed at a lucky moment.
Every round is kept in the archive as it ends, so a resumed search skips the rounds it has.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from agent import interrupts
from agent.remeasure import Round
from agent.search import strategies
from agent.search.archive import Archive, Candidate
from agent.search.config import SearchConfig
from agent.search.scoring import SEARCH_REMEASURE, EvaluateFn, remeasure_kernel, remeasure_seeds, rescore_row, round_of
from harness import cancel
from harness.problems.problem import Problem
from harness.records.results import EvalResult


@dataclass
class FinalRemeasure:
    """The re-measurement of one search's problems, in its pool's threads; `futures` is what Ctrl-C stops."""

    archive: Archive
    config: SearchConfig
    evaluate: EvaluateFn
    problems: dict[str, Problem]
    written: Callable[[Candidate], Path]  # the candidate's file, written again from the archive on resume
    bound: Callable[[str], tuple[float | None, str | None]]
    after_round: Callable[[], None]  # the search's heartbeat and live view
    log: Any
    errors: list[str] = field(default_factory=list)
    futures: list[Future[None]] = field(default_factory=list)

    def run(self, pool: ThreadPoolExecutor, order: list[str]) -> None:
        seeds = remeasure_seeds(self.config, SEARCH_REMEASURE)
        futures = {name: pool.submit(self.problem, name, seeds) for name in order}
        self.futures = list(futures.values())
        for name, future in futures.items():
            while not future.done():  # polled, so that Ctrl-C (agent.interrupts) is noticed while it runs
                cancel.check()
                wait([future], timeout=interrupts.CANCEL_POLL_S)
            try:
                future.result()
            except Exception as err:
                self.log.error("rescore_crashed", problem=name, error=f"{type(err).__name__}: {err}",
                               traceback=traceback.format_exc())
                self.errors.append(f"rescore {name}: {type(err).__name__}: {err}")

    def problem(self, name: str, seeds: list[int]) -> None:
        done: dict[int, dict[int, Round]] = {}
        for r in self.archive.rescores(name):
            done.setdefault(r.candidate, {})[r.seed] = round_of(r, self.config.device)
        for c in strategies.best_distinct(self.archive.candidates(name), self.config.remeasure_top):
            measured = remeasure_kernel(self.config, self.evaluate, self.problems[name], self.written(c), seeds,
                                        done=done.get(c.id), on_round=partial(self._record_round, c), log=self.log)
            if measured.confirmed:
                self.log.info("rescored", problem=name, candidate=c.id, seeds=seeds, search_speedup=c.speedup,
                              remeasured=measured.record()["speedup"])
            else:
                last = measured.rounds[-1]
                self.log.warning("rescore_failed", problem=name, candidate=c.id, seed=last.seed, verdict=last.verdict)

    def _record_round(self, c: Candidate, found: Round, result: EvalResult) -> None:
        self.archive.add_rescore(rescore_row(c.problem, c.id, found, self.bound(c.problem), result),
                                 eval_s=found.seconds, result=result.model_dump_json())
        self.after_round()
