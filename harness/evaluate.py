"""One candidate, one problem, one shape, W ranks: the harness protocol, start to end.

    compile (sandboxed, time limit) -> static findings
    -> reference side: a clean pool draws every input, runs the reference, writes inputs and expected
       outputs to this evaluation's private folder, times the reference (or reads the signed cache);
       meanwhile the candidate's sandboxed pool starts, with no candidate code in it yet
    -> candidate side: load the candidate; one request per correctness call, each carrying its inputs,
       in a secret order; every output judged here as it comes back
    -> timing, one request per iteration, the same for the candidate as for the reference: outputs of
       calls chosen after they returned are judged; claimed times reconciled with this process's clock
    -> plausibility (positive times, fresh inputs, roofline) -> one EvalResult.

Nothing here runs candidate code or reads anything from a candidate but data files and JSON replies;
every comparison, flag and verdict is computed in this process (harness.judge). Every phase has a
limit; an overrun kills the whole rank group and reads as a deadlock when ranks waited on each other,
as a timeout when they were busy (harness.judge.watchdog), with their stacks. No process outlives the
call, and no file outside the evaluation's folders is left.

This module runs the phases in order and turns how they end into the verdict; each phase is a module of
harness.evaluation, over one immutable context (harness.evaluation.context) and one record they fill in
(harness.evaluation.record).
"""

from __future__ import annotations

import random
import secrets
import time
from pathlib import Path
from typing import Any

from harness import cancel
from harness.common import failures
from harness.common.integrity import IntegrityConfig
from harness.compiling.compile import CompileOutcome, compile_candidate
from harness.config import EvalConfig, TimingConfig
from harness.evaluation.build import take_build
from harness.evaluation.check import check
from harness.evaluation.context import Context
from harness.evaluation.load import load
from harness.evaluation.pools import EXCHANGE_DIRS, Pools
from harness.evaluation.prepare import integrity_checks, prepare
from harness.evaluation.reconcile import roofline_bound
from harness.evaluation.record import Record
from harness.evaluation.reference import reference_key, run_reference
from harness.evaluation.stop import Stop, unexpected_failure
from harness.evaluation.timing import time_candidate
from harness.judge import trials
from harness.judge.reference import ReferenceFailed
from harness.launch.sandbox import SandboxUnavailable
from harness.launch.sandbox.limits import SandboxLimits
from harness.launch.sandbox.private import remove_private
from harness.problems.problem import Problem
from harness.records.redaction import redact_value, secret_names
from harness.records.results import EvalResult, Failure

# The names other modules import from here.
__all__ = ["EXCHANGE_DIRS", "build_limits", "evaluate", "redacted", "reference_key", "unexpected_failure"]


def redacted(result: EvalResult) -> EvalResult:
    """The record with every value of the harness's secrets replaced (harness.records.redaction): its messages,
    evidence and stacks carry what candidate code printed or made the harness read."""
    if not secret_names():
        return result
    return EvalResult.model_validate(redact_value(result.model_dump()))


def build_limits(config: EvalConfig, device: str) -> SandboxLimits:
    """The compile stage's sandbox limits under `config` (without an `integrity_config` of evaluate()'s own):
    for a caller that builds ahead, so that its build is the one evaluate() would have made."""
    return SandboxLimits.for_ranks(1, IntegrityConfig.coerce(config.integrity.overrides(), device))


def evaluate(
    problem: Problem,
    candidate_path: Path,
    *,
    world_size: int,
    device: str = "cpu",
    shape: str = "small",
    config: EvalConfig | None = None,
    log_dir: Path | None = None,
    gpus: list[int] | None = None,
    integrity_config: IntegrityConfig | dict[str, Any] | None = None,
    built: CompileOutcome | None = None,
) -> EvalResult:
    """Run the whole protocol; `gpus` picks the physical GPUs (one per rank) on a multi-GPU node.
    The integrity checks are the device's defaults with `config.integrity`'s settings on top;
    `integrity_config`, where given, replaces `config.integrity`. `built`: the compile stage's outcome for
    this file, where the caller ran it already with `build_limits(config, device)` (agent.executors.local
    builds before it takes a GPU lease). A failure there is the verdict and is not built again: a second
    build that succeeded would start ranks on devices nobody leased. A success is found in the cache."""
    cancel.check()  # the process was interrupted: nothing new starts
    config = config or EvalConfig(timing=TimingConfig.for_device(device))
    checks = integrity_checks(config, integrity_config, device)
    # The secret (harness.evaluation.context): the salt, and the generator of the judge's own draws.
    salt, rng = secrets.randbits(31) | 1, random.Random(secrets.randbits(64))
    ctx = Context.open(problem, Path(candidate_path).resolve(), world_size=world_size, device=device, shape=shape,
                       config=config, checks=checks, log_dir=log_dir, gpus=gpus, salt=salt, rng=rng)
    record = Record.start(ctx)
    if not prepare(ctx, record):
        remove_private(ctx.folder)
        return redacted(record.result(ctx))
    pools, abandoned = Pools(), False
    phase, started = "compile", time.perf_counter()
    try:
        outcome = built if built is not None and not built.ok else compile_candidate(
            ctx.path, config.limits.compile_s, device, problem=problem.loader_spec,
            limits=SandboxLimits.for_ranks(1, checks))
        if not take_build(ctx, record, outcome):
            return redacted(record.result(ctx))
        phase = "launch"
        reference, pool = pools.start(ctx, record, outcome.extensions)
        schedule = trials.schedule(config.trials, checks, world_size, ctx.rng)
        phase = "reference"
        timed = run_reference(ctx, record, reference, pool, schedule)
        phase = "load"
        load(ctx, record, reference, pool)
        phase = "check"
        check(ctx, record, reference, pool, schedule)
        if timed is not None:
            phase = "timing"
            time_candidate(ctx, record, reference, pool, *timed)
    except Stop as stop:
        record.stages.setdefault(phase, time.perf_counter() - started)
        record.failure = stop.failure
        record.flags.extend(stop.flags)
    except ReferenceFailed as err:
        record.failure = Failure(verdict=failures.INFRA_ERROR, message=str(err)[:1500], phase="reference",
                                 infra_cause="reference")
    except SandboxUnavailable as err:
        record.failure = Failure(verdict=failures.INFRA_ERROR, message=str(err)[:1500], phase=phase,
                                 infra_cause="sandbox")
    except Exception as exc:  # noqa: BLE001 - every evaluation ends with a verdict
        record.failure = unexpected_failure(exc, phase)
    except BaseException:  # Ctrl-C, harness.cancel, a Ray task cancelled: no polite wait for busy ranks
        abandoned = True
        raise
    finally:
        if pools.reference is not None and pools.reference.cost:
            # What the reference's first call cost and the limits derived from it (harness.judge.reference).
            record.evidence["reference_cost"] = dict(pools.reference.cost)
        try:
            pools.end(ctx, record, polite=record.failure is None and not abandoned, abandoned=abandoned)
        except Exception as exc:  # noqa: BLE001 - a verdict already taken stays; the record says what failed
            record.evidence["cleanup_error"] = f"{type(exc).__name__}: {exc}"[:500]
        # Stopped by Ctrl-C midway: whatever the killed ranks said is no verdict on the candidate.
        cancel.check()
    if record.failure is None and record.timings is not None:
        roofline_bound(ctx, record)  # after the ranks are gone, never beside a candidate
        cancel.check()  # the bound's trace may have been the wait that Ctrl-C cut short
    return redacted(record.result(ctx))
