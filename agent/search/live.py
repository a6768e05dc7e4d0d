"""The live view of a running search: a rich table on the terminal, and runs/<id>/live.html, which refreshes
itself (open it in a browser, or over the cluster's file share) and plots the best speedup and roofline
fraction of each problem over time.

Both are rebuilt from the archive (agent.search.summary), at most every `every_s` seconds while the
search runs and once more at the end; the page is written atomically, so a browser never reads half of it.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from agent.rundir import write_text_atomic
from agent.search.archive import Archive
from agent.search.config import SearchConfig
from agent.search.layout import SearchDir
from agent.search.summary import (
    BEST_NOTE,
    ProblemRow,
    best_text,
    figures_line,
    headline_best,
    interval_text,
    percent_text,
    problem_rows,
    speedup_text,
    throughput,
    timeline,
)
from harness.common.flags import timing_note
from harness.common.terminal import terminal_safe

REFRESH_S = 10  # the page's own refresh
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


def _status(row: ProblemRow) -> str:
    return row.stop.reason if row.stop else "searching"


def _cost(row: ProblemRow) -> str:
    return f"${row.cost_usd:.2f}" if row.cost_known else "n/a"


def cells(row: ProblemRow) -> list[str]:
    best = headline_best(row)
    return [
        row.problem, str(row.decided), f"{row.correct}/{row.evaluated}", str(row.trusted), best_text(best),
        speedup_text(best.in_search if best else None), interval_text(best if best and best.confirmed else None),
        percent_text(best.fraction if best else None), row.binding or "-", f"{row.gpu_s / 3600:.3f}",
        f"{row.tokens:,}", _cost(row), _status(row),
    ]


HEADERS = ("problem", "candidates", "correct", "trusted", "best", "in-search", "interval", "roofline", "bound by",
           "device h", "tokens", "cost", "status")


# The terminal shows the columns that matter most at a glance (the page shows them all).
TERMINAL = ("problem", "candidates", "correct", "best", "in-search", "interval", "roofline", "status")


def table(directory: SearchDir, config: SearchConfig, archive: Archive) -> Table:
    caption = timing_note(config.device)
    t = Table(title=Text(terminal_safe(f"search {directory.path.name} ({config.strategy.name}, {config.model})")),
              caption=caption)
    keep = [HEADERS.index(h) for h in TERMINAL]
    for i in keep:
        t.add_column(HEADERS[i], overflow="fold", no_wrap=HEADERS[i] == "problem")  # a name stays whole
    for row in problem_rows(archive, config.problems, config.remeasure, config.device):
        values = cells(row)  # a stop reason can quote a model or a candidate: shown as text, never obeyed
        t.add_row(*(Text(terminal_safe(values[i])) for i in keep))
    return t


# -- the page ---------------------------------------------------------------------------------------------
def svg_chart(series: dict[str, list[tuple[float, float | None]]], *, title: str, xlabel: str, ylabel: str,
              tick: Callable[[float], str], log_y: bool = False, width: int = 640, height: int = 260) -> str:
    """A step chart (best so far) of each series, as inline SVG: no figure library, cheap to redraw. The
    legend is a column right of the plot, never over a line; `tick` writes the y axis's labels."""
    import math

    points = [(x, y) for pts in series.values() for x, y in pts if y is not None and (y > 0 or not log_y)]
    if not points:
        return f"<p><em>{html.escape(title)}: nothing trusted yet</em></p>"
    left, right, top, bottom = 74, 150, 24, 36
    xs = [p[0] for p in points]
    ys = [math.log10(p[1]) if log_y else p[1] for p in points]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = min(ys), max(ys) if max(ys) > min(ys) else min(ys) + 1
    span_y = y1 - y0
    y0, y1 = y0 - 0.05 * span_y, y1 + 0.05 * span_y

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def py(y: float) -> float:
        v = math.log10(y) if log_y else y
        return top + (1 - (v - y0) / (y1 - y0)) * (height - top - bottom)

    mid_y = (top + height - bottom) / 2
    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" '
             f'style="font:11px sans-serif">',
             f'<text x="{left}" y="14" style="font-weight:bold">{html.escape(title)}</text>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#999"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#999"/>',
             f'<text x="{(left + width - right) / 2}" y="{height - 6}" text-anchor="middle">'
             f'{html.escape(xlabel)}</text>',
             f'<text x="12" y="{mid_y:.1f}" text-anchor="middle" transform="rotate(-90 12 {mid_y:.1f})">'
             f'{html.escape(ylabel)}</text>']
    for frac in (0.0, 0.5, 1.0):
        value = y0 + frac * (y1 - y0)
        label = 10 ** value if log_y else value
        parts.append(f'<text x="{left - 4}" y="{py(label) + 4:.1f}" text-anchor="end">'
                     f'{html.escape(tick(label))}</text>')
        xv = x0 + frac * (x1 - x0)
        anchor = {0.0: "start", 0.5: "middle", 1.0: "end"}[frac]  # the first clear of the y axis's lowest label
        parts.append(f'<text x="{px(xv):.1f}" y="{height - bottom + 14}" text-anchor="{anchor}">{xv:.3g}</text>')
    for i, (name, pts) in enumerate(sorted(series.items())):
        color = COLORS[i % len(COLORS)]
        path = []
        last_y: float | None = None
        for x, y in pts:
            if y is None or (log_y and y <= 0):
                continue
            if last_y is not None:
                path.append(f"{px(x):.1f},{py(last_y):.1f}")
            path.append(f"{px(x):.1f},{py(y):.1f}")
            last_y = y
        if path:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{" ".join(path)}"/>')
        key_y = top + 14 * i + 6
        parts.append(f'<line x1="{width - right + 10}" y1="{key_y}" x2="{width - right + 26}" y2="{key_y}" '
                     f'stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{width - right + 30}" y="{key_y + 4}" fill="{color}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def page(directory: SearchDir, config: SearchConfig, archive: Archive, *, final: bool) -> str:
    rows = problem_rows(archive, config.problems, config.remeasure, config.device)
    lines = timeline(archive)
    speed = {p: [((pt["elapsed_s"] or 0.0) / 3600.0, pt["speedup"]) for pt in pts] for p, pts in lines.items()}
    frac = {p: [((pt["elapsed_s"] or 0.0) / 3600.0, pt["fraction"]) for pt in pts] for p, pts in lines.items()}
    stats = throughput(archive, config.gpus_per_evaluation)
    refresh = "" if final else f'<meta http-equiv="refresh" content="{REFRESH_S}">'
    body = ["<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS) + "</tr>"]
    body += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells(r)) + "</tr>" for r in rows]
    busy = stats["busy_fraction"]
    return "\n".join([
        "<!doctype html><html><head><meta charset='utf-8'>", refresh,
        f"<title>search {html.escape(directory.path.name)}</title>",
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}</style></head><body>",
        f"<h1>search {html.escape(directory.path.name)}</h1>",
        f"<p>{html.escape(config.strategy.name)} search with {html.escape(config.model)} (proposer "
        f"{html.escape(config.proposer)}) on {config.device}, "
        f"W={config.world_size}, shape {html.escape(config.shape)}. "
        f"{'Finished' if final else 'Running'}: {stats['candidates']} candidates in "
        f"{stats['wall_s'] / 3600:.2f} h; devices busy {percent_text(busy)}; updated "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}.</p>",
        "<table>", *body, "</table>",
        "<ul>" + "".join(f"<li>{html.escape(figures_line(r))}</li>" for r in rows) + "</ul>",
        f"<p>{html.escape(BEST_NOTE)}.</p>",
        *([f"<p><b>{html.escape(note)}.</b></p>"] if (note := timing_note(config.device)) else []),
        svg_chart(speed, title="best trusted speedup", xlabel="hours running", ylabel="speedup", tick=speedup_text,
                  log_y=True),
        svg_chart(frac, title="roofline fraction of that kernel", xlabel="hours running",
                  ylabel="% of the roofline bound", tick=percent_text, log_y=True),
        "</body></html>",
    ])


class LiveView:
    """Throttled updates of the terminal table and the page; use as a context manager around the search."""

    def __init__(self, directory: SearchDir, config: SearchConfig, *, console: Console | None = None,
                 terminal: bool = False, every_s: float = 5.0) -> None:
        self.directory = directory
        self.config = config
        self.console = console or Console()
        self.terminal = terminal
        self.every_s = every_s
        self._last = 0.0
        self._lock = threading.Lock()
        self._live: Live | None = None

    def __enter__(self) -> LiveView:
        if self.terminal:
            self._live = Live(Table(title=f"search {self.directory.path.name}: starting"), console=self.console,
                              refresh_per_second=1, transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.directory.archive.is_file():  # the final picture, from the archive as the search left it
            with Archive(self.directory.archive) as archive:
                self.update(archive, force=True)
        self.stop()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def update(self, archive: Archive, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        if not self._lock.acquire(blocking=force):
            return  # another thread is drawing it now
        try:
            self._last = now
            if self._live is not None:
                self._live.update(table(self.directory, self.config, archive))
            write_text_atomic(self.directory.live_html, page(self.directory, self.config, archive, final=force))
        finally:
            self._lock.release()


def print_summary(directory: SearchDir, config: SearchConfig, console: Console) -> None:
    """The table (its caption says what a CPU timing is worth), then per problem its reported kernel's in-search
    and re-measured figures (summary.figures_line)."""
    with Archive(directory.archive) as archive:
        console.print(table(directory, config, archive))
        rows = problem_rows(archive, config.problems, config.remeasure, config.device)
    for row in rows:
        console.print(figures_line(row), markup=False, highlight=False, soft_wrap=True)
