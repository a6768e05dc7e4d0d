"""How a phase ends the evaluation with a failure: the exception that carries it, a rank's report of its own
failure read as a claim, the candidate's scratch files read as hostile, and the verdict of an exception nobody
anticipated."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from typing import Any

from harness.common import failures, hostile_files, integrity
from harness.launch.pool import PoolError
from harness.records.results import Failure

# Phases in which candidate code has run or its artifacts are handled: whatever goes wrong there is the
# candidate's. Before them (launch, reference) nothing of the candidate is involved.
CANDIDATE_PHASES = ("compile", "load", "check", "timing")


class Stop(Exception):
    """Ends the protocol early with a failure."""

    def __init__(self, failure: Failure, flags: list[str] | None = None) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.flags = flags or []


def failure_from(reply: dict[str, Any], phase: str) -> tuple[Failure, list[str]]:
    """A failure a rank reported about itself. It can only hurt the candidate, so it is taken at its word
    for the class, except a class that is not a failure (a tampered rank claiming success)."""
    verdict = reply.get("verdict", failures.RUNTIME_ERROR)
    # A candidate's rank cannot declare itself correct, nor claim infra_error (retried, never charged):
    # whatever it says beyond "I failed" is the candidate's runtime error.
    if verdict not in failures.VERDICTS or verdict in (failures.CORRECT, failures.INFRA_ERROR):
        verdict = failures.RUNTIME_ERROR
    if reply.get("build") and verdict == failures.RUNTIME_ERROR:
        verdict = failures.COMPILE_ERROR  # a build inside the first call failed: the compiler's error
    return Failure(
        verdict=verdict,
        message=str(reply.get("message", "no message"))[:1500],
        rank=reply.get("rank") if isinstance(reply.get("rank"), int) else None,
        trial=reply.get("trial") if isinstance(reply.get("trial"), int) else None,
        phase=phase,
        evidence=str(reply.get("evidence", ""))[:4000],
    ), [f for f in reply.get("flags", []) if isinstance(f, str)]


def first_failure(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """The root failure: a rank whose process died (its peers then fail on the broken connection), else
    the lowest rank."""
    return min(replies, key=lambda r: (not r.get("died"), r.get("rank", 0)))


def flags_of(replies: Any) -> list[str]:
    """The flags the ranks' replies name."""
    return sorted({f for r in replies for f in r.get("flags", []) if isinstance(f, str)})


@contextlib.contextmanager
def candidate_files(phase: str) -> Iterator[None]:
    """Files the trusted side reads or writes in the candidate's scratch: anything wrong with them
    (a link, a FIFO, a name planted where the harness writes) is the candidate's failure."""
    try:
        yield
    except hostile_files.HostileFile as err:
        raise Stop(Failure(verdict=failures.RUNTIME_ERROR, phase=phase,
                           message=f"{phase}: the harness refused a file in the candidate's scratch: {err}"),
                   [integrity.TAMPERING]) from err


def inputs_changed(rank: int, what: str) -> Stop:
    """The failure of a candidate that changed its inputs in the timing phase (the caller raises it)."""
    return Stop(Failure(verdict=failures.OUTPUT_MISMATCH, phase="timing", rank=rank,
                        message=f"rank {rank}: {what}: the candidate modifies its inputs"),
                [integrity.MUTATES_INPUTS])


def unexpected_failure(exc: BaseException, phase: str) -> Failure:
    """The verdict for an exception nobody anticipated. In a candidate's phase it is the candidate's failure
    with the reason (fail closed: an infra_error would be retried, re-rolling the candidate's verdict); a
    pool that stopped there stopped with the candidate's ranks. Before those phases, the harness's own."""
    reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:600]
    trace = "".join(traceback.format_exception(exc))[-3000:]
    if phase in CANDIDATE_PHASES:
        verdict = failures.COMPILE_ERROR if phase == "compile" else failures.RUNTIME_ERROR
        what = "its rank pool stopped" if isinstance(exc, PoolError) else "the harness could not handle its artifacts"
        return Failure(verdict=verdict, phase=phase, message=f"{phase}: {what}: {reason}", evidence=trace)
    return Failure(verdict=failures.INFRA_ERROR, phase=phase, infra_cause="harness",
                   message=f"{phase}: the harness failed before any candidate code ran: {reason}", evidence=trace)
