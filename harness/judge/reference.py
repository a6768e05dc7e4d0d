"""The reference side of an evaluation: a pool that never loads candidate code draws every input, runs the
reference on it, writes inputs and expected outputs into the evaluation's private folder, and times the
reference. Judge side (it drives a trusted pool; nothing of the candidate exists while it runs).

A failure here is never the candidate's: a reference that raises, returns something the harness cannot
compare, or overruns its limit is an `infra_error` naming the reason.

Limits come from the reference's measured cost, so a slow reference (PKB's 76-78 take minutes a call)
is judged and a hung one never holds a run for long: the first correctness trial runs alone under
`Limits.reference_call_s` and is the measurement (its slowest rank's seconds); every later step gets
`reference_scale` x that cost x the calls it makes, plus `reference_slack_s`, never more than
`Limits.reference_s`. What was measured and derived is `ReferenceRun.cost` (the record's
integrity.reference_cost), and an overrun of a derived limit says so.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.common.seeds import TIMING_TRIAL_BASE
from harness.config import TimingConfig
from harness.judge import timing
from harness.judge.trials import Trial
from harness.launch.pool import Hang, PoolError, RankPool
from harness.problems.problem import Problem
from harness.records.results import TimingStats


class ReferenceFailed(RuntimeError):
    """The reference could not produce what the evaluation needs: an infrastructure error."""


@dataclass
class TimingSets:
    count: int
    fresh: int
    set_bytes: int
    fingerprints: dict[int, list[list[int]]]  # without refill: rank -> set (rotated, then fresh) -> fingerprint
    mutated: bool  # the reference modifies its inputs (then inputs are not checked for mutation)
    refill: bool = True  # every timed call draws new inputs from a recipe (harness.rank.refill)
    why_not: str | None = None  # why not, where not


@dataclass
class ReferenceRun:
    problem: Problem
    shape: str
    world_size: int
    device: str
    folder: Path
    limit_s: float
    gpus: list[int] | None = None
    start_s: float = 120.0
    ranks_per_gpu: int = 1
    call_s: float | None = None  # the first trial's limit; None: every step gets limit_s (no derived limits)
    scale: float = 3.0
    slack_s: float = 60.0
    pool: RankPool | None = None
    trials: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)  # trial -> rank -> record
    trial_seconds: float = 0.0  # the median trial's time on the slowest rank (the reference's own call)
    sets: TimingSets | None = None
    groups: list[list[int]] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)  # the measured first call and the limits derived from it

    def launch(self) -> ReferenceRun:
        self.pool = RankPool(self.world_size, self.device, start_timeout=self.start_s, gpus=self.gpus,
                             ranks_per_gpu=self.ranks_per_gpu).launch()
        return self

    def wait_ready(self) -> None:
        assert self.pool is not None
        try:
            self.pool.wait_ready()
        except PoolError as err:
            raise ReferenceFailed(f"the reference pool did not start: {err}") from err

    def limit_for(self, calls: int) -> tuple[float, str]:
        """(seconds, why) for a step that makes `calls` reference calls: derived from the measured first call
        where there is one, never above limit_s."""
        first = self.cost.get("first_call_s")
        if first is None:
            return self.limit_s, "Limits.reference_s"
        derived = self.scale * float(first) * max(1, calls) + self.slack_s
        if derived >= self.limit_s:
            return self.limit_s, "Limits.reference_s"
        return derived, (f"a limit derived from the reference's measured cost: {self.scale:g} x {float(first):.2f} s "
                         f"x {max(1, calls)} calls + {self.slack_s:.0f} s")

    def _ask(self, message: dict[str, Any], what: str, limit: tuple[float, str] | None = None) -> list[dict[str, Any]]:
        assert self.pool is not None
        timeout, why = limit or (self.limit_s, "Limits.reference_s")
        try:
            replies = self.pool.request(message, timeout=timeout, grace=5.0)
        except Hang as hang:
            raise ReferenceFailed(f"the reference did not finish {what} within {timeout:.0f} s ({why}); ranks "
                                  f"{hang.missing} were still running") from hang
        except PoolError as err:
            raise ReferenceFailed(f"the reference pool failed during {what}: {err}") from err
        bad = sorted((r for r in replies if not r.get("ok")), key=lambda r: (not r.get("died"), r.get("rank", 0)))
        if bad:
            first = bad[0]
            raise ReferenceFailed(f"{what}: {first.get('message', 'failed')}\n{first.get('evidence', '')}".rstrip())
        return replies

    def _note_groups(self, groups: list[Any]) -> None:
        for g in groups:
            if g is not None and list(g) not in self.groups:
                self.groups.append(list(g))

    def prepare_trials(self, schedule: list[Trial], seed: int) -> None:
        steps: list[tuple[list[Trial], str, tuple[float, str] | None]] = [(schedule, "the correctness trials", None)]
        if self.call_s is not None and schedule:
            first_limit = (min(self.call_s, self.limit_s), "Limits.reference_call_s: the first call, which measures "
                                                           "the reference's cost")
            steps = [(schedule[:1], "its first correctness trial", first_limit),
                     (schedule[1:], f"{len(schedule) - 1} more correctness trials", None)]
        try:
            for part, what, limit in steps:
                if not part:
                    continue
                if limit is None and self.call_s is not None:
                    limit = self.limit_for(len(part))
                    self.cost["trials_limit_s"] = round(limit[0], 1)
                replies = self._ask({"op": "ref_trials", "problem": self.problem.loader_spec, "shape": self.shape,
                                     "seed": seed, "dir": str(self.folder),
                                     "trials": [{"id": t.id, "kind": t.kind} for t in part]}, what, limit)
                for reply in replies:
                    for record in reply["trials"]:
                        self.trials.setdefault(int(record["id"]), {})[reply["rank"]] = record
                        self._note_groups(record.get("groups", []))
                if self.call_s is not None and "first_call_s" not in self.cost:
                    first = max(float(r.get("seconds", 0.0)) for reply in replies for r in reply["trials"])
                    self.cost.update(first_call_s=round(first, 3), scale=self.scale, slack_s=self.slack_s,
                                     ceiling_s=self.limit_s)
            per_trial = [max(float(by_rank[r].get("seconds", 0.0)) for r in by_rank)
                         for by_rank in self.trials.values()]
        except (KeyError, TypeError, ValueError, AttributeError) as err:  # fail closed: never a guess
            raise ReferenceFailed(f"the reference pool's trial records are malformed: {err!r}") from err
        self.trial_seconds = sorted(per_trial)[len(per_trial) // 2] if per_trial else 0.0

    def prepare_sets(self, seed: int, config: TimingConfig, fresh: int, plan: timing.Plan) -> TimingSets:
        """How many rotated sets timing uses, and the expected outputs of the plan's judged calls (or, where a
        rank cannot draw its inputs, the sets and fresh sets as files with their outputs)."""
        judged = [{"trial": it.trial, "probe": it.kind == "probe"} for it in plan.judged]
        replies = self._ask({"op": "ref_sets", "problem": self.problem.loader_spec, "shape": self.shape,
                             "seed": seed, "trial_base": TIMING_TRIAL_BASE, "fresh": fresh, "judged": judged,
                             "config": config.model_dump(), "dir": str(self.folder)}, "the timing inputs",
                           self.limit_for(config.max_input_sets + fresh))
        try:
            for reply in replies:
                self._note_groups(reply.get("groups", []))
            refill = bool(replies[0].get("refill"))
            self.sets = TimingSets(count=int(replies[0]["input_sets"]), fresh=fresh,
                                   set_bytes=int(replies[0]["set_bytes"]),
                                   fingerprints={r["rank"]: r.get("fingerprints", []) for r in replies},
                                   mutated=any(r.get("mutated") for r in replies), refill=refill,
                                   why_not=None if refill else str(replies[0].get("why_not")))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            raise ReferenceFailed(f"the reference pool's timing sets are malformed: {err!r}") from err
        return self.sets

    def time(self, config: TimingConfig, seed: int, plan: timing.Plan) -> TimingStats:
        """The reference timed with the candidate's protocol and plan: the same recipes, the same hand-overs
        of judged outputs (written to this private folder and dropped: the expected ones were saved)."""
        assert self.pool is not None and self.sets is not None
        self._ask({"op": "time_begin", "problem": self.problem.loader_spec, "fresh": False,
                   "clone_inputs": self.sets.mutated}, "timing set-up")
        budget = self.limit_for(config.warmup + config.iters + config.host_iters)
        call = self.limit_for(1)
        deadline = time.monotonic() + budget[0]
        kept_dir = self.folder / "reference-kept"
        kept_dir.mkdir(exist_ok=True)

        def ask(pool: RankPool, message: Any, phase: str, timeout: float) -> list[dict[str, Any]]:
            return self._ask(message, "timing", (min(timeout, call[0]), call[1]))

        def drop(kept: timing.Kept) -> None:
            for path in kept.paths.values():
                path.unlink(missing_ok=True)
                path.with_suffix(".issue").unlink(missing_ok=True)

        if not self.sets.refill:
            plan = plan.without_refill()
        # The reference never gets fresh calls (it caches nothing); they are the candidate's check.
        ref_plan = timing.Plan([it for it in plan.iterations if it.request != "fresh"], refill=plan.refill)
        run = timing.drive(self.pool, ask, ref_plan, n_sets=self.sets.count,
                           recipes=timing.recipes_for(seed),
                           config=config, cuda=self.device == "cuda", keep_dir=kept_dir,
                           call_timeout=call[0], deadline=deadline, on_kept=drop,
                           check_inputs=not self.sets.mutated)  # as the candidate's hand-overs do
        return timing.stats(run, "cuda_events" if self.device == "cuda" else "host")

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def kill(self) -> None:
        if self.pool is not None:
            self.pool.kill()
            self.pool = None


def time_reference_in_pool(pool: RankPool, problem: Problem, shape: str, device: str, folder: Path, *,
                           seed: int = 0, config: TimingConfig | None = None, timeout: float = 300.0) -> TimingStats:
    """The reference timed in an existing trusted pool, exactly as evaluations time it (pkb roofline)."""
    config = config or TimingConfig.for_device(device)
    run = ReferenceRun(problem, shape, pool.world_size, device, folder, timeout, pool=pool)
    plan = timing.make_plan(config, 0, judged=0, probes=0, rng=random.Random(seed))
    run.prepare_sets(seed, config, fresh=0, plan=plan)
    return run.time(config, seed, plan)

