"""SampleSpec: which sample of a run, one (problem, condition, k), and for a replay the file it scores."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.conditions import Condition
from harness.problems.problem import Problem


@dataclass(frozen=True)
class SampleSpec:
    problem: Problem
    condition: Condition
    k: int
    file: Path | None = None  # replay: the solution file (None: the directory has none for this problem)

    @property
    def thread_id(self) -> str:
        return f"{self.problem.name}/{self.condition.name}/{self.k}"
