"""The comparison tables: the full one of the report, and the compact one a paper can print (markdown and LaTeX).

Numbers come from Report.data (agent.report.build, agent.report.compare); this module only formats them.
The compact table is two small tables: the arms (pass@k, fast_1@k, geometric-mean speedup, and dollars,
tokens and wall time per solved problem) and the comparisons (each Δ with its interval and Holm-corrected
p-value, the speedup ratio, wins/losses/ties). `to_latex` writes the same two tables as booktabs tabulars,
a fragment to \\input into a paper (it needs \\usepackage{booktabs}).
"""

from __future__ import annotations

import math
from typing import Any

from agent.report.accounting import INCOMPLETE_TITLE, not_measured_text
from agent.report.build import Report
from agent.report.rows import (
    NOT_AVAILABLE,
    fmt_cost,
    fmt_problems,
    fmt_seconds,
    fmt_tokens,
    headline_metrics_shown,
)

CONFOUNDED_MARK = "†"


def _nan(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_delta(d: dict[str, Any]) -> str:
    if d.get("not_measured"):
        return not_measured_text(d["not_measured"])
    if d["n"] == 0 or _nan(d["mean"]):
        return "— (no shared problem)"
    if d["n"] == 1:
        return f"{d['mean']:+.2f}"
    return f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]"


def fmt_ratio(r: dict[str, Any]) -> str:
    if r.get("not_measured"):
        return not_measured_text(r["not_measured"])
    if r["n"] == 0 or _nan(r["ratio"]):
        return "— (no problem both solved)"
    return f"{r['ratio']:.2f}x [{r['low']:.2f}, {r['high']:.2f}] (n={r['n']})"


def fmt_p(value: Any) -> str:
    if _nan(value):
        return "—"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def fmt_p_pair(m: dict[str, Any]) -> str:
    """The raw p-value and Holm's: 'p 0.125 (Holm 0.375)'."""
    if _nan(m.get("p_value")):
        return "—"
    return f"{fmt_p(m['p_value'])} (Holm {fmt_p(m.get('p_holm'))})"


def comparison_label(c: dict[str, Any]) -> str:
    return f"{c['treatment']} vs {c['baseline']}" + (f" {CONFOUNDED_MARK}" if c.get("confounded") else "")


def fmt_shared(c: dict[str, Any]) -> str:
    """The problems a comparison is over (judged in both arms), and how many it dropped (named in the notes)."""
    n = str(c.get("shared_problems", c["metrics"]["pass_at_k"]["n"]))
    dropped = c.get("dropped") or []
    return f"{n} ({len(dropped)} dropped)" if dropped else n


def comparison_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """The report's full comparison table: every headline Δ, the speedup ratio, tests and wins/losses/ties."""
    k = report.k
    shown = headline_metrics_shown(k)  # pass@k once at k = 1
    head = ["treatment vs baseline", "what differs", "problems"]
    rows = []
    for key, title in shown:
        head.append(f"Δ {title}")
        if key in ("pass_at_k", "fast_1_at_k"):
            head.append(f"p ({title})")
    head += ["speedup ratio (both solved)", "p (speedup)", f"wins/losses/ties (pass@{k})"]
    for c in report.data["comparisons"]:
        m = c["metrics"]
        row = [comparison_label(c), c.get("factor", "condition"), fmt_shared(c)]
        for key, _ in shown:
            row.append(fmt_delta(m[key]))
            if key in ("pass_at_k", "fast_1_at_k"):
                row.append(fmt_p_pair(m[key]))
        pk = m["pass_at_k"]
        row += [fmt_ratio(m["speedup_ratio"]), fmt_p_pair(m["speedup_ratio"]),
                f"{pk['wins']}/{pk['losses']}/{pk['ties']}"]
        rows.append(row)
    return head, rows


def method_note(report: Report) -> str:
    d = report.data
    return (f"Per-problem differences (treatment − baseline) over the problems judged in both arms (the problems "
            f"dropped are counted in the table and named in the notes): mean with a paired "
            f"bootstrap {d['level']:.0%} interval ({d['resamples']} resamples of problems), and a two-sided paired "
            f"permutation test (each problem's two scores swapped or not; exact up to {d['permutations']} "
            "patterns, else that many drawn), Holm-corrected over every test shown. The speedup ratio is the ratio "
            "of geometric-mean speedups on the problems both solved with a counted speedup. † marks runs whose "
            "manifests differ in more than the compared factor (--force).")


# -- the compact table ----------------------------------------------------------------------------------
def _per_solved_cost(a: dict[str, Any]) -> str:
    value = a["per_solved"]["cost_usd"]
    return NOT_AVAILABLE if value is None else fmt_cost(value)


def _per_solved_tokens(a: dict[str, Any]) -> str:
    value = a["per_solved"]["tokens"]
    if value is None:
        return NOT_AVAILABLE
    lower_bound = not a["usage"].get("usage_reported", True)  # some replies came without counts: the headline's ≥
    return ("≥" if lower_bound else "") + fmt_tokens(int(round(value)))


def _per_solved_wall(a: dict[str, Any]) -> str:
    value = a["per_solved"]["wall_s"]
    return NOT_AVAILABLE if value is None else fmt_seconds(value)


def _mean(iv: dict[str, Any]) -> str:
    if iv.get("not_measured"):
        return not_measured_text(iv["not_measured"])
    return "—" if iv["n"] == 0 or _nan(iv["mean"]) else f"{iv['mean']:.2f}"


def arm_table(report: Report) -> tuple[list[str], list[list[str]]]:
    k = report.k
    head = ["arm", "problems", f"pass@{k}", f"fast_1@{k}", "geomean speedup", "solved", "$ / solved",
            "tokens / solved", "wall / solved"]
    rows = []
    for a in report.data["arms"]:
        g = a["geomean_speedup"]
        reason = a.get("speed", {}).get("not_measured")
        geomean = not_measured_text(reason) if reason else ("—" if g is None else f"{g:.2f}x")
        rows.append([a["label"], fmt_problems(a), _mean(a["pass_at_k"]), _mean(a["fast_1_at_k"]), geomean,
                     str(a["per_solved"]["solved"]), _per_solved_cost(a),
                     _per_solved_tokens(a), _per_solved_wall(a)])
        if not a.get("complete", True):  # the other denominator: every asked problem, the rest not solved
            asked = a["over_asked"]
            rows.append([f"{a['label']}, over all asked", f"{asked['problems']} asked", _mean(asked["pass_at_k"]),
                         _mean(asked["fast_1_at_k"]), "", "", "", "", ""])
    return head, rows


def _delta_p(m: dict[str, Any]) -> tuple[str, str]:
    return fmt_delta(m), fmt_p(m.get("p_holm"))


def pair_table(report: Report) -> tuple[list[str], list[list[str]]]:
    k = report.k
    head = ["comparison", "problems", f"Δpass@{k} [95% CI]", "p (Holm)", f"Δfast_1@{k} [95% CI]", "p (Holm)",
            "speedup ratio [95% CI]", "p (Holm)", "wins/losses/ties"]
    rows = []
    for c in report.data["comparisons"]:
        m = c["metrics"]
        pk = m["pass_at_k"]
        rows.append([comparison_label(c), fmt_shared(c), *_delta_p(pk), *_delta_p(m["fast_1_at_k"]),
                     fmt_ratio(m["speedup_ratio"]), fmt_p(m["speedup_ratio"].get("p_holm")),
                     f"{pk['wins']}/{pk['losses']}/{pk['ties']}"])
    return head, rows


# -- LaTeX ----------------------------------------------------------------------------------------------
_LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                   "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_TEXT = {"Δ": r"$\Delta$", "†": r"$^\dagger$", "—": "--", "−": "-", "≥": r"$\geq$", "<": r"$<$"}


def latex_escape(text: str) -> str:
    out = "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text).replace("--", "-{}-")  # an option, not a dash
    for plain, tex in _LATEX_TEXT.items():
        out = out.replace(plain, tex)
    return out


def latex_table(head: list[str], rows: list[list[str]], caption: str) -> str:
    spec = "l" + "r" * (len(head) - 1)
    lines = [r"\begin{table}[t]", r"\centering", r"\small", rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
             " & ".join(latex_escape(h) for h in head) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(c) for c in row) + r" \\" for row in rows]
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{latex_escape(caption)}}}", r"\end{table}"]
    return "\n".join(lines)


def to_latex(report: Report) -> str:
    """The compact table as LaTeX (booktabs): the arms, then the comparisons."""
    k = report.k
    d = report.data
    caveats = "".join(f" {INCOMPLETE_TITLE}: {line}." for line in d.get("incomplete", [])) + "".join(
        f" {a['label']}: fast_p and speedups not measured ({a['speed']['not_measured']})." for a in d["arms"]
        if a.get("speed", {}).get("not_measured"))
    parts = ["% pkb-agent: the compact comparison table (needs \\usepackage{booktabs})"]
    parts += [f"% {INCOMPLETE_TITLE.upper()}: {' '.join(line.split())}" for line in d.get("incomplete", [])]
    parts.append(latex_table(*arm_table(report), f"Arms: means over judged problems (k = {k}); cost, tokens and "
                                                 f"wall time per solved problem.{caveats}"))
    if report.data["comparisons"]:
        parts.append(latex_table(*pair_table(report), method_note(report)))
    return "\n\n".join(parts) + "\n"
