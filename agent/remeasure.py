"""Re-measuring a kernel: k fresh evaluations, each with its own seed, timed with the reference beside it,
then checked on the problem's held-out shapes; the k speedups with their median and an interval.

One function (`remeasure`) for every figure a report puts forward as a kernel's speed after the fact: the
search's final re-measurement of its top candidates (agent.search.loop), `pkb rescore` of a search run
(agent.search.rescore) and of a sample run (agent.rescore). A speedup from one bench is one draw of a noisy
measurement, and the best of many draws is a lucky one (the winner's curse: a search reported 5.01x for a
kernel that measured 8.79x and 1.23x on two later runs); so a figure is reported as the median of k draws
with its interval, and the draws are fresh: a seed no earlier evaluation used, a new evaluation (the
reference timed again, never the cached figure), never the bench whose figure picked the kernel.

Each round (`Round`) is one fresh evaluation at the visible shape on its seed, timed; when that is correct,
one correctness check on each held-out shape (harness.problems.problem, `held-out:<shape>`), each on a seed
of its own (agent.final_scoring.held_out_seed). A round is trusted when the kernel is correct on every shape,
timed, and free of the flags that void a speedup (harness.common.flags.SPEEDUP_DISQUALIFIERS).

What a speedup is, every round says (`timing`): `gpu`, measured on GPUs; `cpu`, measured on a CPU with gloo,
which proves the plumbing only; `emulated`, ranks sharing GPUs with symmetric memory emulated, and
`untimed`, no timing ran: those two have no speedup at all (None, shown as "not measured", never 0).

The interval is a confidence interval of the median (distribution-free, from order statistics: the chance
that the median lies between the j-th smallest and the j-th largest of k draws is a binomial sum, scipy's
binom): the narrowest such pair that reaches CONFIDENCE, or, with too few draws for that, the smallest and
largest with the confidence they do reach (k=3: 75%). Two re-measurements of one kernel agree when their
intervals overlap (`agree`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scipy.stats import binom

from agent import final_scoring
from agent.final_scoring import EvaluateFn
from harness.common.flags import SPEEDUP_DISQUALIFIERS, is_emulated
from harness.config import EvalConfig
from harness.problems.problem import Problem
from harness.records.results import EvalResult

GPU = "gpu"
CPU = "cpu"
EMULATED = "emulated"
UNTIMED = "untimed"
MEASURED = (GPU, CPU)  # timings that are speedups (a CPU's only of the plumbing)
NOT_MEASURED = "not measured"
CONFIDENCE = 0.90
# Fields of a round that depend on the clock (left out where records are compared: agent.search.archive).
CLOCK_FIELDS = ("gpu_s", "seconds")
WHAT = {GPU: "timed on GPUs", CPU: "timed on CPU: proves the plumbing only, not a GPU speedup",
        EMULATED: "emulated ranks: checked, no speedup", UNTIMED: "not timed: checked, no speedup"}


@dataclass(frozen=True)
class Round:
    """One fresh evaluation: the visible shape on `seed`, timed; then each held-out shape, checked."""

    seed: int
    shape: str
    verdict: str | None
    correct: bool  # at the visible shape and on every held-out shape that ran
    correct_visible: bool
    held_out: list[dict[str, Any]]  # agent.final_scoring.shape_summary of each held-out shape
    timing: str  # GPU, CPU, EMULATED or UNTIMED (module docstring)
    speedup: float | None  # None where nothing was measured
    candidate_ms: float | None
    reference_ms: float | None
    flags: list[str]
    fast_eligible: bool
    trusted: bool
    attempts: int = 1
    gpu_s: float = 0.0  # device seconds of every evaluation of the round
    seconds: float = 0.0

    @property
    def held_out_correct(self) -> bool | None:
        return None if not self.held_out else all(h.get("correct") for h in self.held_out)

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> Round:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Interval:
    """The median of n speedups and a confidence interval of it (module docstring)."""

    median: float
    low: float
    high: float
    confidence: float  # the chance the interval holds the true median (0 for one draw)
    n: int

    def text(self) -> str:
        if self.n == 1:
            return f"{self.median:.3g}x (one draw, no interval)"
        return (f"{self.median:.3g}x [{self.low:.3g}-{self.high:.3g}x, {self.confidence:.0%} CI of the median, "
                f"k={self.n}]")


def coverage(n: int, j: int) -> float:
    """The chance that the median of a continuous distribution lies between the j-th smallest and the j-th
    largest of n independent draws of it."""
    return float(1.0 - 2.0 * binom.cdf(j - 1, n, 0.5))


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    """The median of `values` and the narrowest order-statistic interval of it that reaches `confidence`, else
    the widest there is (min-max), with the confidence it reaches."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        return None
    j = 1
    for candidate in range(1, (n + 1) // 2 + 1):
        if coverage(n, candidate) >= confidence:
            j = candidate
    return Interval(statistics.median(xs), xs[j - 1], xs[n - j], max(0.0, coverage(n, j)), n)


def agree(a: Interval | None, b: Interval | None) -> bool | None:
    """Whether two re-measurements of one kernel agree: their intervals overlap. None when one has no figure."""
    if a is None or b is None:
        return None
    return a.low <= b.high and b.low <= a.high


@dataclass
class Remeasurement:
    """A kernel's rounds; `k` rounds were asked for (fewer ran when one was not trusted)."""

    k: int
    rounds: list[Round] = field(default_factory=list)

    @property
    def confirmed(self) -> bool:
        """Trusted on every one of the k rounds."""
        return len(self.rounds) >= self.k and all(r.trusted for r in self.rounds)

    @property
    def timing(self) -> str:
        kinds = {r.timing for r in self.rounds if r.correct_visible}
        for kind in (EMULATED, UNTIMED, CPU, GPU):  # the weakest kind any correct round had
            if kind in kinds:
                return kind
        return UNTIMED

    @property
    def speedups(self) -> list[float]:
        return [r.speedup for r in self.rounds if r.speedup is not None and r.timing in MEASURED]

    @property
    def interval(self) -> Interval | None:
        return median_interval(self.speedups) if self.timing in MEASURED else None

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.rounds]

    def text(self) -> str:
        """'1.41x [1.30-1.55x, 75% CI of the median, k=3]', or why there is no figure."""
        if not self.rounds:
            return "not re-measured"
        wrong = [r for r in self.rounds if not r.correct]
        if wrong:
            return f"not confirmed (seed {wrong[0].seed}: {wrong[0].verdict})"
        interval = self.interval
        if interval is None:  # correct on every round, but emulated or untimed: no speedup to give
            return f"{NOT_MEASURED} ({WHAT[self.timing]})"
        flagged = [r for r in self.rounds if not r.trusted]
        if flagged:
            flags = ",".join(sorted(set(flagged[0].flags) & SPEEDUP_DISQUALIFIERS)) or "untrusted"
            return f"not confirmed (seed {flagged[0].seed}: flagged {flags})"
        return interval.text() + (" (CPU: plumbing only)" if self.timing == CPU else "")

    def record(self) -> dict[str, Any]:
        interval = self.interval
        return {"k": self.k, "seeds": self.seeds, "confirmed": self.confirmed, "timing": self.timing,
                "what": WHAT[self.timing],
                "speedup": None if interval is None else {"median": interval.median, "low": interval.low,
                                                          "high": interval.high, "confidence": interval.confidence,
                                                          "n": interval.n},
                "text": self.text(), "rounds": [r.record() for r in self.rounds]}


def timing_of(result: EvalResult, device: str) -> str:
    if is_emulated(result):
        return EMULATED
    if result.timings is None or result.speedup is None:
        return UNTIMED
    return CPU if device == "cpu" else GPU


def measure_round(problem: Problem, path: Path, *, evaluate: EvaluateFn, config: EvalConfig, seed: int,
                  world_size: int, device: str, shape: str,
                  held_out_seed: Callable[[int, int], int] = final_scoring.held_out_seed,
                  log: Any = None) -> tuple[Round, EvalResult]:
    """One round (module docstring): agent.final_scoring.score_final on `seed`, the reference timed afresh; and the
    visible shape's EvalResult."""
    fresh = config.model_copy(update={"seed": seed, "use_reference_cache": False})  # a new bench, not a cached one
    scored = final_scoring.score_final(problem, path, evaluate=evaluate, config=fresh, world_size=world_size,
                                       device=device, shape=shape, held_out_seed=lambda i: held_out_seed(seed, i),
                                       log=log, event="remeasure_infra_error", candidate=str(path))
    result = scored.result
    held = scored.shapes
    overall = scored.overall()
    timing = timing_of(result, device)
    speedup = result.speedup if result.correct and timing in MEASURED else None
    flagged = bool(set(result.flags) & SPEEDUP_DISQUALIFIERS)
    timings = result.timings
    trusted = bool(overall["correct"]) and speedup is not None and result.fast_eligible and not flagged
    return Round(seed=seed, shape=shape, verdict=overall["verdict"], correct=bool(overall["correct"]),
                 correct_visible=bool(result.correct), held_out=held, timing=timing, speedup=speedup,
                 candidate_ms=timings.candidate.median_ms if timings else None,
                 reference_ms=timings.reference.median_ms if timings else None, flags=sorted(result.flags),
                 fast_eligible=bool(result.fast_eligible) and timing != EMULATED, trusted=trusted,
                 attempts=scored.visible.attempts, gpu_s=round(scored.gpu_s, 6),
                 seconds=round(scored.seconds, 6)), result


def remeasure(problem: Problem, path: Path, *, evaluate: EvaluateFn, config: EvalConfig, seeds: Sequence[int],
              world_size: int, device: str, shape: str,
              held_out_seed: Callable[[int, int], int] = final_scoring.held_out_seed,
              done: Mapping[int, Round] | None = None,
              on_round: Callable[[Round, EvalResult], None] | None = None, log: Any = None) -> Remeasurement:
    """`path` re-measured: one round per seed in `seeds` (k = len(seeds)); rounds in `done` (by seed) are kept,
    not run again (a re-measurement killed half way goes on); `on_round` gets each new round as it ends, with
    its visible EvalResult, to store it. After a round that is not trusted the rest are skipped: the kernel
    cannot be confirmed any more."""
    out = Remeasurement(k=len(seeds))
    for seed in seeds:
        found = (done or {}).get(seed)
        if found is None:
            found, result = measure_round(problem, path, evaluate=evaluate, config=config, seed=seed,
                                          world_size=world_size, device=device, shape=shape,
                                          held_out_seed=held_out_seed, log=log)
            if on_round is not None:
                on_round(found, result)
        out.rounds.append(found)
        if not found.trusted:
            break
    return out
