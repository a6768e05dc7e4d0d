"""The report as one self-contained HTML file: the tables, the figures inline as base64 PNG, a transcript
viewer per sample, and the style sheet report.css inline. No script, and nothing fetched from anywhere."""

from __future__ import annotations

import base64
import html
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from agent.report import metrics, trajectories
from agent.report.accounting import INCOMPLETE_HELP, INCOMPLETE_TITLE
from agent.report.build import REPLAY_CONDITION, Report
from agent.report.figures import FIGURES, draw_all
from agent.report.paper import arm_table, comparison_rows, method_note, pair_table
from agent.report.rows import (
    NOT_AVAILABLE,
    ONE_PROBLEM_NOTE,
    category_rows,
    curve_rows,
    distribution_rows,
    failure_rows,
    fmt_cost,
    fmt_gpu_seconds,
    fmt_seconds,
    headline_rows,
    one_problem_means,
    problem_rows,
    run_rows,
)
from agent.report.run_reader import Candidate, Message, Sample

STYLE_SHEET = Path(__file__).with_name("report.css")


@lru_cache(maxsize=1)
def css() -> str:
    return STYLE_SHEET.read_text()


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def html_table(head: list[str], rows: list[list[str]], table_id: str = "") -> str:
    ident = f' id="{esc(table_id)}"' if table_id else ""
    out = [f"<table{ident}><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _img(stem: str, png: bytes | None) -> str:
    """The figure inline as base64 PNG; where it has nothing to draw, one line that says so."""
    if png is None:
        return f'<p class="note" id="{esc(stem)}-no-data">{esc(FIGURES[stem].no_data)}</p>'
    data = base64.b64encode(png).decode("ascii")
    alt = FIGURES[stem].alt
    return f'<img class="figure" id="{esc(stem)}-plot" alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def _verdict_span(verdict: str | None, correct: bool | None = None) -> str:
    if verdict is None:
        return '<span class="note">no verdict</span>'
    ok = verdict == "correct" if correct is None else correct
    return f'<span class="{"ok" if ok else "bad"}">{esc(verdict)}</span>'


def _candidate_html(c: Candidate, open_: bool = False) -> str:
    info = c.info
    speedup = info.get("speedup")
    bits = [str(b) for b in (info.get("tool") or info.get("name"), info.get("message"),
                             f"speedup {speedup:.2f}x" if isinstance(speedup, (int, float)) else None) if b]
    details = f"<pre>{esc(json.dumps(info, indent=1, default=str))}</pre>" if info else ""
    return (f'<details class="candidate"{" open" if open_ else ""}><summary><code>{esc(c.path)}</code> — '
            f'{_verdict_span(c.verdict)}{(" · " + esc(" · ".join(bits))) if bits else ""}</summary>'
            f'<pre><code>{esc(c.code)}</code></pre>{details}</details>')


def _message_html(m: Message, candidates: dict[str, Candidate], shown: set[str]) -> str:
    role = m.role if m.role in ("system", "user", "assistant", "tool") else "other"
    title = m.role + (f" · {m.name}" if m.name else "")
    if m.usage:
        title += f" · {m.usage.get('input_tokens', 0)} in / {m.usage.get('output_tokens', 0)} out tokens"
    body = f"<pre>{esc(m.text)}</pre>" if m.text else ""
    if role in ("system", "user") and len(m.text) > 400:
        body = f"<details><summary>{len(m.text)} characters</summary>{body}</details>"
    calls = ""
    if m.tool_calls:
        items = "".join(f"<li><code>{esc(tc.name)}</code> <code>{esc(json.dumps(tc.args, default=str))}</code>"
                        f"{(' <span class=note>' + esc(tc.id) + '</span>') if tc.id else ''}</li>"
                        for tc in m.tool_calls)
        calls = f"<div>tool calls:<ul>{items}</ul></div>"
    cand = ""
    if m.candidate:
        c = candidates.get(m.candidate)
        if c is not None:
            shown.add(c.path)
            cand = _candidate_html(c)
        else:
            cand = f'<div class="note">candidate {esc(m.candidate)} (file missing)</div>'
    return f'<div class="msg {role}"><div class="role">{esc(title)}</div>{body}{calls}{cand}</div>'


def _sample_summary(s: Sample) -> str:
    r = s.record
    bits = [f"sample {r.sample}", _verdict_span(r.verdict, r.correct)]
    if r.speedup is not None:
        counted = metrics.counted_speedup(r.metrics_view()) is not None or not r.correct
        bits.append(esc(f"{r.speedup:.2f}x" + ("" if counted else " (not counted)")))
    bits += [esc(f"{r.turns} turns"), esc(f"stop: {r.stop_reason or '—'}"), esc(f"{r.status}")]
    return " · ".join(bits)


def sample_cost(s: Sample) -> float | None:
    """The sample's dollars, None where unknown (no price for the model, or replayed code)."""
    known = (s.record.usage.model_extra or {}).get("cost_known", True) is not False
    return s.record.usage.cost_usd if known and s.record.condition != REPLAY_CONDITION else None


def sample_tokens(s: Sample) -> str:
    """The sample's tokens as the headline counts them: n/a where nothing was counted (replayed code, replies
    without counts), ≥ where some replies came without counts."""
    u = s.record.usage
    reported = (u.model_extra or {}).get("usage_reported", True) is not False
    if s.record.condition == REPLAY_CONDITION or (not reported and not (u.input_tokens or u.output_tokens)):
        return NOT_AVAILABLE
    return f"{'' if reported else '≥'}{u.input_tokens} in / {u.output_tokens} out"


def _sample_html(s: Sample, device: str | None) -> str:
    r = s.record
    calls = ", ".join(f"{k} {v}" for k, v in sorted(r.tool_calls.items())) or "none"
    meta = (f'<div class="note">model {esc(r.model)} · tokens {esc(sample_tokens(s))} · '
            f'cost {esc(fmt_cost(sample_cost(s)))} · wall {fmt_seconds(r.wall_s)} · '
            f'GPU {esc(fmt_gpu_seconds(r.gpu_s, device))} · tool calls: {esc(calls)}'
            + (f" · flags: {esc(', '.join(r.flags))}" if r.flags else "") + "</div>")
    candidates = {c.path: c for c in s.candidates}
    shown: set[str] = set()
    messages = "".join(_message_html(m, candidates, shown) for m in s.transcript)
    if not s.transcript:
        messages = '<div class="note">no transcript</div>'
    rest = [c for c in s.candidates if c.path not in shown]
    extra = ""
    if rest:
        extra = "<div>other candidates:</div>" + "".join(_candidate_html(c) for c in rest)
    final = ""
    if s.final_code is not None:
        res = s.result or {}
        msg = (res.get("failure") or {}).get("message", "") if isinstance(res.get("failure"), dict) else ""
        same = next((c.path for c in s.candidates if c.code == s.final_code), None)
        # final.py is a copy of the candidate that was scored: named, not shown a second time
        body = (f'<div class="note">the same file as <code>{esc(same)}</code> above</div>' if same else
                f"<pre><code>{esc(s.final_code)}</code></pre>")
        final = (f'<details class="final"><summary>final.py — scored: {_verdict_span(r.verdict, r.correct)}'
                 f'{esc(" · " + msg) if msg else ""}</summary>{body}</details>')
    return (f'<details class="sample"><summary>{_sample_summary(s)}</summary>{meta}{messages}{extra}{final}'
            "</details>")


def transcripts_html(report: Report) -> str:
    out = []
    for arm in report.arms:
        device = arm.run.config.get("device")
        by_problem: dict[str, list[Sample]] = {}
        for s in arm.samples:
            by_problem.setdefault(s.record.problem, []).append(s)
        inner = []
        for problem, samples in sorted(by_problem.items()):
            ok = sum(1 for s in samples if s.record.correct)
            inner.append(f'<details class="problem"><summary>{esc(problem)} — {ok}/{len(samples)} correct'
                         f'</summary>{"".join(_sample_html(s, device) for s in samples)}</details>')
        out.append(f'<details class="arm"><summary>{esc(arm.label)} ({len(arm.samples)} samples)</summary>'
                   f'{"".join(inner)}</details>')
    return "\n".join(out)


def to_html(report: Report) -> str:
    """One self-contained HTML file: inline CSS, figures as base64 PNG, no script, no external URL."""
    d = report.data
    k = report.k
    pngs = draw_all(report)
    runs = html_table(*run_rows(report), "runs-table")
    incomplete = "".join(f'<p class="incomplete"><strong>{INCOMPLETE_TITLE}.</strong> {esc(line)}.</p>'
                         for line in d.get("incomplete", []))
    if incomplete:
        incomplete += f'<p class="note">Where problems were left out, {esc(INCOMPLETE_HELP)}.</p>'
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',
        f"<title>pkb-agent report — {esc(', '.join(r['run_id'] for r in d['runs']))}</title>",
        f"<style>{css()}</style></head><body>",
        f"<h1>pkb-agent report{' — ' + INCOMPLETE_TITLE.lower() if incomplete else ''}</h1>",
        f'<section id="incomplete">{incomplete}</section>' if incomplete else "", runs,
        '<section id="headline"><h2>Headline</h2>',
        f'<p class="note">Means over the judged problems with a {d["level"]:.0%} bootstrap interval (percentile '
        f'method, {d["resamples"]} resamples of problems, seed {d["seed"]}); k = {k}. fast_p counts samples that are '
        "correct and faster than p times the reference.</p>",
        html_table(*headline_rows(report), "headline-table"),
        f'<p class="note">Note: {esc(ONE_PROBLEM_NOTE)}.</p>' if one_problem_means(report) else "",
        "".join(f'<p class="note">Note: {esc(note)}.</p>' for note in d["notes"]), "</section>",
    ]
    if d["comparisons"]:
        parts += ['<section id="comparison"><h2>Comparison</h2>', f'<p class="note">{esc(method_note(report))}</p>',
                  html_table(*comparison_rows(report), "comparison-table"), "</section>"]
    parts += ['<section id="compact"><h2>Compact table</h2>', _img("matrix", pngs["matrix"]),
              html_table(*arm_table(report), "arm-table"),
              html_table(*pair_table(report), "pair-table") if d["comparisons"] else "", "</section>"]
    parts += [f'<section id="fast-p"><h2>fast_p curve (k = {k})</h2>', _img("fast_p", pngs["fast_p"]),
              html_table(*curve_rows(report), "fast-p-table"), "</section>",
              '<section id="distributions"><h2>Speedup and roofline-fraction distributions (correct samples)</h2>',
              _img("speedup", pngs["speedup"]), _img("roofline", pngs["roofline"]),
              html_table(*distribution_rows(report), "distribution-table"), "</section>",
              '<section id="failures"><h2>Failure classes</h2>', _img("failures", pngs["failures"]),
              html_table(*failure_rows(report), "failure-table"), "</section>",
              '<section id="trajectories"><h2>Held-out shapes, best candidate, trajectories</h2>',
              f'<p class="note">{esc(trajectories.NOTE)}</p>', _img("trajectory", pngs["trajectory"]),
              html_table(*trajectories.rows(report), "trajectory-table"), "</section>",
              '<section id="categories"><h2>Per category</h2>', html_table(*category_rows(report), "category-table"),
              "</section>",
              '<section id="problems"><h2>Per problem</h2>', html_table(*problem_rows(report), "problem-table"),
              "</section>",
              '<section id="transcripts"><h2>Transcripts</h2>',
              '<p class="note">Every sample: the conversation (turns, tool calls and answers), each candidate with '
              "its verdict, and the final scored code.</p>", transcripts_html(report), "</section>",
              "</body></html>"]
    return "\n".join(parts)
