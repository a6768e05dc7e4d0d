"""The report's figures: count axes tick whole numbers only (issue 46); an arm that measured no speed draws no
fast_p line of zeros (issue 44)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.report.build import build
from agent.report.figures import failure_plot, fast_p_plot
from agent.report.run_reader import read_run
from tests.report_support import OUTCOMES, make_run


def test_the_failure_counts_axis_has_whole_number_ticks(tmp_path: Path):
    one_each = {"zero-shot": {p: rows[:1] for p, rows in OUTCOMES["zero-shot"].items()}}  # 3 samples: 0..3
    fig = failure_plot(build([read_run(make_run(tmp_path, outcomes=one_each, samples=1))]))
    assert fig is not None
    ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_an_unmeasured_arm_draws_no_fast_p_line(tmp_path: Path):
    emulated = read_run(make_run(tmp_path, "emulated", {"zero-shot": OUTCOMES["agent:check+compile"]},
                                 device="cuda", ranks_per_gpu=2))
    timed = read_run(make_run(tmp_path, "timed", {"zero-shot": OUTCOMES["agent:check+compile"]}, device="cuda"))
    fig = fast_p_plot(build([timed, emulated], force=True))
    assert fig is not None
    ax = fig.axes[0]
    lines = {str(line.get_label()): line for line in ax.get_lines() if not str(line.get_label()).startswith("_")}
    assert set(lines) == {"timed/zero-shot", "emulated/zero-shot: not measured (emulated: ranks shared a GPU)"}
    assert np.size(lines["timed/zero-shot"].get_xdata()) == 61
    assert np.size(lines["emulated/zero-shot: not measured (emulated: ranks shared a GPU)"].get_xdata()) == 0
    box = ax.get_legend()
    assert box is not None
    legend = [t.get_text() for t in box.get_texts()]
    assert "emulated/zero-shot: not measured (emulated: ranks shared a GPU)" in legend
    only = fast_p_plot(build([emulated]))
    assert only is not None and "fast_p not measured" in [t.get_text() for t in only.axes[0].texts]
