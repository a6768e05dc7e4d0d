"""harness.judge.timing on its own: the spin it sets from the warm-up's claims, the requests it sends a pool
(in order, with the judged call told only afterwards), the statistics it takes from the ranks' claims and its
own spans, and the reconciliation of the two."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from harness.common import spin
from harness.common.integrity import IntegrityConfig
from harness.config import TimingConfig
from harness.judge.timing import (
    CALL_TRIAL_BASE,
    Iteration,
    Kept,
    Plan,
    TimingRun,
    drive,
    make_plan,
    recipes_for,
    reconcile,
    refilled_as,
    spin_for,
    stats,
)

CONFIG = TimingConfig(warmup=3, iters=4, host_iters=2)


def warm(*per_iteration: tuple[float, ...]) -> list[list[dict[str, Any]]]:
    """Warm-up replies: per iteration, each rank's enqueue time of the call (the barrier's is 1 µs)."""
    return [[{"enqueue_us": us, "barrier_enqueue_us": 1.0} for us in ranks] for ranks in per_iteration]


def test_the_spin_follows_the_slowest_rank_and_skips_the_first_call():
    # The first call (compile, allocation) is left out; per call the slowest rank; their median; 4x + 30 µs.
    replies = warm((5000.0, 5000.0), (10.0, 20.0), (30.0, 5.0), (12.0, 14.0))
    assert spin_for(replies, CONFIG) == pytest.approx(4 * 21.0 + 30.0)
    assert spin_for(replies, CONFIG) == spin.spin_us(21.0, CONFIG.min_spin_us, CONFIG.max_spin_us)


def test_the_spin_stays_within_the_configured_bounds():
    assert spin_for(warm((0.0,), (0.0,)), CONFIG) == pytest.approx(30.0 + 4 * 1.0)
    assert spin_for(warm((0.0,), (0.0,)), CONFIG.model_copy(update={"min_spin_us": 100.0})) == 100.0
    assert spin_for(warm((1.0,), (1e9,)), CONFIG) == CONFIG.max_spin_us
    assert spin_for(warm((1.0,), (math.inf,)), CONFIG) == CONFIG.max_spin_us  # a claim the clock cannot have made
    assert spin_for([], CONFIG) == 30.0  # no warm-up: the formula at zero enqueue


class FakePool:
    """Two ranks that answer every request with fixed claims, and remember what they were sent."""

    world_size = 2
    last_span_s = 0.004

    def __init__(self) -> None:
        self.sent: list[Any] = []


def ask(pool: Any, message: Any, phase: str, timeout: float) -> list[dict[str, Any]]:
    pool.sent.append(message)
    op = message[0]["op"] if 0 in message else message["op"]
    if op == "time_prepare":
        return [{"rank": r, "ok": True, "refill_ms": 0.5 + r, "kept_intact": True} for r in range(2)]
    if op == "time_call":
        return [{"rank": r, "ok": True, "ms": 1.0 + r, "enqueue_us": 8.0, "barrier_enqueue_us": 2.0}
                for r in range(2)]
    return [{"rank": r, "ok": True, "fingerprints": [[r]]} for r in range(2)]


def test_drive_sends_every_call_after_its_prepare_and_says_it_is_judged_only_afterwards(tmp_path: Path):
    pool: Any = FakePool()  # drive reads world_size and last_span_s of a RankPool, nothing else
    plan = Plan([Iteration("warmup", "warmup", CALL_TRIAL_BASE, False),
                 Iteration("timed", "timed", CALL_TRIAL_BASE + 1, True),
                 Iteration("timed", "timed", CALL_TRIAL_BASE + 2, False)])
    kept: list[Kept] = []
    run = drive(pool, ask, plan, n_sets=2, recipes=recipes_for(7), config=CONFIG, cuda=True, keep_dir=tmp_path,
                call_timeout=10.0, deadline=math.inf, on_kept=kept.append)
    ops = [m[0]["op"] if 0 in m else m["op"] for m in pool.sent]
    assert ops == ["time_prepare", "time_call"] * 3 + ["time_end"]
    prepares = [m for m in pool.sent if 0 in m and m[0]["op"] == "time_prepare"]
    # The judged call (the second) is named in the request after it, never in its own.
    assert [p[0]["keep_previous"] for p in prepares[:2]] == [None, None]
    assert prepares[2][0]["keep_previous"] == str(tmp_path / f"kept-{CALL_TRIAL_BASE + 1}-r0.bin")
    assert prepares[2][1]["keep_previous"] == str(tmp_path / f"kept-{CALL_TRIAL_BASE + 1}-r1.bin")
    # Each rank gets its own recipe for each call; the sets rotate.
    assert prepares[1][0]["fill"] != prepares[1][1]["fill"] and prepares[1][0]["fill"] != prepares[2][0]["fill"]
    assert [p[0]["set"] for p in prepares] == [0, 1, 0]
    # The spin is set from the warm-up's claims before the first counted call: slowest rank 8 + 2 µs.
    calls = [m for m in pool.sent if 0 not in m and m["op"] == "time_call"]
    assert calls[0]["spin_us"] == 0.0 and calls[1]["spin_us"] == pytest.approx(spin.spin_us(10.0))
    assert [k.iteration.trial for k in kept] == [CALL_TRIAL_BASE + 1] and kept[0].intact == {0: True, 1: True}
    assert run.times["timed"] == [[1.0, 2.0], [1.0, 2.0]] and run.spans["timed"] == [4.0, 4.0]
    assert run.refill == [1.5, 1.5, 1.5] and run.fingerprints == {0: [[0]], 1: [[1]]}


def test_drive_on_cpu_leaves_the_spin_at_zero(tmp_path: Path):
    pool: Any = FakePool()  # drive reads world_size and last_span_s of a RankPool, nothing else
    plan = make_plan(CONFIG, n_fresh=0, judged=0, probes=0, rng=random.Random(1))
    run = drive(pool, ask, plan, n_sets=2, recipes=recipes_for(0), config=CONFIG, cuda=False, keep_dir=tmp_path,
                call_timeout=10.0, deadline=math.inf, on_kept=lambda k: None)
    assert run.spin_us == 0.0 and len(run.times["timed"]) == CONFIG.iters and len(run.times["host"]) == 2


def test_a_plan_without_refill_has_no_probes_and_sends_no_recipes(tmp_path: Path):
    plan = make_plan(CONFIG, n_fresh=1, judged=2, probes=3, rng=random.Random(2))
    assert sum(it.kind == "probe" for it in plan.iterations) == 3 and all(it.judged for it in plan.iterations
                                                                           if it.kind == "probe")
    bare = plan.without_refill()
    assert not bare.refill and not any(it.kind == "probe" for it in bare.iterations)
    pool: Any = FakePool()  # drive reads world_size and last_span_s of a RankPool, nothing else
    drive(pool, ask, bare, n_sets=2, recipes=recipes_for(0), config=CONFIG, cuda=False, keep_dir=tmp_path,
          call_timeout=10.0, deadline=math.inf, on_kept=lambda k: None)
    assert all(m[r]["fill"] is None for m in pool.sent if 0 in m and m[0]["op"] == "time_prepare" for r in (0, 1))


def run_of(claims: list[float], spans: list[float], spin_us: float = 0.0) -> TimingRun:
    run = TimingRun(spin_us=spin_us, input_sets=2)
    for claim, span in zip(claims, spans):
        run.add("timed", [{"ms": claim}, {"ms": claim / 2}], span / 1e3)
    return run


def test_stats_take_the_slowest_rank_per_call_and_the_harness_spans():
    s = stats(run_of([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], spin_us=100.0), "cuda_events")
    assert s.median_ms == 2.0 and s.iterations == 3 and s.rank_medians_ms == [2.0, 1.0] and s.slowest_rank == 0
    assert s.span_median_ms == pytest.approx(2.5)
    assert s.unexplained_low_ms == pytest.approx(0.5 - 0.1)  # span - claim - spin, its low quantile
    assert math.isnan(s.host_median_ms) and s.fresh_median_ms is None


def test_claims_the_harness_clock_contradicts_are_reported():
    checks = IntegrityConfig()
    reference = stats(run_of([1.0] * 5, [1.2] * 5), "host")
    honest = stats(run_of([1.0] * 5, [1.2] * 5), "host")
    assert reconcile(honest, reference, checks) == []
    longer_than_seen = stats(run_of([5.0] * 5, [1.2] * 5), "host")
    assert any("longer than" in p for p in reconcile(longer_than_seen, reference, checks))
    # Claims a tenth of what the clock saw, where the reference's claims explained their spans.
    shrunk = stats(run_of([1.0] * 5, [10.0] * 5), "host")
    assert any("smaller than what the harness's clock saw" in p for p in reconcile(shrunk, reference, checks))


def refilling_ask(marks: list[str]) -> Any:
    """`ask` whose ranks say how each call's inputs were made: the i-th prepare answers marks[i] on rank 1
    (rank 0 always refills in place), and every call claims 1 ms, or 0.1 ms where rank 1 did not refill."""
    turn = iter(marks)
    last = ["i"]

    def answer(pool: Any, message: Any, phase: str, timeout: float) -> list[dict[str, Any]]:
        op = message[0]["op"] if 0 in message else message["op"]
        if op == "time_prepare":
            last[0] = next(turn)
            return [{"rank": 0, "ok": True, "refill_ms": 0.1, "refilled": "i"},
                    {"rank": 1, "ok": True, "refill_ms": 0.1, "refilled": last[0]}]
        if op == "time_call":
            ms = 1.0 if last[0] == "i" else 0.1
            return [{"rank": r, "ok": True, "ms": ms} for r in range(2)]
        return [{"rank": r, "ok": True} for r in range(2)]

    return answer


def test_iterations_not_refilled_are_recorded_never_counted_and_flagged(tmp_path: Path):
    # Issue 45, class 7: a timed iteration on inputs that were not refilled can be a memo's hit. Rank 1 says it
    # rotated its set as given ("r") in two timed calls, and nothing in a third: none of them is counted.
    plan = Plan([Iteration("warmup", "warmup", CALL_TRIAL_BASE, False)]
                + [Iteration("timed", "timed", CALL_TRIAL_BASE + i, False) for i in range(1, 7)])
    pool: Any = FakePool()
    run = drive(pool, refilling_ask(["i", "i", "r", "i", "r", "i", ""]), plan, n_sets=2, recipes=recipes_for(3),
                config=CONFIG, cuda=False, keep_dir=tmp_path, call_timeout=10.0, deadline=math.inf,
                on_kept=lambda k: None)
    s = stats(run, "host")
    assert s.refilled == {"warmup": "i", "timed": "i-i-i-"}
    assert s.iterations == 3 and s.median_ms == 1.0  # the three fast calls on unchanged inputs left out
    honest = stats(run_of([1.0] * 5, [1.2] * 5), "host")
    problems = reconcile(s, honest, IntegrityConfig())
    assert any("not refilled" in p and "timed 1, 3, 5" in p for p in problems), problems
    assert reconcile(honest, honest, IntegrityConfig()) == []


def test_refilled_as_accepts_only_what_the_plan_asked_of_every_rank():
    refilling, rotating = Plan([]), Plan([], refill=False)
    said = lambda *marks: [{"refilled": m} for m in marks]  # noqa: E731
    assert refilled_as(refilling, "timed", said("i", "i")) == "i"
    assert refilled_as(refilling, "timed", said("d", "d")) == "d"
    assert refilled_as(refilling, "fresh", said("f", "f")) == "f"
    assert refilled_as(refilling, "timed", said("i", "d")) == "-"  # ranks that disagree
    assert refilled_as(refilling, "timed", said("r", "r")) == "-"  # rotated though a recipe was sent
    assert refilled_as(refilling, "fresh", said("i", "i")) == "-"  # a never-seen call must be a fresh draw
    assert refilled_as(refilling, "timed", [{}, {}]) == "-"  # a rank that says nothing
    assert refilled_as(rotating, "timed", said("r", "r")) == "r"
    assert refilled_as(rotating, "timed", said("i", "i")) == "-"
