"""What is decided before anything runs: the integrity checks in force, what the record says of a PKB
problem's inputs, and what this machine cannot run (nobody's failure, said at once)."""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.common import failures
from harness.common.integrity import IntegrityConfig
from harness.compiling import requirements
from harness.config import EvalConfig
from harness.evaluation.context import Context
from harness.evaluation.record import Record
from harness.evaluation.stop import unexpected_failure
from harness.problems.parallelkernelbench import input_report
from harness.problems.parallelkernelbench import multicast as pkb_multicast
from harness.records.results import Failure


def integrity_checks(config: EvalConfig, integrity_config: IntegrityConfig | dict[str, Any] | None,
                     device: str) -> IntegrityConfig:
    """The device's defaults with `config.integrity`'s settings on top; `integrity_config`, where given,
    replaces `config.integrity`."""
    checks = IntegrityConfig.coerce(
        integrity_config if integrity_config is not None else config.integrity.overrides(), device)
    if config.ranks_per_gpu > 1:
        # Ranks sharing a GPU run in its time slices: one rank late by 2 ms rarely exposes a race there
        # (measured on the H200: gpu_race_no_barrier passed 2 such trials). More, and later, stress calls.
        checks = dataclasses.replace(checks, stress_trials=max(checks.stress_trials, 6),
                                     stress_delay_s=max(checks.stress_delay_s, 0.02))
    return checks


def prepare(ctx: Context, record: Record) -> bool:
    """Whether the evaluation goes on; where it does not, `record.failure` says why."""
    if ctx.problem.origin == "pkb":
        # PKB's generators may leave inputs constant across trials (or the harness had to perturb them):
        # the record says which inputs, and why, whatever the verdict.
        report = input_report.input_report(ctx.problem, ctx.shape, ctx.world_size)
        record.flags.extend(sorted(report.flags()))
        record.evidence["inputs"] = report.as_dict()
    # What this machine cannot run (a CUDA candidate on a CPU-only run, a missing package): nobody's
    # failure, said at once in one line, never charged to the model.
    try:
        issue = requirements.environment_issue(ctx.problem, ctx.path, ctx.device)
    except Exception as exc:  # noqa: BLE001 - it reads the candidate's source: a source it chokes on is the candidate's
        record.failure = unexpected_failure(exc, "compile")
        return False
    if issue:
        record.failure = Failure(verdict=failures.INFRA_ERROR, message=issue, phase="environment",
                                 infra_cause="environment")
        record.evidence["environment_issue"] = issue
        return False
    refused = pkb_multicast.emulation_reason(ctx.text) if ctx.emulated else None
    if refused:  # multicast the emulation cannot rewrite (docs/emulation.md): nothing of it runs
        record.failure = Failure(verdict=failures.INFRA_ERROR, message=f"not available in emulation: {refused}",
                                 phase="environment", infra_cause="emulation")
        return False
    return True
