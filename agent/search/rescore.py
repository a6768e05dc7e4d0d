"""`pkb rescore RUN` on a search run: each problem's reported kernel re-measured once more, beside the search's
own figures, and whether the two agree.

The re-measurement is the search's own (agent.search.scoring.remeasure_kernel over agent.remeasure: the same
function, the same settings), on seeds of its own (neither the search's nor its re-measurement's), so it is a
third, independent look at the kernel: the in-search figure (one bench, the luckiest of many draws), the
search's re-measured median with its interval, and this one's. The two re-measurements agree when their
intervals overlap (agent.remeasure.agree).

Each round goes to runs/<id>/rescored.json as it ends, so a killed rescore continues where it stopped and a
later `pkb rescore` reads the finished one back (delete the file to measure again).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agent.final_scoring import EvaluateFn
from agent.remeasure import Remeasurement, Round, agree
from agent.rundir import read_json, write_json_atomic
from agent.search.archive import Archive
from agent.search.layout import SearchDir, load_config
from agent.search.scoring import CLI_REMEASURE, remeasure_kernel, remeasure_seeds
from agent.search.summary import ProblemRow, problem_rows, speedup_text
from harness.problems.problem import Problem
from harness.records.results import EvalResult

SCHEMA = "pkb-search-rescore/1"
AGREEMENT = {True: "agree (intervals overlap)", False: "DISAGREE (intervals do not overlap)",
             None: "nothing to compare"}


@dataclass
class Rescored:
    """One problem: its reported kernel, the search's re-measurement of it and this one."""

    problem: str
    candidate: int | None = None
    in_search: float | None = None
    search: Remeasurement | None = None
    rescore: Remeasurement | None = None
    note: str = ""  # why nothing was re-measured

    @property
    def agree(self) -> bool | None:
        if self.search is None or self.rescore is None:
            return None
        return agree(self.search.interval, self.rescore.interval)

    def line(self) -> str:
        if self.candidate is None or self.rescore is None:
            return f"{self.problem}: {self.note}"
        search = self.search.text() if self.search else "-"
        return (f"{self.problem}: #{self.candidate} in-search {speedup_text(self.in_search)}; search re-measured "
                f"{search}; rescore {self.rescore.text()}: {AGREEMENT[self.agree]}")

    def record(self) -> dict[str, Any]:
        return {"problem": self.problem, "candidate": self.candidate, "search_speedup": self.in_search,
                "search": self.search.record() if self.search else None,
                "rescore": self.rescore.record() if self.rescore else None, "agree": self.agree, "note": self.note}


def stored(directory: SearchDir) -> dict[str, Any]:
    """What the last `pkb rescore` of the search wrote, by problem (Rescored.record); {} where none ran."""
    data = read_json(directory.rescored)
    found = data.get("problems") if isinstance(data, dict) and data.get("schema") == SCHEMA else None
    return dict(found) if isinstance(found, dict) else {}


def _done(before: dict[str, Any], problem: str, candidate: int, seeds: list[int]) -> dict[int, Round]:
    """The rounds of an earlier (or killed) rescore of the same kernel on the same seeds."""
    entry = before.get(problem)
    if not isinstance(entry, dict) or entry.get("candidate") != candidate:
        return {}
    rounds = (entry.get("rescore") or {}).get("rounds") or []
    try:
        found = [Round.from_record(r) for r in rounds if isinstance(r, dict)]
    except TypeError:  # a file this version did not write: measure again
        return {}
    return {r.seed: r for r in found if r.seed in seeds}


def rescore_search(directory: SearchDir, problems: dict[str, Problem], evaluate: EvaluateFn, *, k: int | None = None,
                   concurrency: int = 1, progress: Callable[[str], None] | None = None) -> list[Rescored]:
    """Each problem's reported kernel re-measured `k` times (default: the search's `remeasure`), in the order
    of the search's problems (module docstring)."""
    config = load_config(directory)
    seeds = remeasure_seeds(config, CLI_REMEASURE, k)
    with Archive(directory.archive) as archive:
        rows = problem_rows(archive, config.problems, config.remeasure, config.device)
    before = stored(directory)
    lock = threading.Lock()
    out = {row.problem: Rescored(row.problem) for row in rows}

    def save() -> None:  # under `lock`
        write_json_atomic(directory.rescored, {"schema": SCHEMA, "seeds": seeds,
                                               "problems": {n: r.record() for n, r in out.items()}})

    def one(row: ProblemRow) -> None:
        entry = out[row.problem]
        reported = row.reported
        problem = problems.get(row.problem)
        if reported is None:
            entry.note = ("no kernel confirmed by the search's re-measurement" if row.best is not None
                          else "no trusted kernel")
            return
        if problem is None:
            entry.note = "not rescored: the problem is not in the source"
            return
        c = reported.candidate
        assert c.source is not None  # a trusted candidate was evaluated: it has a source
        entry.candidate, entry.in_search, entry.search = c.id, c.speedup, reported.remeasured
        done = _done(before, row.problem, c.id, seeds)
        entry.rescore = Remeasurement(k=len(seeds), rounds=list(done.values()))  # saved as rounds end

        def on_round(found: Round, result: EvalResult) -> None:
            with lock:
                assert entry.rescore is not None
                entry.rescore.rounds.append(found)
                save()
            if progress is not None:
                progress(f"{row.problem} #{c.id} seed {found.seed}: {found.verdict}, "
                         f"{speedup_text(found.speedup) if found.speedup is not None else 'not measured'}")

        measured = remeasure_kernel(config, evaluate, problem, directory.written(c.problem, c.id, c.source), seeds,
                                    done=done, on_round=on_round)
        with lock:
            entry.rescore = measured
            save()

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for future in [pool.submit(one, row) for row in rows]:
            future.result()
    with lock:
        save()
    return list(out.values())


def rescore_text(record: dict[str, Any]) -> str | None:
    """A stored problem's rescore for a report: its figure and whether it agrees with the search's."""
    rescore = record.get("rescore")
    if not isinstance(rescore, dict) or not rescore.get("text"):
        return None
    return f"{rescore['text']}: {AGREEMENT.get(record.get('agree'), AGREEMENT[None])}"
