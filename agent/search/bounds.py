"""Each problem's roofline bound, measured once per search and kept in its archive.

The bound (agent.search.scoring.bound_of: the lower-bound time and what binds it) ranks candidates by how far
they are from it and is shown to the model; a problem whose bound cannot be had is still searched, by speedup
alone, with the error kept beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.search.archive import Archive
from agent.search.scoring import bound_of
from harness import cancel
from harness.problems.problem import Problem

DETAIL = ("traffic_source", "link_s", "hbm_s", "compute_s", "send_bytes", "recv_bytes", "hbm_bytes", "flops", "notes")


def record_bounds(archive: Archive, problems: dict[str, Problem], order: list[str],
                  measure: Callable[[Problem], dict[str, Any]], log: Any) -> None:
    """Measure the bound of every problem the archive has none for yet (a resumed search keeps its own)."""
    known = archive.bounds()
    for name in order:
        if name in known:
            continue
        cancel.check()  # Ctrl-C between problems' bounds (agent.interrupts polls, it raises nothing here)
        try:
            record = measure(problems[name])
            bound_ms, binding = bound_of(record)
            detail = {k: record.get(k) for k in DETAIL}
        except Exception as err:  # a problem without a bound is still searched, by speedup alone
            bound_ms, binding, detail = None, None, {"error": f"{type(err).__name__}: {err}"[:1000]}
        archive.set_bound(name, bound_ms, binding, detail)
        log.info("roofline_bound", problem=name, bound_ms=bound_ms, binding=binding, error=detail.get("error"))


def bound(archive: Archive, problem: str) -> tuple[float | None, str | None]:
    """(bound in ms, what binds it) of `problem`, (None, None) when it has none."""
    found = archive.bounds().get(problem)
    return (found[0], found[1]) if found else (None, None)
