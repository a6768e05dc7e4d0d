"""One request to every rank of the candidate's pool, and what the replies say beyond their data: a rank's
failure, a hang (deadlock or timeout, with every rank's stack), a tripwire, a refusal of the emulation, the
collectives the ranks ran."""

from __future__ import annotations

from typing import Any

from harness.common import failures, integrity
from harness.emulation.errors import parse_refusal, refusal_is_plausible
from harness.evaluation.context import Context
from harness.evaluation.record import Record
from harness.evaluation.stop import Stop, failure_from, first_failure, flags_of
from harness.judge import watchdog
from harness.launch.pool import Hang, RankMisbehaved, RankPool
from harness.records.results import Failure


def ask(ctx: Context, record: Record, pool: RankPool, message: Any, phase: str, timeout: float,
        build_allowance: float = 0.0) -> list[dict[str, Any]]:
    """One request to every rank of the candidate's pool; a failing rank's report, a hang or a broken
    sandbox limit becomes the verdict (raised as Stop)."""
    try:
        replies = pool.request(message, timeout=timeout, grace=ctx.config.limits.grace_s,
                               build_allowance=build_allowance)
    except Hang as hang:
        failed = [r for r in hang.replies.values() if not r.get("ok")]
        if failed:  # a rank failed and its peers were left waiting in a collective: its failure counts
            failure, extra = failure_from(first_failure(failed), phase)
            raise Stop(emulation_refusal(ctx, failure), flags_of(hang.replies.values()) + extra) from hang
        building = pool.building(hang.missing)
        if building:
            raise Stop(Failure(
                verdict=failures.COMPILE_ERROR, phase="compile",
                message=f"a native build inside the first call on rank(s) {', '.join(map(str, building))} did "
                        f"not finish within {build_allowance:.0f} s (Limits.build_s)",
                evidence=watchdog.evidence(hang.stacks))) from hang
        verdict, why = watchdog.classify(hang.missing, hang.stacks)
        if hang.stacks:
            record.evidence["stacks"] = {str(k): v for k, v in sorted(hang.stacks.items())}
        raise Stop(Failure(
            verdict=verdict, phase=phase,
            message=f"{phase}: rank(s) {', '.join(map(str, hang.missing))} did not finish within "
                    f"{hang.timeout:.0f} s; {why}; the rank group was killed",
            evidence=watchdog.evidence(hang.stacks),
        ), flags_of(hang.replies.values())) from hang
    except RankMisbehaved as err:
        raise Stop(Failure(verdict=failures.RUNTIME_ERROR, phase=phase, rank=err.rank,
                           message=str(err), evidence=err.evidence)) from err
    for reply in replies:  # what a rank's tripwires named (a mode left active), beside its flag
        if isinstance(reply.get("tripwire"), list):
            record.evidence.setdefault("tripwire", {})[str(reply.get("rank"))] = [str(m)[:200] for m in
                                                                                reply["tripwire"][:8]]
    failed = [r for r in replies if not r.get("ok")]
    if failed:
        failure, extra = failure_from(first_failure(failed), phase)
        raise Stop(emulation_refusal(ctx, failure), flags=flags_of(replies) + extra)
    return replies


def emulation_refusal(ctx: Context, failure: Failure) -> Failure:
    """With ranks sharing GPUs, a failure that is the emulation refusing an API it cannot serve
    (multicast, NCCL, torch's symm_mem ops) is nobody's fault: infra_error, not charged. The message is
    the rank's claim, so it counts only where the candidate's source names such an API."""
    if not ctx.emulated or failure.verdict != failures.RUNTIME_ERROR:
        return failure
    refusal = parse_refusal(f"{failure.message}\n{failure.evidence}")
    if refusal is None or not refusal_is_plausible(refusal, ctx.text):
        return failure
    return failure.model_copy(update={"verdict": failures.INFRA_ERROR, "infra_cause": "emulation",
                                      "message": f"not available in emulation: {failure.message}"})


def note_collectives(record: Record, phase: str, events: dict[int, dict[str, int]],
                     replies: list[dict[str, Any]] | None = None, loopback: int | None = None) -> None:
    """Collectives inside candidate calls: events the ranks' monitors sent as they happened, the
    counts in their replies, and bytes on the sandbox's loopback (read from outside)."""
    seen: dict[str, Any] = {}
    for rank, counts in events.items():
        seen.setdefault(str(rank), {})["events"] = counts
    for reply in replies or []:
        if reply.get("collectives"):
            seen.setdefault(str(reply["rank"]), {}).update(reply["collectives"])
    if loopback:
        # Read from outside the sandbox: what its ranks sent each other over sockets (gloo, NCCL's
        # bootstrap) during candidate calls, which no in-process counter can wind back.
        traffic = record.evidence.setdefault("loopback_bytes", {})
        traffic[phase] = traffic.get(phase, 0) + loopback
        record.flags.append(integrity.USES_TORCH_COLLECTIVES)
    if seen:
        record.evidence.setdefault("collectives", {}).setdefault(phase, {}).update(seen)
        record.flags.append(integrity.USES_TORCH_COLLECTIVES)
