"""A run's samples as flat records, one a line (`pkb export RUN --format jsonl`; schema in docs/run-layout.md).

Every line is one JSON object with scalar values (and `flags`, a list), the same keys on every line but for
`tool_calls.<tool>` (one per tool the sample called): what the sample was (run, sweep cell, model, condition,
problem, sample, seed), how it ended (verdict, correct, speedup, whether the speedup counts, fast at 1x),
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
from agent.report import metrics
from agent.report.run_reader import Run

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


def sample_records(run: Run, *, sweep: str | None = None, cell: str | None = None) -> Iterator[dict[str, Any]]:
    """One flat record per sample of `run` (see the module doc), in the run's order."""
    keys = run_keys(run)
    problems = (run.manifest.get("problem_sha256") or {}) if isinstance(run.manifest, dict) else {}
    emulated = int(run.config.get("ranks_per_gpu") or 1) > 1
    for s in run.samples:
        r = s.record
        view = {**r.metrics_view(), **({"emulated": True} if emulated else {})}
        usage = view.get("usage") or {}
        counted = metrics.counted_speedup(view)
        line: dict[str, Any] = {
            "schema": EXPORT_SCHEMA, "run_id": run.run_id, "run_path": run.path, "sweep": sweep, "cell": cell,
            "model": str(run.config.get("model", r.model)), "condition": r.condition, "problem": r.problem,
            "category": r.category, "sample": r.sample, "seed": run.config.get("seed"),
            "status": r.status, "stop_reason": r.stop_reason, "verdict": r.verdict, "correct": r.correct,
            "speedup": r.speedup, "counted_speedup": counted, "fast_1": metrics.is_fast(view, 1.0),
            "fast_eligible": view.get("fast_eligible"), "emulated": bool(view.get("emulated")),
            "flags": list(r.flags), "roofline_fraction": r.roofline_fraction,
            "turns": r.turns, "candidates": view.get("candidates"), "wall_s": r.wall_s, "gpu_s": r.gpu_s,
            "scoring_seed": view.get("scoring_seed"), "started_at": r.started_at, "finished_at": r.finished_at,
        }
        for key in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
                    "cost_usd", "cost_known", "usage_reported"):
            line[f"usage.{key}"] = usage.get(key)
        for tool, n in sorted((r.tool_calls or {}).items()):
            line[f"tool_calls.{tool}"] = n
        line["problem_sha256"] = problems.get(r.problem)
        line.update(keys)
        yield {k: _safe(v) for k, v in line.items()}


def to_jsonl(records: Iterator[dict[str, Any]]) -> Iterator[str]:
    for record in records:
        yield json.dumps(record, sort_keys=False, default=str) + "\n"
