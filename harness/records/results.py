"""The result record of one evaluation: one JSON document, validated by pydantic.

Parent-side only (the rank worker must not import pydantic).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from harness.common.failures import Verdict

SCHEMA_VERSION = 1

Clock = Literal["cuda_events", "host"]  # what timed the calls: CUDA events on a GPU, the host clock on a CPU


class Failure(BaseModel):
    verdict: Verdict
    message: str
    rank: int | None = None
    trial: int | None = None
    call: int | None = Field(None, description="position of the failing call in the evaluation's (secret, "
                                               "shuffled) call order")
    phase: str | None = None
    evidence: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    infra_cause: str | None = Field(None, description="for infra_error only: which of "
                                                      "harness.common.failures.INFRA_CAUSES "
                                                      "it was (none of them a candidate can bring about)")


class TimingStats(BaseModel):
    """Device time per call (max over ranks per iteration), and host-inclusive latency apart."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    mean_ms: float
    cv: float = Field(description="coefficient of variation (stdev / mean) of the per-iteration times")
    iterations: int
    host_median_ms: float
    input_sets: int
    spin_us: float
    slowest_rank: int
    rank_medians_ms: list[float]
    clock: Clock
    cached: bool = False
    fresh_median_ms: float | None = Field(
        None, description="median over iterations on never-seen inputs (max over ranks); much slower than "
                          "median_ms means the candidate caches answers by input")
    fresh_iterations: int = 0
    fresh_pair_median_ms: float | None = Field(
        None, description="median of the rotated-input iterations interleaved with the fresh ones (each fresh "
                          "call is judged against the one just before it: harness.judge.plausibility)")

    span_median_ms: float | None = Field(
        None, description="the harness's own clock: median time from sending a timed iteration's request to the "
                          "last rank's reply (spin, barrier and pipe included)")
    unexplained_low_ms: float | None = Field(
        None, description="20th percentile of span - claimed call time - spin per counted iteration (timed, "
                          "fresh-pair, host-latency; the span of the call's own request, not of the one that "
                          "prepared its inputs); compared with the reference's to reconcile claimed times with "
                          "the harness's clock")
    host_span_median_ms: float | None = Field(
        None, description="the harness's own clock around each host-latency iteration")
    judged_outputs: int = Field(0, description="calls of the timing phase whose outputs were judged (drawn at random "
                                               "from the evaluation's secret; a rank learns it after the call)")
    refill_median_ms: float | None = Field(
        None, description="median time a rank took to draw a call's fresh inputs, outside the timed window "
                          "(device time on a GPU, host time on CPU; slowest rank)")
    refilled: dict[str, str] | None = Field(
        None, description="per kind of timing iteration (warmup, timed, host, fresh_pair, fresh, probe), one "
                          "character per iteration in plan order: how its inputs were made (i: refilled in place "
                          "from its recipe, d: the recipe's draw, f: a fresh draw, r: a rotated set as given, where "
                          "the plan does not refill, -: not refilled although asked: never counted)")


    @classmethod
    def from_rank_loops(cls, replies: list[dict[str, Any]], clock: Clock) -> TimingStats:
        """Stats of a timing loop that ran inside trusted ranks (harness.measure.calibrate_worker: the machine's
        calibration);
        candidates and references are timed by harness.judge.timing instead."""
        import statistics

        per_rank = [r["times_ms"] for r in replies]
        per_iter = [max(vals) for vals in zip(*per_rank)]  # an iteration ends when its slowest rank does
        host = [max(vals) for vals in zip(*(r["host_ms"] for r in replies))]
        rank_medians = [statistics.median(t) for t in per_rank]
        mean = statistics.fmean(per_iter)
        qs = statistics.quantiles(per_iter, n=10, method="inclusive") if len(per_iter) > 1 else per_iter * 9
        return cls(
            median_ms=statistics.median(per_iter), p10_ms=qs[0], p90_ms=qs[-1], mean_ms=mean,
            cv=(statistics.stdev(per_iter) / mean) if len(per_iter) > 1 and mean > 0 else 0.0,
            iterations=len(per_iter), host_median_ms=statistics.median(host) if host else float("nan"),
            input_sets=int(replies[0]["input_sets"]), spin_us=float(replies[0]["spin_us"]),
            slowest_rank=max(range(len(rank_medians)), key=rank_medians.__getitem__),
            rank_medians_ms=rank_medians, clock=clock,
        )


class Timings(BaseModel):
    reference: TimingStats
    candidate: TimingStats


class CandidateInfo(BaseModel):
    path: str
    sha256: str


class EvalResult(BaseModel):
    schema_version: int = SCHEMA_VERSION
    problem: str
    category: str
    origin: str = "pkb-agent"
    shape: str
    world_size: int
    device: Literal["cpu", "cuda"]
    candidate: CandidateInfo
    verdict: Verdict
    correct: bool
    failure: Failure | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    timings: Timings | None = None
    speedup: float | None = None
    roofline: dict[str, Any] | None = None
    flags: list[str] = Field(default_factory=list)
    fast_eligible: bool = Field(
        True, description="False when a flag (harness.common.integrity.SPEEDUP_DISQUALIFIERS: uses_torch_collectives, "
                          "impossible, input_caching, ...) means the speedup must not count toward fast_p")
    emulated: bool = Field(False, description="ranks shared GPUs with symmetric memory emulated: the timings "
                                              "are not speedups and never count as fast")
    integrity: dict[str, Any] = Field(
        default_factory=dict, description="evidence behind the integrity flags: the secret input salt, "
                                          "static findings, collectives inside candidate calls, notes")
    seed: int
    trials: int
    stages: dict[str, float] = Field(default_factory=dict, description="seconds per stage")
    environment: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def counted_speedup(self) -> float | None:
        """The speedup that fast_p may count: None unless correct, timed and free of disqualifying flags."""
        return self.speedup if self.correct and self.fast_eligible else None

    def summary_line(self) -> str:
        if self.correct and self.speedup is not None:
            return f"{self.verdict}: speedup {self.speedup:.2f}x"
        if self.correct:
            return self.verdict
        assert self.failure is not None
        return f"{self.verdict}: {self.failure.message}"


