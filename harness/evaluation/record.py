"""What the record of one evaluation will say, filled in as the phases go (kept apart from their inputs, the
context), and the EvalResult made of it at the end."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from harness.common import failures
from harness.common.flags import EMULATED, fast_eligible
from harness.evaluation.context import Context
from harness.records.environment import environment
from harness.records.results import CandidateInfo, EvalResult, Failure, Timings


@dataclasses.dataclass
class Record:
    """Stages' seconds, flags, evidence and, once known, the failure, the timings and the worst errors."""

    stages: dict[str, float]
    flags: list[str]
    evidence: dict[str, Any]
    failure: Failure | None = None
    timings: Timings | None = None
    max_abs: float | None = None
    max_rel: float | None = None

    @classmethod
    def start(cls, ctx: Context) -> Record:
        """An empty record; its evidence starts with the secret and the integrity checks in force."""
        return cls(stages={}, flags=[], evidence={"salt": ctx.salt, "checks": ctx.checks.to_dict()})

    def result(self, ctx: Context) -> EvalResult:
        """The record as an EvalResult (not yet redacted: harness.evaluate does that)."""
        failure = self.failure
        if failure is not None:  # tracebacks name the ranks' copy of the file: the record names the user's
            copy, own = str(ctx.code_path), str(ctx.path)
            failure = failure.model_copy(update={"message": failure.message.replace(copy, own),
                                                 "evidence": failure.evidence.replace(copy, own)})
        verdict = failure.verdict if failure else failures.CORRECT
        speedup = None
        if self.timings is not None and self.timings.candidate.median_ms > 0:
            speedup = self.timings.reference.median_ms / self.timings.candidate.median_ms
        all_flags = sorted(set(self.flags) | ({EMULATED} if ctx.emulated else set()))
        return EvalResult(
            problem=ctx.problem.name, category=ctx.problem.category, origin=ctx.problem.origin, shape=ctx.shape,
            world_size=ctx.world_size, device=ctx.device,
            candidate=CandidateInfo(path=str(ctx.path), sha256=hashlib.sha256(ctx.source).hexdigest()),
            verdict=verdict,
            correct=verdict == failures.CORRECT, failure=failure, max_abs_err=self.max_abs,
            max_rel_err=self.max_rel, timings=self.timings, speedup=speedup, flags=all_flags,
            seed=ctx.config.seed, trials=ctx.config.trials, fast_eligible=fast_eligible(all_flags),
            emulated=ctx.emulated, integrity=self.evidence, stages={k: round(v, 4) for k, v in self.stages.items()},
            environment=environment(), config=ctx.config.model_dump(),
        )
