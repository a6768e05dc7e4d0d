"""The reference side of an evaluation: a pool that never loads candidate code draws every input, runs the
reference on it, writes inputs and expected outputs into the evaluation's private folder, and times the
reference. Judge side (it drives a trusted pool; nothing of the candidate exists while it runs).

A failure here is never the candidate's: a reference that raises, returns something the harness cannot
compare, or overruns its limit (`Limits.reference_s`: slow references such as PKB's 76-78 take minutes at
small shapes) is an `infra_error` naming the reason.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import TimingConfig
from harness.judge import timing
from harness.judge.trials import Trial
from harness.pool import Hang, PoolError, RankPool
from harness.problem import Problem
from harness.results import TimingStats
from harness.seeds import TIMING_TRIAL_BASE


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
    pool: RankPool | None = None
    trials: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)  # trial -> rank -> record
    trial_seconds: float = 0.0  # the median trial's time on the slowest rank (the reference's own call)
    sets: TimingSets | None = None
    groups: list[list[int]] = field(default_factory=list)

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

    def _ask(self, message: dict[str, Any], what: str) -> list[dict[str, Any]]:
        assert self.pool is not None
        try:
            replies = self.pool.request(message, timeout=self.limit_s, grace=5.0)
        except Hang as hang:
            raise ReferenceFailed(f"the reference did not finish {what} within {self.limit_s:.0f} s "
                                  f"(Limits.reference_s); ranks {hang.missing} were still running") from hang
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
        replies = self._ask({"op": "ref_trials", "problem": self.problem.loader_spec, "shape": self.shape,
                             "seed": seed, "dir": str(self.folder),
                             "trials": [{"id": t.id, "kind": t.kind} for t in schedule]}, "the correctness trials")
        for reply in replies:
            for record in reply["trials"]:
                self.trials.setdefault(int(record["id"]), {})[reply["rank"]] = record
                self._note_groups(record.get("groups", []))
        per_trial = [max(float(by_rank[r].get("seconds", 0.0)) for r in by_rank) for by_rank in self.trials.values()]
        self.trial_seconds = sorted(per_trial)[len(per_trial) // 2] if per_trial else 0.0

    def prepare_sets(self, seed: int, config: TimingConfig, fresh: int, plan: timing.Plan) -> TimingSets:
        """How many rotated sets timing uses, and the expected outputs of the plan's judged calls (or, where a
        rank cannot draw its inputs, the sets and fresh sets as files with their outputs)."""
        judged = [{"trial": it.trial, "probe": it.kind == "probe"} for it in plan.judged]
        replies = self._ask({"op": "ref_sets", "problem": self.problem.loader_spec, "shape": self.shape,
                             "seed": seed, "trial_base": TIMING_TRIAL_BASE, "fresh": fresh, "judged": judged,
                             "config": config.model_dump(), "dir": str(self.folder)}, "the timing inputs")
        for reply in replies:
            self._note_groups(reply.get("groups", []))
        refill = bool(replies[0].get("refill"))
        self.sets = TimingSets(count=int(replies[0]["input_sets"]), fresh=fresh,
                               set_bytes=int(replies[0]["set_bytes"]),
                               fingerprints={r["rank"]: r.get("fingerprints", []) for r in replies},
                               mutated=any(r.get("mutated") for r in replies), refill=refill,
                               why_not=None if refill else str(replies[0].get("why_not")))
        return self.sets

    def time(self, config: TimingConfig, seed: int, plan: timing.Plan) -> TimingStats:
        """The reference timed with the candidate's protocol and plan: the same recipes, the same hand-overs
        of judged outputs (written to this private folder and dropped: the expected ones were saved)."""
        assert self.pool is not None and self.sets is not None
        self._ask({"op": "time_begin", "problem": self.problem.loader_spec, "fresh": False,
                   "clone_inputs": self.sets.mutated}, "timing set-up")
        deadline = time.monotonic() + self.limit_s
        kept_dir = self.folder / "reference-kept"
        kept_dir.mkdir(exist_ok=True)

        def ask(pool: RankPool, message: Any, phase: str, timeout: float) -> list[dict[str, Any]]:
            return self._ask(message, "timing")

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
                           call_timeout=self.limit_s, deadline=deadline, on_kept=drop,
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

