"""What a search asks for, in one typed place: stored as search.json's "config" and authoritative on --resume.

Strategies are configuration (`StrategyConfig.name`): `independent` (fresh samples, today's `pkb run`
behaviour: the control), `best_first` (refine the best kernel so far, sometimes another of the top k),
`islands` (a population in islands, each refining its own members, with the best of each migrating to
the next every few candidates). Parent selection weighs speedup, how often a kernel was already a
parent, and how different its code is from the best (agent.search.strategies).

Budgets (`Limits`) apply to the whole search and, separately, to each problem. A limit of None is no
limit. `window` is how many candidates are in flight at once (model call, build, evaluation): the loop's
decisions for candidate n see exactly the candidates before n - window + 1, whatever order they finished
in, which is what makes a search reproducible and resumable to the same archive (agent.search.loop).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from agent.conditions import REPLAY, Condition, parse_condition
from harness.config import EvalConfig, TimingConfig
from harness.config import Limits as PhaseLimits
from harness.emulation import layout

SEARCH_SCHEMA = "pkb-search/1"
STRATEGIES = ("independent", "best_first", "islands")


def derived_seed(seed: int, slot: int, what: str) -> int:
    """A seed for one draw of one slot, independent of every other (and of Python's hash randomisation)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{slot}:{what}".encode()).digest()[:8], "big")


class Limits(BaseModel):
    """A budget; every field None (no limit) by default."""

    model_config = ConfigDict(extra="forbid")

    candidates: int | None = Field(None, ge=1, description="candidates decided (model calls made or to make)")
    gpu_hours: float | None = Field(None, gt=0, description="device time held by evaluations and by an agent "
                                                            "proposer's tools, times the GPUs held")
    cost_usd: float | None = Field(None, gt=0, description="model dollars (needs the model's price)")
    tokens: int | None = Field(None, ge=1, description="model input plus output tokens")
    wall_hours: float | None = Field(None, gt=0, description="search: hours running (not counting time killed); "
                                                             "problem: hours its candidates spent in model "
                                                             "calls and evaluations")

    def given(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.model_dump().items() if v is not None}


class StrategyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # best_first by default: at equal budget it did best in docs/search.md's measurements (islands close behind)
    name: Literal["independent", "best_first", "islands"] = "best_first"
    top_k: int = Field(4, ge=1, description="best_first: the pool a non-greedy pick draws from")
    explore: float = Field(0.25, ge=0, le=1, description="best_first: chance of a weighted pick from the top k "
                                                          "instead of the best")
    islands: int = Field(3, ge=1)
    migration_interval: int = Field(6, ge=1, description="islands: candidates of a problem between migrations")
    inspirations: int = Field(1, ge=0, le=3, description="islands: other kernels of the island shown with the parent")
    speedup_weight: float = Field(2.0, ge=0, description="exponent on speedup / best speedup")
    reuse_penalty: float = Field(0.5, ge=0, description="exponent on 1 / (1 + times already a parent)")
    novelty_weight: float = Field(1.0, ge=0, description="weight of code distance from the best kernel")


class StopConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target_fraction: float | None = Field(None, gt=0, description="stop a problem at this roofline fraction")
    target_speedup: float | None = Field(None, gt=0, description="stop a problem at this speedup")
    patience: int | None = Field(None, ge=1, description="stop a problem after this many candidates without "
                                                         "improving its best")
    min_gain: float = Field(0.02, ge=0, description="relative gain of the best that counts as an improvement")


class SearchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    problems: list[str]
    source: str | None = None  # None: this suite; "pkb:PATH": a PKB checkout
    device: str = "cpu"
    world_size: int = 2
    ranks_per_gpu: int = Field(1, ge=1, description="above 1, ranks share GPUs with symmetric memory emulated "
                                                    "(docs/emulation.md): kernels checked for real, timings not "
                                                    "speedups")
    shape: str = "small"
    # How a candidate is proposed, named like a condition (agent.conditions): zero-shot (one model call), or
    # agent:<tools>, an episode of the agent loop with those tools and at most proposer_turns model calls, whose
    # tools' device time is the search's too (agent.search.episode).
    proposer: str = "zero-shot"
    proposer_turns: int = Field(4, ge=1, description="model calls of an agent proposer's episode")
    seed: int = 0
    trials: int = Field(5, ge=2)
    skip_timing: bool = False
    phase_timeout_s: float | None = Field(None, gt=0, description="caps the harness's load, check and timing "
                                                                  "limits (a hang costs this much)")
    timing_iters: int | None = Field(None, ge=2, description="timed iterations per side (None: the device's "
                                                              "default; more steady a median on a noisy machine)")
    fresh_reference: bool = Field(False, description="time the reference beside every candidate instead of once "
                                                     "per seed (a machine whose speed drifts: shared, throttled)")
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    budget: Limits = Field(default_factory=Limits)
    per_problem: Limits = Field(default_factory=Limits)
    stop: StopConfig = Field(default_factory=StopConfig)
    window: int = Field(3, ge=1, description="candidates in flight at once")
    warmup: int = Field(2, ge=0, description="candidates every problem gets before the budget follows the gap")
    # The re-measurement at the end (agent.remeasure): the `remeasure_top` best distinct trusted kernels of each
    # problem by the search's own figure, each evaluated afresh `remeasure` times; the reported one is the best
    # by its re-measured median. Their names until 2026-12-06 (rescore_seeds, rescore_candidates) still read.
    remeasure: int = Field(3, ge=1, validation_alias=AliasChoices("remeasure", "rescore_seeds"),
                           description="fresh evaluations (seeds) of each re-measured kernel, on the visible and "
                                       "the held-out shapes")
    remeasure_top: int = Field(3, ge=1, validation_alias=AliasChoices("remeasure_top", "rescore_candidates"),
                               description="best distinct trusted kernels re-measured per problem")
    failures_in_prompt: int = Field(3, ge=0, description="recent failures of the problem shown with the parent")
    keep_logs: bool = False
    base_url: str | None = None
    api_key_env: str | None = None
    prices: str | None = None
    temperature: float | None = None
    max_reply_tokens: int | None = None
    model_attempts: int = Field(5, ge=1)
    guide_in_prompt: bool = True

    @field_validator("proposer")
    @classmethod
    def _proposer(cls, value: str) -> str:
        condition = parse_condition(value)  # ConditionError is a ValueError: pydantic reports it
        if condition.kind == REPLAY:
            raise ValueError("a proposer writes code: zero-shot or agent:<tools>, not replay")
        return condition.name

    @property
    def proposer_condition(self) -> Condition:
        return parse_condition(self.proposer)

    @property
    def gpus_per_evaluation(self) -> int:
        """The devices one evaluation holds (ranks sharing a GPU count it once; on CPU one per rank)."""
        return layout.gpus_needed(self.world_size, self.ranks_per_gpu)

    @model_validator(mode="after")
    def _needs_a_bound(self) -> SearchConfig:
        if not self.problems:
            raise ValueError("a search needs at least one problem")
        if self.budget.candidates is None and self.budget.gpu_hours is None and self.budget.cost_usd is None \
                and self.budget.tokens is None and self.budget.wall_hours is None \
                and self.per_problem.candidates is None and self.stop.patience is None:
            raise ValueError("a search needs a budget (candidates, GPU-hours, dollars, tokens or hours), a "
                             "per-problem candidate budget, or a patience: it would never end")
        return self

    def eval_config(self, seed: int | None = None, *, rescore: bool = False) -> EvalConfig:
        """What every evaluation uses; a rescore (a fresh `seed`) always times the reference beside the candidate,
        so the speedup it reports is two measurements of the same moment."""
        limits = PhaseLimits()
        if self.phase_timeout_s is not None:
            cap = self.phase_timeout_s
            limits = PhaseLimits(load_s=min(limits.load_s, cap), check_s=min(limits.check_s, cap),
                                 time_s=min(limits.time_s, cap))
        timing = TimingConfig.for_device(self.device)
        if self.timing_iters is not None:
            timing = timing.model_copy(update={"iters": self.timing_iters,
                                               "warmup": max(timing.warmup, self.timing_iters // 10)})
        return EvalConfig(trials=self.trials, seed=self.seed if seed is None else seed, skip_timing=self.skip_timing,
                          timing=timing, limits=limits,
                          use_reference_cache=not (rescore or self.fresh_reference),
                          **layout.eval_config_fields(self.ranks_per_gpu))

    def header_config(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
