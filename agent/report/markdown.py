"""The report as markdown: tables, and links to the figures written beside it (markdown carries no images)."""

from __future__ import annotations

from agent.report import trajectories
from agent.report.accounting import INCOMPLETE_HELP, INCOMPLETE_TITLE
from agent.report.build import Report
from agent.report.figures import FIGURES
from agent.report.paper import arm_table, comparison_rows, method_note, pair_table
from agent.report.rows import (
    ONE_PROBLEM_NOTE,
    category_rows,
    curve_rows,
    distribution_rows,
    failure_rows,
    headline_rows,
    one_problem_means,
    problem_rows,
    run_rows,
)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _figure(stem: str, figures: dict[str, str] | None) -> list[str]:
    """The figure's image link; the line saying it has no data where it was not written; nothing without
    figures (markdown on stdout carries the tables only)."""
    if figures is None:
        return []
    if stem in figures:
        return [f"![{FIGURES[stem].alt}]({figures[stem]})", ""]
    return [FIGURES[stem].no_data, ""]


def to_markdown(report: Report, figures: dict[str, str] | None = None) -> str:
    """The report as markdown. `figures` maps the stem of each figure written (figures.write_figures) to its
    link; None: no figures at all."""
    d = report.data
    k = report.k
    title = f"# pkb-agent report ({len(d['runs'])} run{'s' if len(d['runs']) != 1 else ''})"
    out = [title + (f" — {INCOMPLETE_TITLE.lower()}" if d.get("incomplete") else ""), ""]
    for line in d.get("incomplete", []):  # before any number: what the numbers leave out
        out += [f"**{INCOMPLETE_TITLE}.** {line}.", ""]
    if d.get("incomplete"):
        out += [f"Where problems were left out, {INCOMPLETE_HELP}.", ""]
    out.append(md_table(*run_rows(report)))
    out += ["", "## Headline", "",
            f"Means over the judged problems with a {d['level']:.0%} bootstrap interval (percentile method, "
            f"{d['resamples']} resamples of problems, seed {d['seed']}); k = {k}. fast_p counts samples that "
            "are correct and faster than p times the reference.", "", md_table(*headline_rows(report))]
    if one_problem_means(report):
        out.append(f"\nNote: {ONE_PROBLEM_NOTE}.")
    for note in d["notes"]:
        out.append(f"\nNote: {note}.")
    if d["comparisons"]:
        out += ["", "## Comparison", "", method_note(report), "", md_table(*comparison_rows(report))]
    out += ["", "## Compact table (for a paper; `--format tex` for LaTeX)", ""]
    out += _figure("matrix", figures)
    out += [md_table(*arm_table(report))]
    if d["comparisons"]:
        out += ["", md_table(*pair_table(report))]
    out += ["", f"## fast_p curve (k = {k})", ""]
    out += _figure("fast_p", figures)
    out += [md_table(*curve_rows(report))]
    out += ["", "## Speedup and roofline-fraction distributions (correct samples)", ""]
    for stem in ("speedup", "roofline"):
        out += _figure(stem, figures)
    out += [md_table(*distribution_rows(report))]
    out += ["", "## Failure classes", ""]
    out += _figure("failures", figures)
    out += [md_table(*failure_rows(report))]
    out += ["", "## Held-out shapes, best candidate, trajectories", "", trajectories.NOTE, ""]
    out += _figure("trajectory", figures)
    out += [md_table(*trajectories.rows(report))]
    out += ["", "## Per category", "", md_table(*category_rows(report))]
    out += ["", "## Per problem", "", md_table(*problem_rows(report))]
    out += ["", "Transcripts: see the HTML report (`pkb report RUN --format html`).", ""]
    return "\n".join(out)
