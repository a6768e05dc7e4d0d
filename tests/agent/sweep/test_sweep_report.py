"""A sweep's report (agent.sweep.report): a cell of the matrix not started yet is asked, not forgotten; the
comparison uses only problems judged in both arms and names those it drops."""

from __future__ import annotations

import json
from pathlib import Path

from agent.report.build import build
from agent.report.markdown import to_markdown
from agent.sweep.report import pooled_runs
from agent.sweep.spec import SWEEP_SCHEMA, cell_id
from tests.report_support import OUTCOMES, PROBLEMS, make_run, md_rows

CONDITIONS = list(OUTCOMES)  # zero-shot, agent:check+compile


def make_sweep(root: Path, started: list[tuple[str, int]]) -> Path:
    """A sweep folder of model "a": every condition at seeds 0 and 1, only the `started` (condition, seed) cells
    run (each with OUTCOMES' three samples a problem)."""
    folder = root / "sweep"
    cells = [{"id": cell_id("a", c, seed), "kind": "run", "model": "a", "condition": c, "seed": seed}
             for seed in (0, 1) for c in CONDITIONS]
    (folder / "cells").mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps({
        "schema": SWEEP_SCHEMA, "name": "sweep", "cells": cells, "models": ["a"], "conditions": CONDITIONS,
        "seeds": [0, 1], "samples": 3, "problems": [p for p, _ in PROBLEMS]}))
    for condition, seed in started:
        make_run(folder / "cells", cell_id("a", condition, seed), {condition: OUTCOMES[condition]}, seed=seed)
    return folder


def test_a_cell_not_started_leaves_its_arm_incomplete_and_the_comparison_drops_its_problems(tmp_path: Path):
    folder = make_sweep(tmp_path, [("zero-shot", 0), ("agent:check+compile", 0), ("agent:check+compile", 1)])
    (run,) = pooled_runs(folder)
    assert run.config["samples"] == 6 and run.config["seed"] == [0, 1]  # both seeds asked, one not started
    rep = build([run])
    arms = {a["condition"]: a for a in rep.data["arms"]}
    zero = arms["zero-shot"]
    assert zero["complete"] is False and zero["problems"] == 0 and zero["accounting"]["asked"] == 3
    assert {e["reason"] for e in zero["accounting"]["excluded"]} == {"3 of 6 samples judged, pass@6 needs 6: "
                                                                     "3 not started"}
    assert arms["agent:check+compile"]["complete"] is True
    (c,) = rep.data["comparisons"]
    assert c["shared_problems"] == 0 and [d["problem"] for d in c["dropped"]] == [p for p, _ in PROBLEMS]
    assert c["metrics"]["pass_at_k"]["n"] == 0
    text = to_markdown(rep)
    assert "**Incomplete.** zero-shot: 0 of 3 asked problems judged" in text
    (row,) = md_rows(text, "| treatment vs baseline |")
    assert row[2] == "0 (3 dropped)" and row[3] == "— (no shared problem)"


def test_a_seed_no_cell_has_started_is_still_asked(tmp_path: Path):
    (run,) = pooled_runs(make_sweep(tmp_path, [(c, 0) for c in CONDITIONS]))
    assert run.config["samples"] == 6 and run.config["seed"] == [0, 1]
    rep = build([run], k=3)
    assert rep.data["complete"] is False and len(rep.data["incomplete"]) == 2
    assert all(a["problems"] == 3 and a["over_asked"]["problems"] == 3 for a in rep.data["arms"])  # 3 judged of 6


def test_a_sweep_with_every_cell_run_is_complete(tmp_path: Path):
    folder = make_sweep(tmp_path, [(c, s) for c in CONDITIONS for s in (0, 1)])
    rep = build(pooled_runs(folder))
    assert rep.data["complete"] is True and all(a["problems"] == 3 for a in rep.data["arms"])
    assert rep.data["comparisons"][0]["dropped"] == []
