"""The report's figures as PNG bytes (matplotlib's Agg canvas: no display needed).

A figure with nothing to draw is not drawn: its builder returns None and the section says so in one line
(`Figure.no_data`) instead of showing an empty plot.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure as MplFigure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from agent.report import trajectories
from agent.report.accounting import NOT_MEASURED
from agent.report.build import Report
from agent.report.matrix_figure import matrix_figure


def _png(fig: MplFigure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def fast_p_figure(report: Report) -> bytes | None:
    fig = fast_p_plot(report)
    return None if fig is None else _png(fig)


def fast_p_plot(report: Report) -> MplFigure | None:
    """The fast_p curve of every arm that measured speed; an arm that did not is named in the legend as not
    measured (with why), never drawn as a line of zeros."""
    arms = [a for a in report.data["arms"] if a["problems"]]
    if not arms:
        return None
    fig = MplFigure(figsize=(7.5, 3.6))
    ax = fig.add_subplot()
    k = report.k
    for i, arm in enumerate(report.data["arms"]):
        reason = arm.get("speed", {}).get("not_measured")
        if reason:  # an empty entry in the arm's colour: the legend says why there is no line
            ax.plot([], [], label=f"{arm['label']}: {NOT_MEASURED} ({reason})", color=f"C{i % 10}",
                    linestyle=":")
            continue
        curve = np.asarray(arm["fast_p_curve"], dtype=float)
        ax.plot(curve[:, 0], curve[:, 1], label=arm["label"], linewidth=2, color=f"C{i % 10}")
    if all(a.get("speed", {}).get("not_measured") for a in report.data["arms"]):
        ax.text(1.5, 0.5, f"fast_p {NOT_MEASURED}", ha="center", va="center", fontsize="x-large", color="#777777")
    for p in (1.0, 1.5):
        ax.axvline(p, color="#999999", linestyle="--", linewidth=0.8)
    ax.set_xlim(0, 3)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("speedup threshold p")
    ax.set_ylabel(f"fast_p@{k}")
    cpu = any(a.get("device") == "cpu" for a in report.data["arms"])
    ax.set_title(f"fast_p@{k}: share of problems with a correct sample faster than p x the reference"
                 + ("\n(CPU timings: they prove the plumbing, not a GPU kernel's speed)" if cpu else ""))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    return fig


def _minor_speedup_label(ax: Any, value: float) -> str:
    """A minor tick's label on a log speedup axis: every one over less than a decade, only 2x and 5x multiples
    over more (the eight minor ticks of each decade overlap there: 2,000 samples spread over 0.2-4x did)."""
    low, high = ax.get_ylim()
    if value <= 0 or low <= 0:
        return ""
    lead = round(value / 10 ** math.floor(math.log10(value)), 6)
    if math.log10(high / low) > 1 and lead not in (2.0, 5.0):
        return ""
    return f"{value:g}x"


def _strip_figure(report: Report, key: str, ylabel: str, title: str, log: bool) -> bytes | None:
    arms = report.data["arms"]
    series = [[v for v in a[key] if v is not None and (v > 0 or not log)] for a in arms]
    if not any(series):
        return None
    fig = MplFigure(figsize=(7.5, 3.4))
    ax = fig.add_subplot()
    rng = np.random.default_rng(0)  # fixed jitter: the same run gives the same picture
    for i, values in enumerate(series):
        if values:
            ax.boxplot([values], positions=[i], widths=0.5, showfliers=False,
                       medianprops={"color": "#333333"})
            ax.scatter(i + rng.uniform(-0.15, 0.15, len(values)), values, s=14, alpha=0.7, zorder=3,
                       color=f"C{i % 10}")  # the arm's colour in the fast_p plot
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: _minor_speedup_label(ax, v)))
        ax.axhline(1.0, color="#999999", linestyle="--", linewidth=0.8)
    else:
        ax.set_ylim(0, 1.05)
    ax.set_xticks(range(len(arms)), [a["label"] for a in arms], rotation=15, fontsize="small")
    ax.set_xlim(-0.6, len(arms) - 0.4)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def speedup_figure(report: Report) -> bytes | None:
    cpu = any(a.get("device") == "cpu" for a in report.data["arms"])
    return _strip_figure(report, "speedups", "speedup (log scale)",
                         "speedup of correct samples" + (" (CPU: plumbing only)" if cpu else ""), log=True)


def roofline_figure(report: Report) -> bytes | None:
    return _strip_figure(report, "roofline_fractions", "fraction of the roofline bound",
                         "roofline fraction of correct samples", log=False)


FAILURE_COLOURS = {"correct": "#2ca02c", "no code": "#7f7f7f", "infrastructure": "#bcbd22"}


def failure_figure(report: Report) -> bytes | None:
    fig = failure_plot(report)
    return None if fig is None else _png(fig)


def failure_plot(report: Report) -> MplFigure | None:
    """Verdicts per arm as stacked bars; the count axis has whole-number ticks only."""
    arms = report.data["arms"]
    labels = [lab for lab in arms[0]["failures"] if any(a["failures"].get(lab, 0) for a in arms)] if arms else []
    if not labels:
        return None
    fig = MplFigure(figsize=(7.5, 0.6 + 0.45 * max(len(arms), 1) + 0.4))
    ax = fig.add_subplot()
    left = np.zeros(len(arms))
    palette = ["#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#aec7e8"]
    for i, lab in enumerate(labels):
        counts = np.array([a["failures"].get(lab, 0) for a in arms], dtype=float)
        ax.barh(range(len(arms)), counts, left=left, label=lab,
                color=FAILURE_COLOURS.get(lab, palette[i % len(palette)]))
        left += counts
    ax.set_yticks(range(len(arms)), [a["label"] for a in arms], fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("finished samples")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # samples are counted: no 2.5 tick
    ax.set_title("verdicts (PKB's failure classes)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize="small", frameon=False)
    return fig


def matrix_png(report: Report) -> bytes | None:
    fig = matrix_figure(report)
    return None if fig is None else _png(fig)


def trajectory_figure(report: Report) -> bytes | None:
    """Pass and median best speedup against turn, tokens and dollars, per arm (agent.report.trajectories)."""
    arms = [a for a in report.data.get("trajectories") or []
            if any(a["curves"][by]["turn"] for by in ("tools", "rescored"))]
    if not arms:
        return None
    fig = MplFigure(figsize=(11, 5.6))
    axes = fig.subplots(2, len(trajectories.AXES))
    palette = [f"C{i}" for i in range(10)]
    for i, arm in enumerate(arms):
        for by, style in (("tools", "-"), ("rescored", "--")):
            for col, (axis, title) in enumerate(trajectories.AXES):
                points = arm["curves"][by][axis]
                if not points:
                    continue
                xs = [p["x"] for p in points]
                label = f"{arm['label']} ({'tools' if by == 'tools' else 'final scorer'})" if col == 0 else None
                axes[0][col].step(xs, [p["pass"] for p in points], style, where="post", color=palette[i % 10],
                                  label=label)
                axes[1][col].step(xs, [p["best_speedup"] for p in points], style, where="post",
                                  color=palette[i % 10])
                axes[1][col].set_xlabel(title)
                if axis == "turn":  # turns are counted: whole-number ticks only
                    for row in (0, 1):
                        axes[row][col].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0][0].set_ylabel("share with a correct candidate")
    axes[1][0].set_ylabel("median best speedup so far")
    for ax in axes[0]:
        ax.set_ylim(-0.02, 1.02)
    fig.legend(loc="lower center", ncol=2, fontsize="small", frameon=False, bbox_to_anchor=(0.5, -0.08))
    fig.suptitle("pass and best speedup against turn, tokens and dollars")
    return _png(fig)


@dataclass(frozen=True)
class Figure:
    alt: str  # the image's alt text
    draw: Callable[[Report], bytes | None]
    no_data: str  # the line shown instead when there is nothing to draw


FIGURES: dict[str, Figure] = {  # by file stem
    "fast_p": Figure("fast_p curve", fast_p_figure, "No problem has enough finished samples for a fast_p curve."),
    "speedup": Figure("speedup distribution", speedup_figure,
                      "No correct sample has a counted speedup: no speedup distribution to plot."),
    "roofline": Figure("roofline-fraction distribution", roofline_figure,
                       "No correct sample has a roofline fraction: no distribution to plot."),
    "failures": Figure("failure-class breakdown", failure_figure, "No finished sample: no verdicts to plot."),
    "matrix": Figure("condition matrix", matrix_png, "One arm only: no matrix of runs and conditions to plot."),
    "trajectory": Figure("pass and best speedup by turn, tokens and dollars", trajectory_figure,
                         "No sample has a trajectory (candidates with their turn): nothing to plot."),
}


def draw_all(report: Report) -> dict[str, bytes | None]:
    """Every figure's PNG, None for those with nothing to draw."""
    return {stem: figure.draw(report) for stem, figure in FIGURES.items()}


def write_figures(report: Report, directory: Path) -> dict[str, Path]:
    """Write every figure that has data as PNG into `directory`; returns stem -> path."""
    out: dict[str, Path] = {}
    for stem, png in draw_all(report).items():
        if png is None:
            continue
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{stem}.png"
        path.write_bytes(png)
        out[stem] = path
    return out
