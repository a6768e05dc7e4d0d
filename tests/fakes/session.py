"""A scripted long agent session for the fake API servers: the "model" (a Brain) and a fake executor.

The brain writes a candidate at every turn, each a real expert kernel of this suite with a short variant
note, so candidates have the size real ones have; it recalls an old candidate once, and submits the best
at the last turn. Verdicts and speedups are written into each candidate as a marker line that the fake
executor reads, so no rank starts and the loop runs in seconds; one early candidate is the fastest, so the
context manager must keep an old candidate in full.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.records.results import CandidateInfo, EvalResult, Failure
from tests.fakes.base import Turn

REPO = Path(__file__).resolve().parents[2]
EXPERT = REPO / "problems" / "collective" / "solutions" / "all_reduce__two_shot_push.py"
MARKER = re.compile(r"^# fake-verdict: (\w+) ([0-9.]+)$", re.M)
BEST_TURN = 4  # this turn's candidate is the fastest of the session
RECALL_TURN = 20
RECALLED = 2


def plan(turn: int) -> tuple[str, float]:
    if turn % 3 == 0:
        return "output_mismatch", 0.0
    return "correct", 3.0 if turn == BEST_TURN else round(1.0 + turn / 100, 3)


def candidate(turn: int) -> str:
    verdict, speedup = plan(turn)
    return (EXPERT.read_text() + f"\n# variant {turn}: another block size for the push phase\n"
            f"# fake-verdict: {verdict} {speedup}\n")


def session_brain(turns: int = 30, thinking: bool = True) -> Callable[[int, dict[str, Any]], Turn]:
    """Turns 0..turns-2 call check (bench every fifth), one of them recall; the last submits the best."""

    def brain(turn: int, body: dict[str, Any]) -> Turn:
        note = f"Turn {turn}: trying the next variant." if thinking else ""
        if turn >= turns - 1:
            return Turn(thinking=note, tool=("submit", {"source": candidate(BEST_TURN)}), reasoning_tokens=40)
        if turn == RECALL_TURN:
            return Turn(thinking=note, tool=("recall", {"candidate": RECALLED}), reasoning_tokens=40)
        tool = "bench" if turn % 5 == 4 else "check"
        return Turn(thinking=note, tool=(tool, {"source": candidate(turn)}), reasoning_tokens=40)

    return brain


class FakeExecutor:
    """An executor whose verdicts come from the candidate's marker line (see the module docstring)."""

    name = "fake"

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def evaluate(self, request: Any) -> EvalResult:
        self.requests.append(request)
        match = MARKER.search(request.candidate_source)
        verdict, speedup = (match.group(1), float(match.group(2))) if match else ("compile_error", 0.0)
        correct = verdict == "correct"
        timed = correct and not request.config.get("skip_timing")
        return EvalResult(
            problem="all_reduce", category="collective", shape=request.shape, world_size=request.world_size,
            device="cpu", candidate=CandidateInfo(path=request.candidate_name, sha256="0"), verdict=verdict,
            correct=correct, speedup=speedup if timed else None,
            failure=None if correct else Failure(verdict=verdict, message="rank 1, trial 0: out differs"),
            seed=int(request.config.get("seed") or 0), trials=2)

    def run_on_devices(self, world_size: int, device: str, fn: Callable[..., Any], /, *args: Any,
                       **kwargs: Any) -> Any:
        raise AssertionError("the session runs no device work beyond evaluations")

    def capacity(self, world_size: int, device: str) -> int:
        return 1

    def close(self) -> None:
        pass
