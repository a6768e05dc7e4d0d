"""The report's tables as rows of text, and the number formats they use: shared by .markdown and .html."""

from __future__ import annotations

import math
from typing import Any

from agent.report.accounting import not_measured_text
from agent.report.build import HEADLINE_METRICS, REPLAY_CONDITION, Report
from harness.common.flags import timing_note

NOT_AVAILABLE = "n/a"
CURVE_TABLE_PS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0)


def fmt_num(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


# A bootstrap over one problem resamples nothing: such a mean is shown bare, and the report says why once.
ONE_PROBLEM_NOTE = ("a mean over one problem (an arm, a category or a comparison with one problem) is shown "
                    "without an interval: a bootstrap over one problem resamples nothing")


def fmt_interval(iv: dict[str, Any]) -> str:
    if iv.get("not_measured"):
        return not_measured_text(iv["not_measured"])
    if iv["n"] == 0 or iv["mean"] is None or math.isnan(iv["mean"]):
        return "—"
    if iv["n"] == 1:
        return f"{iv['mean']:.2f}"
    return f"{iv['mean']:.2f} [{iv['low']:.2f}, {iv['high']:.2f}]"


def one_problem_means(report: Report) -> bool:
    """Whether any mean the report shows is over one problem (shown without an interval: ONE_PROBLEM_NOTE)."""
    d = report.data
    keys = [key for key, _ in HEADLINE_METRICS]
    ivs = [a[key] for a in d["arms"] for key in keys] + [a["over_asked"][key] for a in d["arms"]
                                                         if "over_asked" in a for key in keys]
    ivs += [iv for a in d["arms"] for cat in a["per_category"].values() for iv in cat.values()]
    ivs += [c["metrics"][key] for c in d["comparisons"] for key in keys]
    return any(iv.get("n") == 1 for iv in ivs)


def headline_metrics_shown(k: int) -> list[tuple[str, str]]:
    """(key, column title) of the headline's metrics; with k = 1, pass@k is pass@1 and is shown once."""
    return [(key, title.format(k=k)) for key, title in HEADLINE_METRICS if not (k == 1 and key == "pass_at_k")]


def fmt_speedup(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def fmt_tokens(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else (f"{n / 1e3:.1f}k" if n >= 1e3 else str(n))


def fmt_cost(usd: float | None) -> str:
    """Dollars; None (not priced: a model missing from the price table, or replayed code) is n/a, never $0."""
    if usd is None:
        return NOT_AVAILABLE
    if usd == 0 or usd >= 1:
        return f"${usd:,.2f}"
    return f"${usd:.4f}"  # cents would round a small run's cost to $0.00, which reads as free


def fmt_usage_tokens(usage: dict[str, Any]) -> str:
    """Tokens; where a reply came without counts the sum is a lower bound (≥), and n/a when nothing was counted."""
    if usage.get("usage_reported", True):
        return fmt_tokens(int(usage["tokens"]))
    return f"≥{fmt_tokens(int(usage['tokens']))}" if usage["tokens"] else NOT_AVAILABLE


def fmt_seconds(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds:.0f} s"
    return f"{seconds / 3600:.1f} h"


def fmt_gpu_seconds(seconds: float, device: str | None) -> str:
    # A CPU run leases rank slots, not GPUs: its gpu_s counts CPU slot time, which is no GPU time at all.
    return f"{NOT_AVAILABLE} (cpu)" if device == "cpu" else fmt_seconds(seconds)


def run_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per run. `samples` is counted as the headline counts it (finished of those begun), so the two
    agree; `per problem` is what the run asked for (a replay run scores every file it finds)."""
    head = ["run", "model", "conditions", "samples finished", "samples asked per problem", "device",
            "ranks (world size)", "shape", "created"]
    keys = ("run_id", "model", "conditions", "finished", "samples", "device", "world_size", "shape", "created_at")
    rows = []
    for r in report.data["runs"]:
        values = [", ".join(r[key]) if key == "conditions" else r.get(key) for key in keys]
        values[keys.index("finished")] = f"{r['finished']}/{r['begun']}"
        if r["samples"] is None:
            values[keys.index("samples")] = "every file" if REPLAY_CONDITION in r["conditions"] else None
        if r.get("emulated"):
            shared = f", {r['ranks_per_gpu']} ranks/GPU" if (r.get("ranks_per_gpu") or 1) > 1 else ""
            values[keys.index("device")] = f"{r['device']} (emulated{shared})"
        rows.append(["—" if v is None or v == "" else str(v) for v in values])
    return head, rows


def fmt_arm_speedup(value: float | None, device: str | None) -> str:
    """A speedup figure of an arm; on CPU marked as what it is (the note under the headline says more)."""
    text = fmt_speedup(value)
    return f"{text} (CPU: plumbing)" if value is not None and timing_note(device) else text


def fmt_problems(a: dict[str, Any]) -> str:
    """The arm's problem count: the judged ones, and of how many asked where some were left out."""
    acc = a.get("accounting")
    if acc is None or acc["judged"] == acc["asked"]:
        return str(a["problems"])
    return f"{a['problems']} of {acc['asked']} asked"


def headline_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per arm over its judged problems; under an incomplete arm, a second row over every asked problem
    (what was not judged counted as not solved)."""
    k = report.k
    shown = headline_metrics_shown(k)
    head = ["condition", "problems", "samples"] + [title for _, title in shown] + [
        "geomean speedup", "cost", "tokens", "wall time", "GPU time"]
    rows = []
    for a in report.data["arms"]:
        u = a["usage"]
        reason = a.get("speed", {}).get("not_measured")
        geomean = not_measured_text(reason) if reason else fmt_arm_speedup(a["geomean_speedup"], a["device"])
        rows.append([a["label"], fmt_problems(a), f"{a['samples']['finished']}/{a['samples']['total']}"]
                    + [fmt_interval(a[key]) for key, _ in shown]
                    + [geomean, fmt_cost(u["cost_usd"]),
                       fmt_usage_tokens(u), fmt_seconds(u["wall_s"]), fmt_gpu_seconds(u["gpu_s"], a["device"])])
        if not a.get("complete", True):
            asked = a["over_asked"]
            rows.append([f"{a['label']}, over all asked", f"{asked['problems']} asked",
                         f"{a['samples']['asked']} asked"]
                        + [fmt_interval(asked[key]) for key, _ in shown] + ["", "", "", "", ""])
    return head, rows


def curve_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    arms = report.data["arms"]
    reasons = [a.get("speed", {}).get("not_measured") for a in arms]
    head = ["p"] + [a["label"] if r is None else f"{a['label']}: {not_measured_text(r)}" for a, r in zip(arms, reasons,
                                                                                                       strict=True)]
    rows = []
    for p in CURVE_TABLE_PS:
        row = [f"{p:g}"]
        for a in arms:
            value = next((v for q, v in a["fast_p_curve"] if abs(q - p) < 1e-9), None)
            row.append(fmt_num(value))
        rows.append(row)
    return head, rows


def distribution_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    head = ["condition", "measure", "count", "median", "p10", "p90", "min", "max"]
    rows = []
    for a in report.data["arms"]:
        for key, name in (("speedup", "speedup"), ("roofline_fraction", "roofline fraction")):
            d = a[key]
            reason = a.get("speed", {}).get("not_measured") if key == "speedup" else None
            if reason:
                rows.append([a["label"], name, not_measured_text(reason), "—", "—", "—", "—", "—"])
            elif d is None:
                rows.append([a["label"], name, "0", "—", "—", "—", "—", "—"])
            else:
                rows.append([a["label"], name, str(d["count"])]
                            + [fmt_num(d[x]) for x in ("median", "p10", "p90", "min", "max")])
    return head, rows


def failure_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    arms = report.data["arms"]
    head = ["class (PKB's label)"] + [a["label"] for a in arms]
    labels = list(arms[0]["failures"]) if arms else []
    for a in arms[1:]:
        labels += [lab for lab in a["failures"] if lab not in labels]
    return head, [[lab] + [str(a["failures"].get(lab, 0)) for a in arms] for lab in labels]


def category_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    arms = report.data["arms"]
    k = report.k
    head = ["category"] + [f"{a['label']}: pass@{k}" for a in arms] + [f"{a['label']}: fast_1@{k}" for a in arms]
    cats = sorted({c for a in arms for c in a["per_category"]})
    rows = []
    for cat in cats:
        cells = [cat]
        for key in ("pass_at_k", "fast_1_at_k"):
            for a in arms:
                iv = a["per_category"].get(cat, {}).get(key)
                cells.append((fmt_interval(iv) + (f" (n={iv['n']})" if iv["n"] > 1 else "")) if iv else "—")
        rows.append(cells)
    return head, rows


def _problem_cell(p: dict[str, Any] | None, excluded: dict[str, Any] | None, k: int, device: str | None,
                  not_measured: str | None) -> str:
    if p is None:
        return f"not judged: {excluded['reason']}" if excluded else "—"
    failing = ", ".join(f"{v}×{n}" for v, n in p["verdicts"].items() if v != "correct")
    best = "speed not measured" if not_measured else f"best {fmt_arm_speedup(p['best_speedup'], device)}"
    text = f"{p['correct']}/{p['n']} correct; pass@{k} {fmt_num(p['pass_at_k'])}; {best}"
    text += f"; {failing}" if failing else ""
    if build := p.get("build"):  # the compile stage: median seconds, native builds taken from the cache
        text += f"; build {fmt_seconds(build['median_s'])} median, {build['cached']}/{build['native']} cached"
    return text + (f"; left out ({excluded['reason']})" if excluded else "")


def problem_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """A row per problem asked or scored, a cell per arm: its samples, or why it was not judged."""
    arms = report.data["arms"]
    k = report.k
    head = ["problem", "category"] + [a["label"] for a in arms]
    by_arm = [{p["problem"]: p for p in a["per_problem"]} for a in arms]
    left_out = [{e["problem"]: e for e in (a.get("accounting") or {}).get("excluded", [])} for a in arms]
    names = sorted({name for m in by_arm for name in m} | {name for m in left_out for name in m})
    rows = []
    for name in names:
        cat = next((m[name]["category"] for m in by_arm if name in m), "—")
        cells = [name, cat]
        for a, m, out in zip(arms, by_arm, left_out, strict=True):
            cells.append(_problem_cell(m.get(name), out.get(name), k, a["device"],
                                       a.get("speed", {}).get("not_measured")))
        rows.append(cells)
    return head, rows
