"""The search's rules, one at a time: the archive's steps, parent selection, stops, budgets and allocation."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from agent.search import budget, stopping, strategies
from agent.search.archive import DECIDED, EVALUATED, PROPOSED, Archive, Candidate
from agent.search.config import Limits, SearchConfig, StopConfig, StrategyConfig


def cand(i: int, speedup: float | None, *, trusted: bool = True, island: int | None = None, problem: str = "p",
         fraction: float | None = None, source: str | None = None, flags: list[str] | None = None,
         verdict: str = "correct", parents: list[int] | None = None) -> Candidate:
    return Candidate(id=i, problem=problem, seq=i, island=island, parents=parents or [], strategy="x",
                     status=EVALUATED, verdict=verdict, correct=verdict == "correct", speedup=speedup,
                     roofline_fraction=fraction, flags=flags or [], trusted=trusted,
                     source=source if source is not None else f"K = {i}\n")


# -- the archive ----------------------------------------------------------------------------------------------
def test_archive_records_each_step_once_and_canonical_leaves_out_the_clock(tmp_path: Path) -> None:
    with Archive(tmp_path / "a.sqlite") as a:
        a.decide(0, "p", 0, None, [], "islands", {"mode": "fresh"})
        assert a.candidate(0).status == DECIDED  # type: ignore[union-attr]
        a.evaluate(0, {"verdict": "correct"})  # not proposed yet: nothing changes
        assert a.candidate(0).status == DECIDED  # type: ignore[union-attr]
        a.propose(0, model="m", input_tokens=10, output_tokens=5, cost_usd=0.1, cost_known=True, model_s=1.5,
                  note="n", source="x = 1\n", sha256="s", path="candidates/p/00000.py")
        assert a.candidate(0).status == PROPOSED  # type: ignore[union-attr]
        a.evaluate(0, {"verdict": "correct", "correct": True, "speedup": 2.0, "trusted": True, "flags": [],
                       "eval_s": 3.0, "gpu_s": 6.0, "stages": {"check": 1.0}})
        c = a.candidate(0)
        assert c is not None and c.status == EVALUATED and c.speedup == 2.0 and c.tokens == 15
        with pytest.raises(ValueError, match="not columns"):
            a.evaluate(0, {"speed": 1})
        a.decide(1, "p", 1, None, [0], "islands", {})
        a.propose(1, model="m", input_tokens=1, output_tokens=1, cost_usd=0, cost_known=False, model_s=0.1,
                  note="", source=None, sha256=None, path=None, outcome={"verdict": "no_code", "trusted": False})
        assert a.candidate(1).verdict == "no_code" and a.candidate(1).done  # type: ignore[union-attr]
        first = a.canonical()
        assert "eval_s" not in first["candidates"][0] and "model_s" not in first["candidates"][0]
        assert first["candidates"][0]["speedup"] == 2.0
    with Archive(tmp_path / "a.sqlite") as again:  # reopened: the same content
        assert again.canonical() == first and again.next_slot() == 2


def test_archive_refuses_a_file_of_another_schema(tmp_path: Path) -> None:
    with Archive(tmp_path / "a.sqlite") as a:
        a.set_meta("schema", "something-else/9")
    with pytest.raises(ValueError, match="something-else"):
        Archive(tmp_path / "a.sqlite")


# -- parent selection -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["best_first", "islands"])
def test_untrusted_candidates_are_never_parents(name: str) -> None:
    config = StrategyConfig(name=name, explore=0.5, islands=2, inspirations=2)
    rng = random.Random(0)
    for trial in range(300):
        snapshot = []
        for i in range(rng.randint(1, 12)):
            trusted = rng.random() < 0.5
            # untrusted ones are the fastest: a naive search would breed from them
            snapshot.append(cand(i, rng.uniform(5, 10) if not trusted else rng.uniform(0.1, 2), trusted=trusted,
                                 island=i % 2, flags=[] if trusted else ["uses_torch_collectives"]))
        choice = strategies.choose(config, len(snapshot), snapshot, Counter(), [], rng)
        allowed = {c.id for c in snapshot if c.trusted}
        assert set(choice.parents) <= allowed, (trial, choice)


def test_independent_is_always_a_fresh_draft() -> None:
    snapshot = [cand(i, 1.0 + i) for i in range(5)]
    choice = strategies.choose(StrategyConfig(name="independent"), 5, snapshot, Counter(), [], random.Random(0))
    assert choice.parents == [] and choice.island is None


def test_best_first_takes_the_best_and_explores_the_top_k() -> None:
    snapshot = [cand(i, s) for i, s in enumerate([1.0, 3.0, 2.0, 0.5, 2.5])]
    greedy = StrategyConfig(name="best_first", explore=0.0)
    assert strategies.choose(greedy, 5, snapshot, Counter(), [], random.Random(1)).parents == [1]
    explore = StrategyConfig(name="best_first", explore=1.0, top_k=3)
    picks = Counter(strategies.choose(explore, 5, snapshot, Counter(), [], random.Random(s)).parent for s in range(300))
    assert set(picks) == {1, 4, 2} and picks[1] > picks[2]  # the top 3 only, the faster more often


def test_weights_favour_speed_penalise_reuse_and_reward_novelty() -> None:
    config = StrategyConfig()
    fast, slow = cand(0, 2.0, source="a b c\n"), cand(1, 1.0, source="a b c\n")
    w = strategies.weights([fast, slow], Counter(), config)
    assert w[0] > w[1]
    w_used = strategies.weights([fast, slow], Counter({0: 8}), config)
    assert w_used[0] / w_used[1] < w[0] / w[1]
    novel = cand(2, 1.0, source="x y z\n")
    w_novel = strategies.weights([fast, slow, novel], Counter(), config)
    assert w_novel[2] > w_novel[1]


def test_islands_breed_within_an_island_and_migrate_the_best() -> None:
    config = StrategyConfig(name="islands", islands=3, migration_interval=6, inspirations=1)
    snapshot = [cand(i, 1.0 + i, island=i % 3) for i in range(6)]
    for seq in range(6, 30):
        choice = strategies.choose(config, seq, snapshot, Counter(), [], random.Random(seq))
        assert choice.island == seq % 3
        assert all(snapshot[p].island == seq % 3 for p in choice.parents)
    moves = strategies.migrations(config, 6, snapshot, [])
    assert moves == [(1, 3), (2, 4), (0, 5)]  # the best of island i goes to island i + 1
    migrants = [(to, c, 6) for to, c in moves]
    pool = strategies.island_pool(snapshot, 1, migrants)
    assert {c.id for c in pool} == {1, 4, 3}
    assert strategies.migrations(config, 7, snapshot, []) == []
    assert strategies.migrations(StrategyConfig(name="best_first"), 6, snapshot, []) == []


# -- stops ------------------------------------------------------------------------------------------------
def test_stop_rules_in_order_with_their_details() -> None:
    none = Limits()
    used = budget.Spent(candidates=3)
    evaluated = [cand(0, 1.0, fraction=0.3), cand(1, 2.0, fraction=0.85)]
    d = stopping.problem_stop(evaluated, StopConfig(target_fraction=0.8), none, used)
    assert d is not None and d.reason == "target_fraction" and d.detail["best"] == 1
    d = stopping.problem_stop(evaluated, StopConfig(target_speedup=1.5), none, used)
    assert d is not None and d.reason == "target_speedup"
    assert stopping.problem_stop(evaluated, StopConfig(target_speedup=2.5), none, used) is None
    d = stopping.problem_stop(evaluated, StopConfig(), Limits(candidates=3), used)
    assert d is not None and d.reason == "problem_budget:candidates"


def test_patience_counts_candidates_since_the_last_real_gain() -> None:
    seq = [cand(0, 1.0), cand(1, None, trusted=False, verdict="output_mismatch"), cand(2, 1.01), cand(3, 1.5),
           cand(4, 1.52), cand(5, 0.2), cand(6, 9.0, trusted=False, flags=["uses_torch_collectives"])]
    stale, top = stopping.since_improvement(seq, min_gain=0.02)
    assert (stale, top) == (3, 1.52)  # 1.01 and 1.52 are below the 2% gain; the flagged 9x counts for nothing
    assert stopping.problem_stop(seq, StopConfig(patience=3), Limits(), budget.Spent()) is not None
    assert stopping.problem_stop(seq, StopConfig(patience=4), Limits(), budget.Spent()) is None
    failing = [cand(i, None, trusted=False, verdict="compile_error") for i in range(4)]
    d = stopping.problem_stop(failing, StopConfig(patience=4), Limits(), budget.Spent())
    assert d is not None and d.reason == "no_improvement" and d.detail["best"] is None


# -- budgets and allocation ----------------------------------------------------------------------------------
def test_spent_and_reached_for_every_kind() -> None:
    known = [Candidate(id=i, problem="p", seq=i, island=None, parents=[], strategy="x", status=EVALUATED,
                       input_tokens=100, output_tokens=50, cost_usd=0.5, gpu_s=1800.0) for i in range(4)]
    used = budget.spent(known + known[:1], known, wall_s=7200.0)
    assert used.candidates == 5 and used.tokens == 600 and used.cost_usd == 2.0
    assert used.amount("gpu_hours") == 2.0 and used.amount("wall_hours") == 2.0
    assert budget.reached(Limits(candidates=6), used) is None
    assert budget.reached(Limits(candidates=5), used) == "candidates"
    assert budget.reached(Limits(tokens=600), used) == "tokens"
    assert budget.reached(Limits(cost_usd=2.0), used) == "cost_usd"
    assert budget.reached(Limits(gpu_hours=1.5), used) == "gpu_hours"
    assert budget.reached(Limits(wall_hours=2.5, candidates=100), used) is None


def test_allocation_warms_up_then_follows_the_gap() -> None:
    active = ["a", "b", "c"]
    assert budget.choose_problem(active, {"a": 2, "b": 1}, {}, warmup=2) == "b"
    gaps = {"a": 0.9, "b": 0.1, "c": 0.9}
    counts = {"a": 2, "b": 2, "c": 2}
    picks: Counter[str] = Counter()
    for _ in range(200):
        p = budget.choose_problem(active, counts, gaps, warmup=2)
        counts[p] += 1
        picks[p] += 1
    assert picks["a"] > 5 * picks["b"] and abs(picks["a"] - picks["c"]) <= 1
    assert budget.gap([cand(0, 2.0, fraction=0.25)]) == 0.75 and budget.gap([]) == 1.0


def test_a_search_needs_something_that_ends_it() -> None:
    with pytest.raises(ValueError, match="never end"):
        SearchConfig(model="scripted:mutator", problems=["all_reduce"])
    SearchConfig(model="scripted:mutator", problems=["all_reduce"], stop=StopConfig(patience=5))
