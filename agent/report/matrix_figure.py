"""The matrix of a sweep as a heatmap: a row per run (a model, in a sweep), a column per condition, each cell
coloured by pass@k and annotated with pass@k and fast_1@k. agent.report.figures turns it into PNG bytes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from matplotlib.figure import Figure as MplFigure

from agent.report.accounting import NOT_MEASURED
from agent.report.build import Report, run_labels


def _cell(arm: dict[str, Any], key: str) -> float:
    iv = arm[key]
    return math.nan if iv["n"] == 0 or iv["mean"] is None else float(iv["mean"])


def matrix(report: Report) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """Row labels (runs), column labels (conditions), pass@k and fast_1@k per cell (NaN where no arm)."""
    labels = dict(zip((r.path for r in report.runs), run_labels(report.runs), strict=True))
    rows = list(dict.fromkeys(labels[a.run.path] for a in report.arms))
    cols = list(dict.fromkeys(a.condition for a in report.arms))
    passed = np.full((len(rows), len(cols)), math.nan)
    fast = np.full((len(rows), len(cols)), math.nan)
    for arm, data in zip(report.arms, report.data["arms"], strict=True):
        i, j = rows.index(labels[arm.run.path]), cols.index(arm.condition)
        passed[i, j] = _cell(data, "pass_at_k")
        fast[i, j] = _cell(data, "fast_1_at_k")
    return rows, cols, passed, fast


def matrix_figure(report: Report) -> MplFigure | None:
    """None with fewer than two arms (nothing to compare) or no finished problem."""
    rows, cols, passed, fast = matrix(report)
    if len(report.arms) < 2 or np.all(np.isnan(passed)):
        return None
    fig = MplFigure(figsize=(max(4.5, 1.6 * len(cols) + 2.5), max(2.2, 0.7 * len(rows) + 1.4)))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(passed), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            if math.isnan(passed[i, j]):
                ax.text(j, i, "—", ha="center", va="center", color="#555555")
                continue
            colour = "white" if passed[i, j] < 0.6 else "black"
            fast_text = NOT_MEASURED if math.isnan(fast[i, j]) else f"{fast[i, j]:.2f}"
            ax.text(j, i, f"{passed[i, j]:.2f}\nfast {fast_text}", ha="center", va="center", color=colour,
                    fontsize="small")
    ax.set_xticks(range(len(cols)), cols, rotation=20, ha="right", fontsize="small")
    ax.set_yticks(range(len(rows)), rows, fontsize="small")
    ax.set_title(f"pass@{report.k} (colour) and fast_1@{report.k} per run and condition")
    fig.colorbar(image, ax=ax, label=f"pass@{report.k}")
    return fig
