"""What a run writes about itself (docs/run-layout.md): run.json's header (`create_run`), and sample.json's
record of one sample (`sample_record`) with the fields the final scoring decides (`judgement`), its failure
line and its judgements (`attempt_entry`). Pure but for create_run's one write."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import prompts
from agent import final_scoring, manifest
from agent.budgets import Spent
from agent.run_config import RunConfig, RunError
from agent.rundir import FINISHED, RUN_SCHEMA, SAMPLE_SCHEMA, RunDir, write_json_atomic
from agent.sample_spec import SampleSpec
from agent.stop_reasons import StopReason, checked
from agent.usage import PriceTable
from agent.versions import versions
from harness.common import failures
from harness.common.flags import is_emulated
from harness.measure import topology
from harness.measure.discovery import TopologyError
from harness.problems.problem import Problem
from harness.records.environment import environment

NO_CODE = StopReason.NO_CODE.value


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- run.json ---------------------------------------------------------------------------------------
def topology_record(device: str) -> dict[str, Any] | None:
    """The saved topology profile (`pkb topology`), on CUDA runs; None on CPU or where none is saved."""
    if device != "cuda":
        return None
    try:
        profile = topology.load()
    except TopologyError:
        return None
    return profile.model_dump(mode="json") if profile is not None else None


def run_header(run_id: str, config: RunConfig, prices: PriceTable | None, *, problems: Sequence[Problem] = (),
               executor: str | None = None) -> dict[str, Any]:
    dumped = config.model_dump(mode="json")
    hashes = prompts.hashes()
    env = environment()
    return {
        "schema": RUN_SCHEMA,
        "run_id": run_id,
        "created_at": now(),
        "config": dumped,
        "versions": versions(),
        "prompt_hashes": hashes,
        "prices": {"source": prices.source, "version": prices.version} if prices is not None else None,
        "topology": topology_record(config.device),
        "environment": env,
        # agent.manifest: the code's commit, the problems' hashes, the hardware: what a comparison must hold equal
        "manifest": manifest.build(dumped, problem_hashes=manifest.problem_hashes(problems), prompt_hashes=hashes,
                                   environment=env, executor=executor),
    }


def create_run(run_dir: RunDir, config: RunConfig, prices: PriceTable | None, *, problems: Sequence[Problem] = (),
               executor: str | None = None) -> dict[str, Any]:
    """Start a new run: refuse an existing one (it needs --resume). `problems` and `executor` go into its manifest."""
    if run_dir.run_json.exists():
        raise RunError(f"run {run_dir.path} already exists; add --resume to continue it, or pick another --run-id")
    run_dir.path.mkdir(parents=True, exist_ok=True)
    header = run_header(run_dir.path.name, config, prices, problems=problems, executor=executor)
    write_json_atomic(run_dir.run_json, header)
    return header


# -- records ----------------------------------------------------------------------------------------
def roofline_fraction(result: dict[str, Any] | None) -> float | None:
    """The candidate's fraction of the hardware bound (harness.measure.roofline: roofline.candidate.fraction)."""
    roofline = (result or {}).get("roofline")
    achieved = roofline.get("candidate") if isinstance(roofline, dict) else None
    value = achieved.get("fraction") if isinstance(achieved, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


MAX_MESSAGE_CHARS = 300  # an attempt's failure line in sample.json


def judgement(state: dict[str, Any]) -> dict[str, Any]:
    """The fields of sample.json that the final scoring decides (`result`, `held_out` and `scoring` of the state):
    one place for a first judgement and a judgement again (agent.sample_life.SampleLife.judge_again)."""
    result = state.get("result")
    scoring = state.get("scoring") or {}
    overall = final_scoring.combined(result, state.get("held_out"))
    verdict = overall["verdict"] if result else NO_CODE
    failure = (result or {}).get("failure") or {}
    return {
        "verdict": verdict,
        # correct on the visible shape and on every held-out shape (agent.final_scoring); both figures kept
        "correct": overall["correct"],
        "correct_visible": overall["correct_visible"],
        "held_out": {"correct": overall["held_out_correct"], "shapes": list(state.get("held_out") or [])},
        "speedup": result.get("speedup") if result else None,
        "flags": list(result.get("flags") or []) if result else [],
        # False when an integrity flag (harness.common.integrity.SPEEDUP_DISQUALIFIERS) voids the speedup for fast_p;
        # results written before the harness had the field count as eligible.
        "fast_eligible": bool(result.get("fast_eligible", True)) if result else False,
        # True when ranks shared GPUs (harness.emulation): the speedup is recorded, never counted.
        "emulated": is_emulated(result) if result else False,
        "roofline_fraction": roofline_fraction(result),
        "scoring_seed": result.get("seed") if result else None,
        "scoring_attempts": scoring.get("attempts", 0),
        # infra_error: which of harness.common.failures.INFRA_CAUSES (null: a held-out shape's, or an older result)
        "infra_cause": (failure.get("infra_cause") if verdict == failures.INFRA_ERROR
                        and (result or {}).get("verdict") == failures.INFRA_ERROR else None),
    }


def failure_line(state: dict[str, Any]) -> str | None:
    """The first line of the message of the failure that decided the verdict (a held-out shape's when only that
    failed), at most MAX_MESSAGE_CHARS; None when correct or without code."""
    result = state.get("result")
    if not result or final_scoring.combined(result, state.get("held_out"))["correct"]:
        return None
    text = str((result.get("failure") or {}).get("message") or "")
    if result.get("correct"):
        text = next((str(h.get("message") or "") for h in state.get("held_out") or [] if not h.get("correct")), text)
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:MAX_MESSAGE_CHARS]


def attempt_entry(record: dict[str, Any], attempt: int, message: str | None, *, after_wait_s: float | None = None,
                  kept: str | None = None) -> dict[str, Any]:
    """One judgement of a sample in sample.json's `attempts`: its verdict and infra cause, when it ended, the wait
    before it, and `kept`: the folder its records were set aside in (null: the sample's own files, the last)."""
    return {"attempt": attempt, "verdict": record.get("verdict"), "infra_cause": record.get("infra_cause"),
            "message": message, "finished_at": record.get("finished_at"), "after_wait_s": after_wait_s,
            "kept": kept}


def sample_record(spec: SampleSpec, model: str, *, status: str, started_at: str, state: dict[str, Any] | None = None,
                  finished_at: str | None = None, error: str | None = None) -> dict[str, Any]:
    """sample.json (docs/run-layout.md)."""
    state = state or {}
    spent = Spent.from_dict(state.get("spent"))
    scoring = state.get("scoring") or {}
    record: dict[str, Any] = {
        "schema": SAMPLE_SCHEMA,
        "problem": spec.problem.name,
        "category": spec.problem.category,
        "condition": spec.condition.name,
        "sample": spec.k,
        "model": model,
        "status": status,
        "stop_reason": checked(state.get("stop_reason")),
        **judgement(state),
        "usage": {"input_tokens": spent.input_tokens, "output_tokens": spent.output_tokens,
                  "cache_read_tokens": spent.cache_read_tokens, "cache_write_tokens": spent.cache_write_tokens,
                  "reasoning_tokens": spent.reasoning_tokens,
                  "cost_usd": round(spent.cost_usd, 6),
                  # cost_usd is 0 where the price table does not list the model: this says so
                  "cost_known": spent.cost_known,
                  "usage_reported": spent.usage_reported},
        "turns": spent.turns,
        "tool_calls": dict(spent.tool_calls),
        "wall_s": round(spent.wall_s + float(scoring.get("seconds") or 0.0), 3),
        "gpu_s": round(spent.gpu_s + float(scoring.get("gpu_s") or 0.0), 3),
        "candidates": len(state.get("candidates") or []),
        # agent.context: how many old candidates the requests carried as references, in how many batches
        "context": {"shortened": len((state.get("context") or {}).get("shortened") or []),
                    "batches": int((state.get("context") or {}).get("batches") or 0)},
        "final": "final.py" if scoring.get("final") else None,
        "prompt": state.get("prompt"),  # which prompt and which extraction rule (agent.prompting)
        "best": state.get("best"),  # the best candidate by the tools' evidence, scored apart
        "trajectory": final_scoring.trajectory(state.get("candidates") or []),
        "started_at": started_at,
        "finished_at": finished_at,
    }
    if status == FINISHED:  # every judgement of the sample; a judgement again adds one (agent.sample_life)
        record["attempts"] = [attempt_entry(record, 1, failure_line(state))]
    if error or state.get("error"):
        record["error"] = error or state.get("error")
    return record
