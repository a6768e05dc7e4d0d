"""The run report's numbers: every metric of one or more runs, computed once (Report.data is exactly what
`pkb report --format json` prints); .markdown and .html lay them out, .figures draws them.

An *arm* is one condition of one run. The report shows every arm side by side (headline table, fast_p
curve, speedup and roofline distributions, failure classes, categories, per-problem rows) and compares
arms in pairs (agent.report.compare: any condition may be the baseline) per problem, with paired bootstrap
intervals, permutation tests and Holm's correction. Two runs are compared only where their manifests
(agent.manifest) agree on everything but the compared factor, unless forced, and then the comparison is marked.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import manifest
from agent.conditions import REPLAY, ZERO_SHOT
from agent.report import accounting, compare, metrics, trajectories
from agent.report.run_reader import Run, Sample
from harness.common.flags import is_emulated, timing_note
from harness.emulation import rewrite_record

REPORT_SCHEMA = "pkb-report/1"
BASELINE_CONDITION = ZERO_SHOT
REPLAY_CONDITION = REPLAY  # scores files made elsewhere: what they cost in tokens and dollars is not in the run
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
    # the problems asked, judged and left out (agent.report.accounting); None until make_arms has k
    accounts: accounting.Accounting | None = None
    not_measured: str | None = None  # why fast_p and speedups were not measured; None: they were

    @property
    def accounted(self) -> accounting.Accounting:
        if self.accounts is None:
            raise ValueError(f"arm {self.label}: not accounted (make_arms sets it)")
        return self.accounts


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


def make_arms(runs: Sequence[Run], k: int = 1) -> list[Arm]:
    arms: list[Arm] = []
    for run, name in zip(runs, run_labels(runs), strict=True):
        # A run whose config shares GPUs is emulated in every sample, whatever its results say.
        forced = {"emulated": True} if ranks_per_gpu(run) > 1 else {}
        asked = accounting.asked_problems(run.config, run.manifest, [s.record.problem for s in run.samples])
        for condition in run.conditions:
            samples = [s for s in run.samples if s.record.condition == condition]
            records = [{**s.record.metrics_view(), **forced} for s in samples]
            label = condition if len(runs) == 1 else f"{name}/{condition}"
            scores = metrics.score_problems(records).get(condition, [])
            accounts = accounting.account(records, [s.result for s in samples], asked,
                                          accounting.samples_asked(run.config), k)
            arms.append(Arm(label, run, condition, samples, records, scores, accounts,
                            accounting.speed_not_measured(records, run.config)))
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


FAST_KEYS = ("fast_1_at_k", "fast_1_5_at_k")  # the headline's speed metrics: "not measured" where an arm timed nothing


def not_measured_interval(reason: str) -> dict[str, Any]:
    """A metric that was not measured: no mean (null in JSON), no problem, and why; never 0."""
    return {"mean": math.nan, "low": math.nan, "high": math.nan, "n": 0, "not_measured": reason}


def _intervals(scores: Sequence[metrics.ProblemScore], k: int, seed: int, resamples: int,
               not_measured: str | None) -> dict[str, dict[str, Any]]:
    """The headline metrics' means and intervals over `scores`; the speed ones not measured where so."""
    out: dict[str, dict[str, Any]] = {}
    for key, fn in headline_metrics(k).items():
        if key in FAST_KEYS and not_measured is not None:
            out[key] = not_measured_interval(not_measured)
        else:
            out[key] = dict(metrics.mean_over_problems(scores, fn, seed=seed, resamples=resamples).as_dict())
    return out


def _over_asked(arm: Arm, k: int, seed: int, resamples: int) -> dict[str, Any]:
    """The headline metrics over every asked problem, what was not judged counted as not solved."""
    accounts = arm.accounted
    categories = {s.record.problem: s.record.category for s in arm.run.samples}
    scores = metrics.score_asked(arm.records, arm.condition, accounts.samples_per_problem, categories, k)
    return {"problems": len(scores), **_intervals(scores, k, seed, resamples, arm.not_measured)}


def _arm_metrics(arm: Arm, k: int, seed: int, resamples: int) -> dict[str, Any]:
    scores, _ = metrics.eligible(arm.scores, k)
    accounts = arm.accounted
    usage = arm_usage(arm)
    stat = headline_metrics(k)
    finished = metrics.finished(arm.records)
    measured = arm.not_measured is None
    speedups = [v for s in scores for v in s.speedups] if measured else []
    dist = metrics.summarize(speedups)
    roof = metrics.roofline_summary(scores)
    pass_by_cat = metrics.per_category(scores, stat["pass_at_k"], seed=seed, resamples=resamples)
    fast_by_cat = metrics.per_category(scores, stat["fast_1_at_k"], seed=seed, resamples=resamples)
    curve = metrics.fast_p_curve(scores, k) if measured else [(p, math.nan) for p in metrics.FAST_P_GRID]
    return {
        "label": arm.label,
        "run_id": arm.run.run_id,
        "condition": arm.condition,
        "model": str(arm.run.config.get("model", "")),
        "problems": len(scores),  # judged: the denominator of the metrics below
        "excluded_problems": [e.problem for e in accounts.excluded],
        "accounting": accounts.as_dict(),
        "complete": accounts.complete,
        "speed": {"measured": measured, "not_measured": arm.not_measured},
        "samples": {"total": len(arm.records), "finished": len(finished),
                    "infra_error": sum(1 for r in finished if r.get("verdict") == "infra_error"),
                    "asked": sum(accounts.samples_per_problem.values())},
        **_intervals(scores, k, seed, resamples, arm.not_measured),
        "over_asked": _over_asked(arm, k, seed, resamples),
        "geomean_speedup": metrics.geomean_speedup(scores) if measured else None,
        "speedup": dist.as_dict() if dist else None,
        "speedups": speedups,
        "speedups_not_counted": metrics.uncounted_speedups(arm.records),
        "roofline_fraction": roof.as_dict() if roof else None,
        "roofline_fractions": [v for s in scores for v in s.roofline_fractions],
        "failures": metrics.failure_counts(arm.records),
        "device": arm.run.config.get("device"),
        "usage": usage,
        "per_solved": compare.per_solved(usage, scores),
        "per_category": {cat: {"pass_at_k": iv.as_dict(),
                               "fast_1_at_k": fast_by_cat[cat].as_dict() if measured
                               else not_measured_interval(str(arm.not_measured))}
                         for cat, iv in pass_by_cat.items()},
        "fast_p_curve": [[p, v] for p, v in curve],
        "per_problem": [
            {"problem": s.problem, "category": s.category, "n": s.n, "correct": s.correct,
             "pass_at_1": s.pass_at(1), "pass_at_k": s.pass_at(k) if s.n >= k else None,
             "fast_1_at_k": s.fast_at(1.0, k) if s.n >= k and measured else None,
             "best_speedup": max(s.speedups) if s.speedups and measured else None,
             "verdicts": dict(sorted(Counter(s.verdicts).items())),
             "build": build_stage(arm.samples, s.problem)}
            for s in arm.scores
        ],
    }


def build_stage(samples: Sequence[Sample], problem: str) -> dict[str, Any] | None:
    """A problem's compile stage over its samples: the median seconds, and how many samples' native builds
    came from the compile stage's cache (integrity.builds, each marked by harness.compiling.compile)."""
    results = [s.result for s in samples if s.record.problem == problem and s.result]
    seconds = sorted(float(r["stages"]["compile"]) for r in results if "compile" in (r.get("stages") or {}))
    builds = [b for r in results if (b := (r.get("integrity") or {}).get("builds"))]
    if not seconds:
        return None
    return {"median_s": seconds[len(seconds) // 2], "native": len(builds),
            "cached": sum(all(x.get("cache") == "hit" for x in b) for b in builds)}


def arm_key(arm: Arm) -> compare.ArmKey:
    """What agent.report.compare pairs arms by: condition, run, and the model with its settings."""
    view = manifest.comparable(arm.run.header())
    model = json.dumps({k: v for k, v in view.items() if k.startswith(manifest.MODEL_PREFIX)}, sort_keys=True)
    return compare.ArmKey(arm.label, arm.condition, arm.run.path, model)


def confounders(base: Arm, treatment: Arm, factor: str) -> list[str]:
    """Manifest keys (agent.manifest.comparable) in which the two arms' runs differ besides the compared factor."""
    if base.run is treatment.run:
        return []
    keys = manifest.differing_keys(manifest.comparable(base.run.header()), manifest.comparable(treatment.run.header()))
    return [k for k in keys if not (factor == "model" and k.startswith(manifest.MODEL_PREFIX))]


def dropped_problems(base: Arm, treatment: Arm) -> list[dict[str, str]]:
    """The problems a comparison leaves out (asked by either arm, not judged in both), each with why."""
    judged = set(base.accounted.judged) & set(treatment.accounted.judged)
    asked = list(dict.fromkeys([*base.accounted.asked, *treatment.accounted.asked]))
    out = []
    for problem in asked:
        if problem in judged:
            continue
        why = []
        for arm in (base, treatment):
            excluded = next((e for e in arm.accounted.excluded if e.problem == problem), None)
            if problem not in arm.accounted.asked:
                why.append(f"not asked in {arm.label}")
            elif excluded is not None:
                why.append(f"not judged in {arm.label} ({excluded.reason})")
        out.append({"problem": problem, "reason": "; ".join(why)})
    return out


def _comparisons(arms: Sequence[Arm], k: int, seed: int, resamples: int, *, baseline: str | None,
                 all_pairs: bool, force: bool) -> tuple[str | None, list[dict]]:
    keys = [arm_key(a) for a in arms]
    try:
        chosen = compare.pairs(keys, baseline, all_pairs=all_pairs, default_condition=BASELINE_CONDITION)
    except compare.PairingError as err:
        raise ReportError(str(err)) from None
    if not chosen:
        return None, []
    stat = headline_metrics(k)
    out = []
    for b, t in chosen:
        base, arm = arms[b], arms[t]
        factor = compare.compared_factor(keys[b], keys[t])
        differ = confounders(base, arm, factor)
        if differ and not force:
            shown = ", ".join(differ[:6]) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
            files = manifest.code_note(base.run.header(), arm.run.header(), differ)  # which files, where code
            raise ReportError(f"{arm.label} vs {base.label}: the runs' manifests differ in {shown} besides the "
                              f"compared {factor}{files}; add --force to compare them anyway (the comparison is "
                              "marked)")
        base_scores, _ = metrics.eligible(base.scores, k)
        scores, _ = metrics.eligible(arm.scores, k)
        shared = set(base.accounted.judged) & set(arm.accounted.judged)
        result = compare.compare([s for s in base_scores if s.problem in shared],
                                 [s for s in scores if s.problem in shared], stat, seed=seed, resamples=resamples)
        unmeasured = base.not_measured or arm.not_measured
        if unmeasured is not None:  # a difference of speeds one side never measured is no difference
            for key in (*FAST_KEYS, "speedup_ratio"):
                result[key] = not_measured_interval(unmeasured)
        out.append({"baseline": base.label, "treatment": arm.label, "factor": factor, "confounded": differ,
                    "shared_problems": len(shared), "dropped": dropped_problems(base, arm),
                    "metrics": result})
    compare.apply_holm(out)
    reference = next((arms[b].label for b, _ in chosen), None)
    return reference, out


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
            out.append(f"run {label} is emulated ({shared}, symmetric memory emulated, host collectives): "
                       "correctness is real, its timings are not speedups, and no sample of it counts as fast")
    for run, label in zip(runs, run_labels(runs), strict=True):
        rewritten = sorted({s.record.problem for s in run.samples if rewrite_record.of_result(s.result) is not None})
        if rewritten:
            out.append(f"run {label}: {len(rewritten)} problem(s) ran builds rewritten for multimem (NVLink multicast "
                       f"emulated with unicast accesses, docs/emulation.md): {', '.join(rewritten)}")
    if len(runs) > 1:
        for key, name in SETTINGS_COMPARED:
            values = [r.config.get(key) for r in runs]
            if len(set(map(str, values))) > 1:
                seen = ", ".join(f"{label}: {v}" for label, v in zip(run_labels(runs), values, strict=True))
                out.append(f"the runs differ in {name} ({seen}): their speedups and costs are not comparable")
    for run, label in zip(runs, run_labels(runs), strict=True):
        if (note := timing_note(run.config.get("device"))) is not None:
            out.append(f"run {label} ran on CPU: {note}; its fast_p and speedups show that the pipeline works, "
                       "not how fast a kernel is")
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
          resamples: int = metrics.DEFAULT_RESAMPLES, baseline: str | None = None, all_pairs: bool = False,
          force: bool = False) -> Report:
    """Compute every metric of the report. k defaults to the runs' samples per problem. `baseline`, `all_pairs`:
    which arms are compared (agent.report.compare.pairs); a comparison of runs whose manifests differ in more
    than the compared factor is refused (ReportError), or with `force` marked."""
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
    arms = make_arms(runs, k)
    reference, comparisons = _comparisons(arms, k, seed, resamples, baseline=baseline, all_pairs=all_pairs,
                                          force=force)
    data: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "k": k,
        "seed": seed,
        "resamples": resamples,
        "level": metrics.DEFAULT_LEVEL,
        "notes": notes(runs),
        "runs": [{"run_id": r.run_id, "path": r.path, "created_at": r.created_at,
                  "model": str(r.config.get("model", "")), "conditions": r.conditions,
                  "samples": r.samples_per_problem, "begun": len(r.samples),
                  "finished": len(metrics.finished(r.records())), "device": r.config.get("device"),
                  "world_size": r.config.get("world_size"), "shape": r.config.get("shape"),
                  "emulated": run_is_emulated(r), "ranks_per_gpu": ranks_per_gpu(r),
                  "problems": sorted({s.record.problem for s in r.samples}),
                  "versions": r.versions} for r in runs],
        "arms": [_arm_metrics(a, k, seed, resamples) for a in arms],
        "baseline": reference,
        "comparisons": comparisons,
        "permutations": compare.PERMUTATIONS,
        # held-out shapes, the best candidate, and pass / best speedup by turn, tokens and dollars
        "trajectories": trajectories.summarize(arms),
    }
    marked = [c for c in comparisons if c["confounded"]]
    for c in marked:
        data["notes"].append(f"{c['treatment']} vs {c['baseline']} (marked †) compares runs whose manifests also "
                             f"differ in {', '.join(c['confounded'])}: not a clean comparison of the {c['factor']}")
    data["complete"] = all(a["complete"] for a in data["arms"])
    data["incomplete"] = [accounting.incomplete_line(a["label"], a["accounting"]) for a in data["arms"]
                          if not a["complete"]]
    for arm in data["arms"]:
        if arm["speed"]["not_measured"]:
            data["notes"].append(f"{arm['label']}: fast_p, speedups and their geometric mean were not measured "
                                 f"({arm['speed']['not_measured']}): shown as —, never as 0")
    for c in comparisons:
        if c["dropped"]:
            names = ", ".join(d["problem"] for d in c["dropped"])
            data["notes"].append(f"{c['treatment']} vs {c['baseline']}: compared on the {c['shared_problems']} "
                                 f"problem(s) judged in both; {len(c['dropped'])} dropped ({names})")
    for arm in data["arms"]:
        uncounted = arm["speedups_not_counted"]
        if uncounted["samples"] and arm["speed"]["measured"]:  # else the note above says why none counts
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
