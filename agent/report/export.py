"""A run's samples as flat records, one a line (`pkb export RUN --format jsonl`; schema in docs/run-layout.md).

Every line is one JSON object with scalar values (and `flags`, a list), the same keys on every line but for
`tool_calls.<tool>` (one per tool the sample called): what the sample was (run, sweep cell, model, condition,
problem, sample, seed), how it ended (verdict, its failure class, a short infra cause, the failure's first line,
correct, speedup, whether the speedup counts, fast at 1x: null where speed was not measured, speed_note why),
what it spent (tokens, dollars, wall and GPU seconds, turns, tool calls), and its run's manifest keys
(agent.manifest.comparable: code commit and dirty flag, the problem's source hash, prompts, hardware
fingerprint, executor, model settings, budgets, trials, device, world size, shape). So
`pandas.read_json(path, lines=True)` gives a table to group by condition, model or commit as it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

from agent import manifest
from agent.report import accounting, metrics
from agent.report.run_reader import Run
from harness.common.flags import timing_note

EXPORT_SCHEMA = "pkb-sample-export/1"


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            _flat(f"{prefix}.{key}" if prefix else str(key), inner, out)
    else:
        out[prefix] = value


def _safe(value: Any) -> Any:
    return None if isinstance(value, float) and (math.isnan(value) or math.isinf(value)) else value


def run_keys(run: Run) -> dict[str, Any]:
    """The run's manifest keys, flat, as `manifest.<key>` (the per-problem hashes left for each sample)."""
    view = manifest.comparable(run.header())
    out: dict[str, Any] = {}
    for key, value in view.items():
        if key.startswith("problem_sha256.") or key == "problems":
            continue
        _flat(f"manifest.{key}", value, out)
    return out


def _line(run: Run, view: dict[str, Any], result: dict[str, Any] | None, sweep: str | None,
          cell: str | None) -> dict[str, Any]:
    usage = view.get("usage") or {}
    unmeasured = accounting.sample_speed_not_measured(view, run.config)
    line: dict[str, Any] = {
        "schema": EXPORT_SCHEMA, "run_id": run.run_id, "run_path": run.path, "sweep": sweep, "cell": cell,
        "model": str(run.config.get("model", view.get("model", ""))), "condition": view["condition"],
        "problem": view["problem"], "category": view.get("category"), "sample": view["sample"],
        "seed": run.config.get("seed"), "status": view["status"], "stop_reason": view.get("stop_reason"),
        "verdict": view.get("verdict"), "correct": view.get("correct"),
        "failure_class": accounting.failure_class(view), "infra_cause": accounting.infra_cause(view, result),
        "message": accounting.failure_message(view, result),
        "speedup": view.get("speedup"), "counted_speedup": metrics.counted_speedup(view),
        # unknown (null), not false, where the speed was never measured; speed_note says why
        "fast_1": None if unmeasured else metrics.is_fast(view, 1.0),
        "speed_note": unmeasured or (timing_note(run.config.get("device")) if view.get("correct") else None),
        "fast_eligible": view.get("fast_eligible"), "emulated": bool(view.get("emulated")),
        "flags": list(view.get("flags") or []), "roofline_fraction": view.get("roofline_fraction"),
        "turns": view.get("turns"), "candidates": view.get("candidates"), "wall_s": view.get("wall_s"),
        "gpu_s": view.get("gpu_s"), "scoring_seed": view.get("scoring_seed"), "started_at": view.get("started_at"),
        "finished_at": view.get("finished_at"),
    }
    for key in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
                "cost_usd", "cost_known", "usage_reported"):
        line[f"usage.{key}"] = usage.get(key)
    for tool, n in sorted((view.get("tool_calls") or {}).items()):
        line[f"tool_calls.{tool}"] = n
    return line


def _not_started(run: Run) -> list[dict[str, Any]]:
    """A view per asked sample that has no sample.json: every asked problem is on some line."""
    asked = accounting.asked_problems(run.config, run.manifest, [s.record.problem for s in run.samples])
    have = {(s.record.condition, s.record.problem, s.record.sample) for s in run.samples}
    per_problem = accounting.samples_asked(run.config)
    conditions = list(dict.fromkeys([*(str(c) for c in run.config.get("conditions") or []), *run.conditions]))
    out = []
    for condition in conditions:
        for problem in asked:
            count = per_problem or (0 if any(c == condition and p == problem for c, p, _ in have) else 1)
            out += [{"condition": condition, "problem": problem, "sample": k, "status": accounting.NOT_STARTED,
                     "verdict": None, "correct": None} for k in range(count) if (condition, problem, k) not in have]
    return out


def sample_records(run: Run, *, sweep: str | None = None, cell: str | None = None) -> Iterator[dict[str, Any]]:
    """One flat record per sample of `run` (see the module doc), in the run's order; then one per asked sample
    that never started (status `not_started`, the outcome's keys null), so every asked problem has its lines."""
    keys = run_keys(run)
    problems = (run.manifest.get("problem_sha256") or {}) if isinstance(run.manifest, dict) else {}
    emulated = int(run.config.get("ranks_per_gpu") or 1) > 1
    lines = [(s.record.metrics_view(), s.result) for s in run.samples] + [(v, None) for v in _not_started(run)]
    for view, result in lines:
        if emulated and view.get("status") != accounting.NOT_STARTED:
            view = {**view, "emulated": True}
        line = _line(run, view, result, sweep, cell)
        line["problem_sha256"] = problems.get(str(view["problem"]))
        line.update(keys)
        yield {k: _safe(v) for k, v in line.items()}


def to_jsonl(records: Iterator[dict[str, Any]]) -> Iterator[str]:
    for record in records:
        yield json.dumps(record, sort_keys=False, default=str) + "\n"
