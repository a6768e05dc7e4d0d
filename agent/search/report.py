"""`pkb report` on a search run: the morning report. Self-contained (the run report, agent/report/, is
about samples and conditions; a search is about an archive).

Per problem: the best kernel (the best by re-measured median of the re-measured ones, with that median, its
interval and its in-search figure beside it, and its roofline fraction; else the search's best, marked
unconfirmed), every re-measured kernel's two figures, its lineage
tree (from the fresh draft it descends from to it: each ancestor's speedup, what the model said it
changed, the inspirations it was shown, and how its other children fared), the verdicts of everything
tried, and why the problem stopped. For the search: its stop reason, what it spent against its budgets,
throughput (device busy fraction, candidates per device hour, seconds per candidate by stage) and a
figure of the best speedup of each problem against device hours spent.

Formats: markdown (figure written beside it, linked), HTML (one file, figure inline) and JSON (the data).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

from agent.search import rescore
from agent.search.archive import Archive, Candidate
from agent.search.layout import SearchDir, is_search_dir, load_config
from agent.search.loop import search_stop_reason
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

MAX_NOTE = 160


class SearchReportError(ValueError):
    """A folder that is not a search run, or an archive that cannot be read; one line."""


def is_search(path: Path) -> bool:
    return is_search_dir(path)


# -- the data ---------------------------------------------------------------------------------------------
def lineage(candidates: dict[int, Candidate], best: Candidate) -> list[dict[str, Any]]:
    """The chain from the fresh draft `best` descends from down to `best`, root first."""
    children: Counter[int] = Counter()
    outcomes: dict[int, Counter[str]] = {}
    for c in candidates.values():
        if c.parents:
            children[c.parents[0]] += 1
            outcomes.setdefault(c.parents[0], Counter())[_outcome(c)] += 1
    chain: list[Candidate] = []
    seen: set[int] = set()
    node: Candidate | None = best
    while node is not None and node.id not in seen:
        chain.append(node)
        seen.add(node.id)
        node = candidates.get(node.parents[0]) if node.parents else None
    chain.reverse()
    out = []
    for i, c in enumerate(chain):
        nxt = chain[i + 1].id if i + 1 < len(chain) else None
        others = Counter(outcomes.get(c.id, Counter()))
        if nxt is not None:
            others[_outcome(candidates[nxt])] -= 1
        out.append({"id": c.id, "seq": c.seq, "island": c.island, "speedup": c.speedup, "verdict": c.verdict,
                    "fraction": c.roofline_fraction, "inspirations": c.parents[1:], "note": "",
                    "children": children[c.id], "other_children": {k: v for k, v in sorted(others.items()) if v > 0}})
    return out


def _outcome(c: Candidate) -> str:
    if c.trusted:
        return "trusted"
    if c.correct:
        return "flagged"
    return c.verdict or "pending"


def build(path: Path) -> dict[str, Any]:
    directory = SearchDir(path)
    if not is_search_dir(path):
        raise SearchReportError(f"{path} is not a search run (no search.json)")
    config = load_config(directory)
    with Archive(directory.archive) as archive:
        rows = problem_rows(archive, config.problems, config.remeasure, config.device)
        every = {c.id: c for c in archive.candidates()}
        notes = {r["id"]: (r["note"] or "") for r in archive.rows(("id", "note"))}
        stats = throughput(archive, config.gpus_per_evaluation)
        series = timeline(archive)
        stop_reason = search_stop_reason(archive)
        sessions = archive.sessions()
    rescored = rescore.stored(directory)  # `pkb rescore RUN`, where it ran
    problems = []
    for row in rows:
        shown = row.reported.candidate if row.reported else row.best
        chain = lineage({k: v for k, v in every.items() if v.problem == row.problem}, shown) if shown else []
        for step in chain:
            step["note"] = _short(notes.get(step["id"], ""))
        problems.append({**_problem(row, chain, every),
                         "rescore": rescore.rescore_text(rescored.get(row.problem) or {})})
    spent = {"candidates": stats["candidates"], "gpu_hours": stats["device_s"] / 3600.0,
             "cost_usd": sum(p["cost_usd"] for p in problems), "tokens": sum(p["tokens"] for p in problems),
             "wall_hours": stats["wall_s"] / 3600.0}
    return {
        "schema": "pkb-search-report/1", "run_id": path.name, "path": str(path),
        "config": config.model_dump(mode="json"), "started_at": sessions[0]["started_at"] if sessions else None,
        "stop_reason": stop_reason, "budget": config.budget.given(),
        "per_problem_budget": config.per_problem.given(),
        "spent": spent, "cost_known": all(p["cost_known"] for p in problems), "throughput": stats,
        "problems": problems,
        "timeline": {p: [{"device_hours": pt["device_hours"], "speedup": pt["speedup"], "fraction": pt["fraction"],
                          "elapsed_s": pt["elapsed_s"]} for pt in pts] for p, pts in series.items()},
        "sessions": len(sessions),
    }


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_NOTE else text[:MAX_NOTE - 3] + "..."


def _problem(row: ProblemRow, chain: list[dict[str, Any]], every: dict[int, Candidate]) -> dict[str, Any]:
    reported = row.reported
    best = headline_best(row)  # what the terminal and live.html call the best: the same function
    return {
        "problem": row.problem, "decided": row.decided, "evaluated": row.evaluated, "correct": row.correct,
        "trusted": row.trusted, "verdicts": dict(sorted(row.verdicts.items())),
        "stop": {"reason": row.stop.reason, "at_slot": row.stop.at_slot, "detail": row.stop.detail} if row.stop
        else None,
        "bound_ms": row.bound_ms, "binding": row.binding,
        "best": None if best is None else {
            "candidate": best.candidate.id,
            "confirmed": best.confirmed,
            "speedup": best.speedup,
            "fraction": best.fraction,
            "text": best_text(best),
            "rescored_speedup": reported.speedup if reported else None,
            "rescored_fraction": reported.fraction if reported else None,
            "rescore_seeds": reported.seeds if reported else [],
            "search_speedup": best.in_search,
            "interval": interval_text(best if best.confirmed else None),
            "remeasured": best.remeasured.record() if best.remeasured else None,
            "source": best.candidate.source,
        },
        "figures": figures_line(row),
        "remeasured": [{"candidate": i, "search_speedup": every[i].speedup if i in every else None,
                        **m.record()} for i, m in sorted(row.remeasured.items())],
        "rescore_failed": row.rescore_failed, "lineage": chain,
        "gpu_hours": row.gpu_s / 3600.0, "tokens": row.tokens, "cost_usd": row.cost_usd, "cost_known": row.cost_known,
    }


# -- the figure -------------------------------------------------------------------------------------------
def figure_png(report: dict[str, Any]) -> bytes:
    """Best trusted speedup of each problem against the device hours the search had spent."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.add_subplot()
    drawn = False
    for i, (name, points) in enumerate(sorted(report["timeline"].items())):
        xs = [p["device_hours"] for p in points if p["speedup"] is not None]
        ys = [p["speedup"] for p in points if p["speedup"] is not None]
        if xs:
            ax.step(xs, ys, where="post", label=name, color=f"C{i % 10}", linewidth=2)
            drawn = True
    if drawn:
        ax.set_yscale("log")
        ax.axhline(1.0, color="#999999", linestyle="--", linewidth=0.8)
        ax.legend(loc="lower right", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no trusted kernel yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("device hours spent (all evaluations, x ranks)")
    ax.set_ylabel("best trusted speedup")
    ax.set_title("best speedup per problem against device hours")
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


# -- text -------------------------------------------------------------------------------------------------
_x = speedup_text
_f = percent_text


def _s(v: float | None) -> str:
    return f"{v:.3g} s" if v is not None else "-"


def tree_lines(chain: list[dict[str, Any]]) -> list[str]:
    lines = []
    for depth, step in enumerate(chain):
        lead = "    " * max(depth - 1, 0) + ("└── " if depth else "")
        what = f"#{step['id']} {_x(step['speedup'])}"
        if step["island"] is not None:
            what += f" (island {step['island']})"
        if step["inspirations"]:
            what += f", inspired by {', '.join('#' + str(i) for i in step['inspirations'])}"
        others = step["other_children"]
        if others:
            what += "; other children: " + ", ".join(f"{n} {k}" for k, n in others.items())
        if step["note"]:
            what += f" — {step['note']}"
        lines.append(lead + what)
    return lines


def _throughput_lines(t: dict[str, Any]) -> list[str]:
    per = t["seconds_per_candidate"]
    proposer = t.get("proposer_device_s") or 0.0
    tools = f"; the proposer's tools held devices {proposer / 3600:.4f} device-hours" if proposer else ""
    return [
        f"- wall {t['wall_s'] / 3600:.3f} h over the sessions; {t['candidates']} candidates, {t['evaluations']} "
        f"evaluations ({t['rescores']} of them rescores); capacity {t['capacity']:.3g} evaluation(s) at once"
        + tools,
        f"- devices busy {_f(t['busy_fraction'])}; {t['candidates_per_device_hour'] or 0:.1f} candidates per device "
        f"hour; {t['candidates_per_hour'] or 0:.1f} candidates per hour",
        "- seconds per candidate: " + ", ".join(f"{k} {_s(v)}" for k, v in per.items()),
    ]


def _notes(report: dict[str, Any]) -> list[str]:
    """What to know before reading the table: what "best" is, and on CPU what a speedup is worth."""
    note = timing_note(report["config"]["device"])
    return [f"{BEST_NOTE}.", *([f"{note}."] if note else [])]


def to_markdown(report: dict[str, Any], figure_link: str | None = None) -> str:
    c = report["config"]
    spent = report["spent"]
    out = [f"# Search {report['run_id']}", "",
           f"{c['strategy']['name']} search with `{c['model']}` (proposer `{c['proposer']}`) on {c['device']}, "
           f"W={c['world_size']}, shape "
           f"`{c['shape']}`, seed {c['seed']}. Stopped: **{report['stop_reason']}** ({report['sessions']} "
           "session(s)).", "",
           *_notes(report), "",
           "| problem | best | in-search | interval | roofline | bound by | candidates | correct | trusted | "
           "stop |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in report["problems"]:
        b = p["best"]
        out.append(f"| {p['problem']} | {b['text'] if b else '-'} | {_x(b['search_speedup']) if b else '-'} | "
                   f"{b['interval'] if b else '-'} | {_f(b['fraction']) if b else '-'} | "
                   f"{p['binding'] or '-'} | {p['decided']} | "
                   f"{p['correct']} | {p['trusted']} | {p['stop']['reason'] if p['stop'] else 'searching'} |")
    out += ["", *(f"- {p['figures']}" for p in report["problems"])]
    out += ["", "## Spent", "",
            f"- candidates {spent['candidates']}, device hours {spent['gpu_hours']:.4f}, tokens {spent['tokens']:,}, "
            + (f"${spent['cost_usd']:.2f}" if report["cost_known"] else "dollars n/a (model not in the price table)")
            + f", wall {spent['wall_hours']:.3f} h",
            f"- budget: {report['budget'] or 'none'}; per problem: {report['per_problem_budget'] or 'none'}", "",
            "## Throughput", "", *_throughput_lines(report["throughput"]), ""]
    if figure_link:
        out += [f"![best speedup against device hours]({figure_link})", ""]
    for p in report["problems"]:
        out += [f"## {p['problem']}", ""]
        verdicts = ", ".join(f"{k} {v}" for k, v in p["verdicts"].items())
        out.append(f"Tried {p['decided']} candidates: {verdicts or 'none evaluated'}.")
        if p["stop"]:
            out.append(f"Stopped at slot {p['stop']['at_slot']}: {p['stop']['reason']} "
                       f"{json.dumps(p['stop']['detail'])}.")
        if p["rescore_failed"]:
            out.append("Fast on the search's seed but not confirmed on fresh seeds: "
                       + ", ".join(f"#{i}" for i in p["rescore_failed"]) + ".")
        if p["rescore"]:
            out.append(f"`pkb rescore`: {p['rescore']}.")
        if p["remeasured"]:
            out += ["", "Re-measured (the reported one is the best by its re-measured median):", "",
                    "| kernel | in-search | re-measured | seeds |", "|---|---|---|---|",
                    *(f"| #{m['candidate']} | {_x(m['search_speedup'])} | {m['text']} | "
                      f"{', '.join(str(x) for x in m['seeds'])} |" for m in p["remeasured"])]
        if p["lineage"]:
            out += ["", "Lineage of the best kernel:", "", "```", *tree_lines(p["lineage"]), "```"]
        if p["best"] and p["best"]["source"]:
            out += ["", f"Best kernel (#{p['best']['candidate']}):", "", "```python", p["best"]["source"].rstrip(),
                    "```"]
        out.append("")
    return "\n".join(out)


def to_html(report: dict[str, Any]) -> str:
    """One self-contained file: inline CSS, the figure as base64 PNG, no script."""
    esc = html.escape
    png = base64.b64encode(figure_png(report)).decode("ascii")
    c = report["config"]
    spent = report["spent"]
    head = ("problem", "best", "in-search", "interval", "roofline", "bound by", "candidates", "correct", "trusted",
            "stop")
    rows = []
    for p in report["problems"]:
        b = p["best"]
        cells = (p["problem"], b["text"] if b else "-", _x(b["search_speedup"]) if b else "-",
                 b["interval"] if b else "-", _f(b["fraction"]) if b else "-", p["binding"] or "-",
                 str(p["decided"]), str(p["correct"]), str(p["trusted"]),
                 p["stop"]["reason"] if p["stop"] else "searching")
        rows.append("<tr>" + "".join(f"<td>{esc(x)}</td>" for x in cells) + "</tr>")
    sections = []
    for p in report["problems"]:
        part = [f"<h2>{esc(p['problem'])}</h2>",
                "<p>" + esc(", ".join(f"{k} {v}" for k, v in p["verdicts"].items()) or "nothing evaluated") + "</p>"]
        if p["stop"]:
            part.append(f"<p>stopped at slot {p['stop']['at_slot']}: {esc(p['stop']['reason'])} "
                        f"<code>{esc(json.dumps(p['stop']['detail']))}</code></p>")
        if p["rescore_failed"]:
            part.append("<p>not confirmed on fresh seeds: " + esc(", ".join(f"#{i}" for i in p["rescore_failed"]))
                        + "</p>")
        if p["rescore"]:
            part.append(f"<p><code>pkb rescore</code>: {esc(p['rescore'])}</p>")
        if p["remeasured"]:
            part.append("<h3>re-measured (the reported one is the best by its re-measured median)</h3><table><tr>"
                        "<th>kernel</th><th>in-search</th><th>re-measured</th><th>seeds</th></tr>"
                        + "".join(f"<tr><td>#{m['candidate']}</td><td>{esc(_x(m['search_speedup']))}</td>"
                                  f"<td>{esc(m['text'])}</td><td>{esc(', '.join(str(x) for x in m['seeds']))}</td></tr>"
                                  for m in p["remeasured"]) + "</table>")
        if p["lineage"]:
            part.append("<h3>lineage of the best kernel</h3><pre>" + esc("\n".join(tree_lines(p["lineage"])))
                        + "</pre>")
        if p["best"] and p["best"]["source"]:
            part.append(f"<details><summary>best kernel #{p['best']['candidate']}</summary><pre>"
                        f"{esc(p['best']['source'])}</pre></details>")
        sections.append("\n".join(part))
    return "\n".join([
        "<!doctype html><html><head><meta charset='utf-8'>", f"<title>search {esc(report['run_id'])}</title>",
        "<style>body{font-family:sans-serif;margin:1.5em;max-width:80em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px}th{background:#f4f4f4}pre{background:#f6f6f6;padding:.6em;"
        "overflow-x:auto}</style></head><body>",
        f"<h1>search {esc(report['run_id'])}</h1>",
        f"<p>{esc(c['strategy']['name'])} search with <code>{esc(c['model'])}</code> (proposer "
        f"<code>{esc(c['proposer'])}</code>) on {esc(c['device'])}, "
        f"W={c['world_size']}, shape <code>{esc(c['shape'])}</code>, seed {c['seed']}. Stopped: "
        f"<b>{esc(report['stop_reason'])}</b>.</p>",
        "".join(f"<p>{esc(note)}</p>" for note in _notes(report)),
        "<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>", *rows, "</table>",
        "<ul>" + "".join(f"<li>{esc(p['figures'])}</li>" for p in report["problems"]) + "</ul>",
        f"<p>spent: {spent['candidates']} candidates, {spent['gpu_hours']:.4f} device hours, {spent['tokens']:,} "
        f"tokens, " + (f"${spent['cost_usd']:.2f}" if report["cost_known"] else "dollars n/a") +
        f", {spent['wall_hours']:.3f} h wall</p>",
        "<ul>" + "".join(f"<li>{esc(line[2:])}</li>" for line in _throughput_lines(report["throughput"])) + "</ul>",
        f'<img alt="best speedup against device hours" src="data:image/png;base64,{png}">',
        *sections, "</body></html>"])


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, default=str)


def render(path: Path, fmt: str, out: Path | None) -> str:
    """The report of the search at `path` in `fmt`; markdown written to `out` gets its figure beside it."""
    report = build(path)
    if fmt == "json":
        return to_json(report)
    if fmt == "html":
        return to_html(report)
    link = None
    if out is not None:
        figure = out.parent / f"{out.stem}_figures" / "speedup_vs_device_hours.png"
        figure.parent.mkdir(parents=True, exist_ok=True)
        figure.write_bytes(figure_png(report))
        link = f"{figure.parent.name}/{figure.name}"
    return to_markdown(report, link)
