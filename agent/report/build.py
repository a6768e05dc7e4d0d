"""The run report: metrics of one or more runs as JSON, markdown, or one self-contained HTML file.

An *arm* is one condition of one run. The report shows every arm side by side (headline table, fast_p
curve, speedup and roofline distributions, failure classes, categories, per-problem rows) and compares
each arm with the baseline arm (zero-shot where there is one, else the first) per problem, with paired
bootstrap intervals. The HTML also carries a transcript viewer per sample. Nothing is fetched: CSS is
inline and figures are base64 PNG.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from harness import metrics
from harness.flags import EMULATED, SPEEDUP_DISQUALIFIERS, is_emulated
from harness.run_reader import Candidate, Message, Run, Sample

REPORT_SCHEMA = "pkb-report/1"
BASELINE_CONDITION = "zero-shot"
REPLAY_CONDITION = "replay"  # scores files made elsewhere: what they cost in tokens and dollars is not in the run
NOT_AVAILABLE = "n/a"
CURVE_TABLE_PS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
HEADLINE_METRICS = (  # key in the arm's metrics, column title ({k} filled in)
    ("pass_at_1", "pass@1"),
    ("pass_at_k", "pass@{k}"),
    ("fast_1_at_k", "fast_1@{k}"),
    ("fast_1_5_at_k", "fast_1.5@{k}"),
)


class ReportError(ValueError):
    """A report that cannot be built as asked (k larger than the samples, no runs, a run without samples). One line."""


@dataclass
class Arm:
    label: str
    run: Run
    condition: str
    samples: list[Sample]
    records: list[dict[str, Any]]
    scores: list[metrics.ProblemScore]


@dataclass
class Report:
    data: dict[str, Any]  # the computed metrics; exactly what --format json prints
    arms: list[Arm]
    runs: list[Run]

    @property
    def k(self) -> int:
        return int(self.data["k"])


# -- computing --------------------------------------------------------------------------------------
def run_labels(runs: Sequence[Run]) -> list[str]:
    """A name per run: its run_id, or, where two runs share one, the parent folder and the run_id."""
    ids = Counter(r.run_id for r in runs)
    return [r.run_id if ids[r.run_id] == 1 else f"{Path(r.path).parent.name}/{r.run_id}" for r in runs]


def make_arms(runs: Sequence[Run]) -> list[Arm]:
    arms: list[Arm] = []
    for run, name in zip(runs, run_labels(runs), strict=True):
        # A run whose config shares GPUs is emulated in every sample, whatever its results say.
        forced = {"emulated": True} if ranks_per_gpu(run) > 1 else {}
        for condition in run.conditions:
            samples = [s for s in run.samples if s.record.condition == condition]
            records = [{**s.record.metrics_view(), **forced} for s in samples]
            label = condition if len(runs) == 1 else f"{name}/{condition}"
            scores = metrics.score_problems(records).get(condition, [])
            arms.append(Arm(label, run, condition, samples, records, scores))
    return arms


def default_k(runs: Sequence[Run]) -> int:
    """The smallest samples-per-problem of the runs: from run.json, else (a replay run scores every file it
    finds) the fewest samples any problem has, so that no problem is left out of pass@k."""
    ks = []
    for run in runs:
        k = run.samples_per_problem
        if k is None:
            counts = Counter((s.record.problem, s.record.condition) for s in run.samples)
            k = min(counts.values(), default=1)
        ks.append(k)
    return max(1, min(ks, default=1))


def headline_metrics(k: int) -> dict[str, metrics.Metric]:
    """The per-problem metrics of the headline table, keyed as in HEADLINE_METRICS."""
    return {"pass_at_1": metrics.pass_metric(1), "pass_at_k": metrics.pass_metric(k),
            "fast_1_at_k": metrics.fast_metric(1.0, k), "fast_1_5_at_k": metrics.fast_metric(1.5, k)}


def _all_true(records: Sequence[dict[str, Any]], key: str) -> bool:
    """Every sample's usage[key] is true; a sample.json without the key (older runs) counts as true."""
    return all((r.get("usage") or {}).get(key, True) is not False for r in records)


def arm_usage(arm: Arm) -> dict[str, Any]:
    """Summed usage, with what is unknown said so: cost_usd is None (not 0) where any sample's cost could not
    be priced (a model missing from the price table, e.g. scripted:) or where the code was replayed."""
    usage = metrics.usage_totals(arm.records).get(arm.condition) or metrics.Usage(0, 0, 0, 0.0, 0.0, 0.0)
    replayed = arm.condition == REPLAY_CONDITION
    cost_known = not replayed and _all_true(arm.records, "cost_known")
    out: dict[str, Any] = usage.as_dict()
    out["cost_usd"] = usage.cost_usd if cost_known else None
    out["cost_known"] = cost_known
    out["usage_reported"] = not replayed and _all_true(arm.records, "usage_reported")  # False: tokens undercount
    return out


def uncounted_speedups(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Correct, timed, finished samples whose speedup does not count (an integrity flag: uses_nccl, ...), with
    how often each disqualifying flag was raised. Without this a correct arm's empty fast_p reads as slow."""
    flags: Counter[str] = Counter()
    n = 0
    for r in metrics.finished(records):
        if r.get("correct") and r.get("speedup") is not None and metrics.counted_speedup(r) is None:
            n += 1
            reasons = {f for f in r.get("flags") or [] if f in SPEEDUP_DISQUALIFIERS}
            flags.update(reasons | ({EMULATED} if is_emulated(r) else set()))
    return {"samples": n, "flags": dict(sorted(flags.items()))}


def _arm_metrics(arm: Arm, k: int, seed: int, resamples: int) -> dict[str, Any]:
    scores, excluded = metrics.eligible(arm.scores, k)
    stat = headline_metrics(k)
    finished = metrics.finished(arm.records)
    speedups = [v for s in scores for v in s.speedups]
    dist = metrics.summarize(speedups)
    roof = metrics.roofline_summary(scores)
    pass_by_cat = metrics.per_category(scores, stat["pass_at_k"], seed=seed, resamples=resamples)
    fast_by_cat = metrics.per_category(scores, stat["fast_1_at_k"], seed=seed, resamples=resamples)
    return {
        "label": arm.label,
        "run_id": arm.run.run_id,
        "condition": arm.condition,
        "model": str(arm.run.config.get("model", "")),
        "problems": len(scores),
        "excluded_problems": excluded,
        "samples": {"total": len(arm.records), "finished": len(finished),
                    "infra_error": sum(1 for r in finished if r.get("verdict") == "infra_error")},
        **{key: metrics.mean_over_problems(scores, fn, seed=seed, resamples=resamples).as_dict()
           for key, fn in stat.items()},
        "geomean_speedup": metrics.geomean_speedup(scores),
        "speedup": dist.as_dict() if dist else None,
        "speedups": speedups,
        "speedups_not_counted": uncounted_speedups(arm.records),
        "roofline_fraction": roof.as_dict() if roof else None,
        "roofline_fractions": [v for s in scores for v in s.roofline_fractions],
        "failures": metrics.failure_counts(arm.records),
        "device": arm.run.config.get("device"),
        "usage": arm_usage(arm),
        "per_category": {cat: {"pass_at_k": iv.as_dict(), "fast_1_at_k": fast_by_cat[cat].as_dict()}
                         for cat, iv in pass_by_cat.items()},
        "fast_p_curve": [[p, v] for p, v in metrics.fast_p_curve(scores, k)],
        "per_problem": [
            {"problem": s.problem, "category": s.category, "n": s.n, "correct": s.correct,
             "pass_at_1": s.pass_at(1), "pass_at_k": s.pass_at(k) if s.n >= k else None,
             "fast_1_at_k": s.fast_at(1.0, k) if s.n >= k else None,
             "best_speedup": max(s.speedups) if s.speedups else None,
             "verdicts": dict(sorted(Counter(s.verdicts).items()))}
            for s in arm.scores
        ],
    }


def _baseline(arms: Sequence[Arm]) -> Arm:
    for arm in arms:
        if arm.run is arms[0].run and arm.condition == BASELINE_CONDITION:
            return arm
    return arms[0]


def _comparisons(arms: Sequence[Arm], k: int, seed: int, resamples: int) -> tuple[str | None, list[dict]]:
    if len(arms) < 2:
        return None, []
    base = _baseline(arms)
    base_scores, _ = metrics.eligible(base.scores, k)
    stat = headline_metrics(k)
    out = []
    for arm in arms:
        if arm is base:
            continue
        scores, _ = metrics.eligible(arm.scores, k)
        out.append({
            "baseline": base.label, "treatment": arm.label,
            "metrics": {key: metrics.paired_difference(base_scores, scores, fn, seed=seed,
                                                       resamples=resamples).as_dict()
                        for key, fn in stat.items()},
        })
    return base.label, out


SETTINGS_COMPARED = (("device", "device"), ("world_size", "world size"), ("ranks_per_gpu", "ranks per GPU"),
                     ("shape", "shape"))


def ranks_per_gpu(run: Run) -> int:
    return int(run.config.get("ranks_per_gpu") or 1)


def run_is_emulated(run: Run) -> bool:
    """Ranks shared GPUs (harness.emulation): by the run's config, or by any of its results."""
    return ranks_per_gpu(run) > 1 or any(is_emulated(r) for r in run.records())


def notes(runs: Sequence[Run]) -> list[str]:
    """What a reader must know before comparing the numbers: emulated runs, unlike settings, conditions
    without samples."""
    out = []
    for run, label in zip(runs, run_labels(runs), strict=True):
        if run_is_emulated(run):
            shared = f"{ranks_per_gpu(run)} ranks share each GPU" if ranks_per_gpu(run) > 1 else "ranks share GPUs"
            out.append(f"run {label} is emulated ({shared}, symmetric memory emulated, collectives on gloo): "
                       "correctness is real, its timings are not speedups, and no sample of it counts as fast")
    if len(runs) > 1:
        for key, name in SETTINGS_COMPARED:
            values = [r.config.get(key) for r in runs]
            if len(set(map(str, values))) > 1:
                seen = ", ".join(f"{label}: {v}" for label, v in zip(run_labels(runs), values, strict=True))
                out.append(f"the runs differ in {name} ({seen}): their speedups and costs are not comparable")
    for run, label in zip(runs, run_labels(runs), strict=True):
        missing = [str(c) for c in run.config.get("conditions", []) if str(c) not in run.conditions]
        if missing:
            out.append(f"run {label}: no sample yet for {', '.join(missing)}")
    return out


def check_runs(runs: Sequence[Run]) -> None:
    """Refuse what cannot make a meaningful report: no run, a run given twice, a run without any sample."""
    if not runs:
        raise ReportError("no run to report on")
    paths = Counter(r.path for r in runs)
    twice = next((p for p, n in paths.items() if n > 1), None)
    if twice is not None:
        raise ReportError(f"run {twice} is given twice")
    for run in runs:
        if not run.samples:
            raise ReportError(f"run {run.run_id} ({run.path}) has no sample yet: nothing to report "
                              "(still starting, or stopped before its first sample)")


def build(runs: Sequence[Run], *, k: int | None = None, seed: int = 0,
          resamples: int = metrics.DEFAULT_RESAMPLES) -> Report:
    """Compute every metric of the report. k defaults to the runs' samples per problem."""
    check_runs(runs)
    if k is None:
        k = default_k(runs)
    if k < 1:
        raise ReportError(f"k must be at least 1, got {k}")
    for run in runs:
        n = run.samples_per_problem
        if n is not None and k > n:
            raise ReportError(f"k={k} exceeds the {n} samples per problem of run {run.run_id} "
                              f"(pass@k needs n >= k)")
    arms = make_arms(runs)
    baseline, comparisons = _comparisons(arms, k, seed, resamples)
    data = {
        "schema": REPORT_SCHEMA,
        "k": k,
        "seed": seed,
        "resamples": resamples,
        "level": metrics.DEFAULT_LEVEL,
        "notes": notes(runs),
        "runs": [{"run_id": r.run_id, "path": r.path, "created_at": r.created_at,
                  "model": str(r.config.get("model", "")), "conditions": r.conditions,
                  "samples": r.samples_per_problem, "device": r.config.get("device"),
                  "world_size": r.config.get("world_size"), "shape": r.config.get("shape"),
                  "emulated": run_is_emulated(r), "ranks_per_gpu": ranks_per_gpu(r),
                  "problems": sorted({s.record.problem for s in r.samples}),
                  "versions": r.versions} for r in runs],
        "arms": [_arm_metrics(a, k, seed, resamples) for a in arms],
        "baseline": baseline,
        "comparisons": comparisons,
    }
    for arm in data["arms"]:
        uncounted = arm["speedups_not_counted"]
        if uncounted["samples"]:
            why = ", ".join(f"{flag} ×{n}" for flag, n in uncounted["flags"].items()) or "not fast-eligible"
            data["notes"].append(f"{arm['label']}: the speedups of {uncounted['samples']} correct sample(s) do not "
                                 f"count toward fast_p or the speedup figures ({why})")
    return Report(data=data, arms=arms, runs=list(runs))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def to_json(report: Report) -> str:
    """The computed metrics (NaN, where nothing was measured, becomes null)."""
    return json.dumps(_json_safe(report.data), indent=2)


# -- figures ----------------------------------------------------------------------------------------
def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555555")
    ax.set_xticks([])
    ax.set_yticks([])


def fast_p_figure(report: Report) -> bytes:
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.add_subplot()
    k = report.k
    for arm in report.data["arms"]:
        curve = np.asarray(arm["fast_p_curve"], dtype=float)
        ax.plot(curve[:, 0], curve[:, 1], label=arm["label"], linewidth=2)
    for p in (1.0, 1.5):
        ax.axvline(p, color="#999999", linestyle="--", linewidth=0.8)
    ax.set_xlim(0, 3)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("speedup threshold p")
    ax.set_ylabel(f"fast_p@{k}")
    ax.set_title(f"fast_p@{k}: share of problems with a correct sample faster than p x the reference")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    return _png(fig)


def _strip_figure(report: Report, key: str, ylabel: str, title: str, log: bool) -> bytes:
    arms = report.data["arms"]
    fig = Figure(figsize=(7.5, 3.4))
    ax = fig.add_subplot()
    series = [[v for v in a[key] if v is not None and (v > 0 or not log)] for a in arms]
    if not any(series):
        _empty(ax, "no correct sample with this measurement")
        ax.set_title(title)
        return _png(fig)
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
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.axhline(1.0, color="#999999", linestyle="--", linewidth=0.8)
    else:
        ax.set_ylim(0, 1.05)
    ax.set_xticks(range(len(arms)), [a["label"] for a in arms], rotation=15, fontsize="small")
    ax.set_xlim(-0.6, len(arms) - 0.4)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def speedup_figure(report: Report) -> bytes:
    return _strip_figure(report, "speedups", "speedup (log scale)", "speedup of correct samples", log=True)


def roofline_figure(report: Report) -> bytes:
    return _strip_figure(report, "roofline_fractions", "fraction of the roofline bound",
                         "roofline fraction of correct samples", log=False)


FAILURE_COLOURS = {"correct": "#2ca02c", "no code": "#7f7f7f", "infrastructure": "#bcbd22"}


def failure_figure(report: Report) -> bytes:
    arms = report.data["arms"]
    labels = [lab for lab in arms[0]["failures"] if any(a["failures"].get(lab, 0) for a in arms)] if arms else []
    fig = Figure(figsize=(7.5, 0.6 + 0.45 * max(len(arms), 1) + 0.4))
    ax = fig.add_subplot()
    if not labels:
        _empty(ax, "no finished sample")
        return _png(fig)
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
    ax.set_title("verdicts (PKB's failure classes)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize="small", frameon=False)
    return _png(fig)


FIGURES = {  # file stem, alt text, builder
    "fast_p": ("fast_p curve", fast_p_figure),
    "speedup": ("speedup distribution", speedup_figure),
    "roofline": ("roofline-fraction distribution", roofline_figure),
    "failures": ("failure-class breakdown", failure_figure),
}


# -- shared formatting ------------------------------------------------------------------------------
def fmt_num(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


def fmt_interval(iv: dict[str, Any]) -> str:
    if iv["n"] == 0 or iv["mean"] is None or math.isnan(iv["mean"]):
        return "—"
    return f"{iv['mean']:.2f} [{iv['low']:.2f}, {iv['high']:.2f}]"


def fmt_delta(d: dict[str, Any]) -> str:
    if d["n"] == 0 or math.isnan(d["mean"]):
        return "— (no shared problem)"
    return f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]"


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
    head = ["run", "model", "conditions", "samples", "device", "W", "shape", "created"]
    keys = ("run_id", "model", "conditions", "samples", "device", "world_size", "shape", "created_at")
    rows = []
    for r in report.data["runs"]:
        values = [", ".join(r[key]) if key == "conditions" else r[key] for key in keys]
        if r.get("emulated"):
            shared = f", {r['ranks_per_gpu']} ranks/GPU" if (r.get("ranks_per_gpu") or 1) > 1 else ""
            values[keys.index("device")] = f"{r['device']} (emulated{shared})"
        rows.append(["—" if v is None or v == "" else str(v) for v in values])
    return head, rows


def headline_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    k = report.k
    head = ["condition", "problems", "samples"] + [t.format(k=k) for _, t in HEADLINE_METRICS] + [
        "geomean speedup", "cost", "tokens", "wall", "GPU"]
    rows = []
    for a in report.data["arms"]:
        u = a["usage"]
        rows.append([a["label"], str(a["problems"]), f"{a['samples']['finished']}/{a['samples']['total']}"]
                    + [fmt_interval(a[key]) for key, _ in HEADLINE_METRICS]
                    + [fmt_speedup(a["geomean_speedup"]), fmt_cost(u["cost_usd"]), fmt_usage_tokens(u),
                       fmt_seconds(u["wall_s"]), fmt_gpu_seconds(u["gpu_s"], a["device"])])
    return head, rows


def comparison_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    k = report.k
    head = ["treatment vs baseline", "problems"] + [f"Δ {t.format(k=k)}" for _, t in HEADLINE_METRICS] + [
        f"wins/losses/ties (pass@{k})"]
    rows = []
    for c in report.data["comparisons"]:
        m = c["metrics"]
        pk = m["pass_at_k"]
        rows.append([f"{c['treatment']} vs {c['baseline']}", str(pk["n"])]
                    + [fmt_delta(m[key]) for key, _ in HEADLINE_METRICS]
                    + [f"{pk['wins']}/{pk['losses']}/{pk['ties']}"])
    return head, rows


def curve_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    head = ["p"] + [a["label"] for a in report.data["arms"]]
    rows = []
    for p in CURVE_TABLE_PS:
        row = [f"{p:g}"]
        for a in report.data["arms"]:
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
            if d is None:
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
                cells.append(f"{fmt_interval(iv)} (n={iv['n']})" if iv else "—")
        rows.append(cells)
    return head, rows


def problem_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    arms = report.data["arms"]
    k = report.k
    head = ["problem", "category"] + [a["label"] for a in arms]
    by_arm = [{p["problem"]: p for p in a["per_problem"]} for a in arms]
    names = sorted({name for m in by_arm for name in m})
    rows = []
    for name in names:
        cat = next(m[name]["category"] for m in by_arm if name in m)
        cells = [name, cat]
        for m in by_arm:
            p = m.get(name)
            if p is None:
                cells.append("—")
                continue
            failing = ", ".join(f"{v}×{n}" for v, n in p["verdicts"].items() if v != "correct")
            cells.append(f"{p['correct']}/{p['n']} correct; pass@{k} {fmt_num(p['pass_at_k'])}; "
                         f"best {fmt_speedup(p['best_speedup'])}" + (f"; {failing}" if failing else ""))
        rows.append(cells)
    return head, rows


# -- markdown ---------------------------------------------------------------------------------------
def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(_md_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_figures(report: Report, directory: Path) -> dict[str, Path]:
    """Write every figure as PNG into `directory`; returns stem -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for stem, (_, builder) in FIGURES.items():
        path = directory / f"{stem}.png"
        path.write_bytes(builder(report))
        out[stem] = path
    return out


def to_markdown(report: Report, figures: dict[str, str] | None = None) -> str:
    """The report as markdown. `figures` maps a figure stem to the link to use (written by the caller)."""
    d = report.data
    figures = figures or {}
    k = report.k
    out = [f"# pkb-agent report ({len(d['runs'])} run{'s' if len(d['runs']) != 1 else ''})", ""]
    out.append(md_table(*run_rows(report)))
    out += ["", "## Headline", "",
            f"Means over problems with a {d['level']:.0%} bootstrap interval (percentile method, "
            f"{d['resamples']} resamples of problems, seed {d['seed']}); k = {k}. fast_p counts samples that "
            "are correct and faster than p times the reference.", "", md_table(*headline_rows(report))]
    for note in d["notes"]:
        out.append(f"\nNote: {note}.")
    excluded = [(a["label"], a["excluded_problems"]) for a in d["arms"] if a["excluded_problems"]]
    for label, names in excluded:
        out.append(f"\n{label}: left out (fewer than {k} finished samples): {', '.join(names)}")
    if d["comparisons"]:
        out += ["", "## Comparison", "",
                f"Per-problem differences (treatment − baseline) over the problems both have, with a paired "
                f"bootstrap {d['level']:.0%} interval.", "", md_table(*comparison_rows(report))]
    out += ["", f"## fast_p curve (k = {k})", ""]
    if "fast_p" in figures:
        out += [f"![fast_p curve]({figures['fast_p']})", ""]
    out += [md_table(*curve_rows(report))]
    out += ["", "## Speedup and roofline-fraction distributions (correct samples)", ""]
    for stem in ("speedup", "roofline"):
        if stem in figures:
            out += [f"![{FIGURES[stem][0]}]({figures[stem]})", ""]
    out += [md_table(*distribution_rows(report))]
    out += ["", "## Failure classes", ""]
    if "failures" in figures:
        out += [f"![failure-class breakdown]({figures['failures']})", ""]
    out += [md_table(*failure_rows(report))]
    out += ["", "## Per category", "", md_table(*category_rows(report))]
    out += ["", "## Per problem", "", md_table(*problem_rows(report))]
    out += ["", "Transcripts: see the HTML report (`pkb report RUN --format html`).", ""]
    return "\n".join(out)


# -- HTML -------------------------------------------------------------------------------------------
CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1320px;
       color: #1b1b1b; background: #ffffff; line-height: 1.4; padding: 0 16px; }
h1 { font-size: 1.6em; margin-bottom: 4px; } h2 { margin-top: 32px; border-bottom: 1px solid #d0d4da; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.9em; }
th, td { border: 1px solid #d0d4da; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #eef0f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img.figure { max-width: 100%; border: 1px solid #e3e5e8; margin: 8px 0; }
.note { color: #555; font-size: 0.9em; }
.ok { color: #1a7f37; font-weight: 600; } .bad { color: #b42318; font-weight: 600; }
details { margin: 4px 0; } summary { cursor: pointer; }
details.sample { border: 1px solid #d0d4da; border-radius: 4px; padding: 4px 8px; }
details.arm > summary, details.problem > summary { font-weight: 600; }
.msg { border-left: 4px solid #c9ccd1; margin: 8px 0; padding: 2px 10px; }
.msg.assistant { border-color: #8a63d2; } .msg.tool { border-color: #e08a00; } .msg.user { border-color: #5a8f29; }
.role { font-size: 0.8em; text-transform: uppercase; color: #555; letter-spacing: 0.05em; }
pre { white-space: pre-wrap; word-break: break-word; background: #f6f7f9; padding: 8px; margin: 4px 0;
      max-height: 480px; overflow: auto; font-size: 0.85em; }
code { font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def html_table(head: list[str], rows: list[list[str]], table_id: str = "") -> str:
    ident = f' id="{esc(table_id)}"' if table_id else ""
    out = [f"<table{ident}><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _img(stem: str, png: bytes) -> str:
    alt = FIGURES[stem][0]
    data = base64.b64encode(png).decode("ascii")
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


def _sample_html(s: Sample, device: str | None) -> str:
    r = s.record
    calls = ", ".join(f"{k} {v}" for k, v in sorted(r.tool_calls.items())) or "none"
    meta = (f'<div class="note">model {esc(r.model)} · tokens {r.usage.input_tokens} in / '
            f'{r.usage.output_tokens} out · cost {esc(fmt_cost(sample_cost(s)))} · wall {fmt_seconds(r.wall_s)} · '
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
        final = (f'<details class="final"><summary>final.py — scored: {_verdict_span(r.verdict, r.correct)}'
                 f'{esc(" · " + msg) if msg else ""}</summary><pre><code>{esc(s.final_code)}</code></pre></details>')
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
    runs = html_table(*run_rows(report), "runs-table")
    excluded = "".join(f'<p class="note">{esc(a["label"])}: left out (fewer than {k} finished samples): '
                       f'{esc(", ".join(a["excluded_problems"]))}</p>' for a in d["arms"] if a["excluded_problems"])
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',
        f"<title>pkb-agent report — {esc(', '.join(r['run_id'] for r in d['runs']))}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>pkb-agent report</h1>{runs}",
        '<section id="headline"><h2>Headline</h2>',
        f'<p class="note">Means over problems with a {d["level"]:.0%} bootstrap interval (percentile method, '
        f'{d["resamples"]} resamples of problems, seed {d["seed"]}); k = {k}. fast_p counts samples that are '
        "correct and faster than p times the reference.</p>",
        html_table(*headline_rows(report), "headline-table"), excluded,
        "".join(f'<p class="note">Note: {esc(note)}.</p>' for note in d["notes"]), "</section>",
    ]
    if d["comparisons"]:
        parts += ['<section id="comparison"><h2>Comparison</h2>',
                  f'<p class="note">Per-problem differences (treatment − baseline) over the problems both have, '
                  f'with a paired bootstrap {d["level"]:.0%} interval.</p>',
                  html_table(*comparison_rows(report), "comparison-table"), "</section>"]
    parts += [f'<section id="fast-p"><h2>fast_p curve (k = {k})</h2>', _img("fast_p", fast_p_figure(report)),
              html_table(*curve_rows(report), "fast-p-table"), "</section>",
              '<section id="distributions"><h2>Speedup and roofline-fraction distributions (correct samples)</h2>',
              _img("speedup", speedup_figure(report)), _img("roofline", roofline_figure(report)),
              html_table(*distribution_rows(report), "distribution-table"), "</section>",
              '<section id="failures"><h2>Failure classes</h2>', _img("failures", failure_figure(report)),
              html_table(*failure_rows(report), "failure-table"), "</section>",
              '<section id="categories"><h2>Per category</h2>', html_table(*category_rows(report), "category-table"),
              "</section>",
              '<section id="problems"><h2>Per problem</h2>', html_table(*problem_rows(report), "problem-table"),
              "</section>",
              '<section id="transcripts"><h2>Transcripts</h2>',
              '<p class="note">Every sample: the conversation (turns, tool calls and answers), each candidate with '
              "its verdict, and the final scored code.</p>", transcripts_html(report), "</section>",
              "</body></html>"]
    return "\n".join(parts)
