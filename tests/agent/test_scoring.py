"""agent.scoring: one candidate through an executor, an infra_error tried again (bounded), and the device
seconds of every attempt counted one way (agent.executors.request.device_seconds)."""

from __future__ import annotations

import pytest

from agent import scoring
from agent.executors.request import device_seconds
from harness.common import failures
from harness.records.results import CandidateInfo, EvalResult, Failure


def result(verdict: str, held_s: float) -> EvalResult:
    failure = None if verdict == failures.CORRECT else Failure(verdict=verdict, message="pool did not start")
    return EvalResult(problem="all_reduce", category="collective", shape="small", world_size=2, device="cuda",
                      candidate=CandidateInfo(path="c.py", sha256="0" * 64), verdict=verdict,
                      correct=verdict == failures.CORRECT, failure=failure, seed=0, trials=2,
                      environment={"executor": {"name": "local", "held_s": held_s}})


class Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, object]]] = []

    def warning(self, event: str, **fields: object) -> None:
        self.warnings.append((event, fields))


@pytest.mark.parametrize("failing", [0, 1, scoring.INFRA_ATTEMPTS + 2])
def test_infra_errors_are_retried_and_every_attempt_is_charged(failing: int):
    answers = [result(failures.INFRA_ERROR, 1.0)] * failing + [result(failures.CORRECT, 2.0)]
    given = iter(answers)
    log = Log()
    scored = scoring.score(lambda: next(given), log=log, event="retry", candidate="c.py")
    attempts = min(failing + 1, scoring.INFRA_ATTEMPTS)
    assert scored.attempts == attempts
    assert scored.result.verdict == (failures.CORRECT if failing < scoring.INFRA_ATTEMPTS else failures.INFRA_ERROR)
    assert scored.gpu_s == pytest.approx(sum(device_seconds(r) for r in answers[:attempts]))
    assert [e for e, _ in log.warnings] == ["retry"] * min(failing, scoring.INFRA_ATTEMPTS)
    assert all(f["candidate"] == "c.py" and f["message"] == "pool did not start" for _, f in log.warnings)


def test_a_model_failure_is_never_retried():
    calls = []

    def attempt() -> EvalResult:
        calls.append(1)
        return result(failures.RUNTIME_ERROR, 1.0)

    scored = scoring.score(attempt)
    assert len(calls) == 1 and scored.attempts == 1 and scored.result.verdict == failures.RUNTIME_ERROR


@pytest.mark.parametrize("cause", sorted(failures.LASTING_INFRA_CAUSES))
def test_an_infra_error_whose_cause_lasts_is_not_tried_again(cause: str):
    """The emulation refusing multicast, a missing package: the same request meets it again (2026-12-02, one
    H200: a multicast refusal tried three times held the only GPU about a minute each)."""
    calls = []

    def attempt() -> EvalResult:
        calls.append(1)
        lasting = result(failures.INFRA_ERROR, 1.0)
        assert lasting.failure is not None
        lasting.failure.infra_cause = cause
        return lasting

    log = Log()
    scored = scoring.score(attempt, log=log)
    assert len(calls) == 1 and scored.attempts == 1 and scored.result.failure is not None
    assert scored.result.failure.infra_cause == cause and len(log.warnings) == 1


def test_every_lasting_cause_is_a_known_cause():
    assert failures.LASTING_INFRA_CAUSES <= set(failures.INFRA_CAUSES)
