"""The whole problem suite: contract, counts, and every reference against its oracle under gloo."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from harness.problems.contract_checks import input_issues, metadata_issues
from harness.problems.registry import discover, load_suite
from harness.validate import validate_problems

SUITE, MALFORMED = discover()


def test_no_malformed_problem_files():
    assert not MALFORMED, "\n".join(map(str, MALFORMED))


@pytest.mark.parametrize("problem", SUITE, ids=[p.name for p in SUITE])
def test_problem_meets_contract(problem):
    assert not metadata_issues(problem)
    for w in (2, 4):
        if problem.supports(w):
            assert not input_issues(problem, "small", w), input_issues(problem, "small", w)
    assert problem.summary and len(problem.summary) > 40
    assert problem.source["path"] and problem.source["symbol"]


# Category minimums of the suite (foundation + suite issues).
MINIMUMS = {
    ("collective",): 12,
    ("tensor",): 18,
    ("sequence", "context"): 14,
    ("pipeline", "other"): 10,
    ("expert",): 16,
    ("data", "fsdp_zero"): 16,
    ("rl_vocab",): 10,
}


def test_category_minimums():
    counts = Counter(p.category for p in SUITE)
    for cats, minimum in MINIMUMS.items():
        assert sum(counts[c] for c in cats) >= minimum, (cats, dict(counts))
    assert len(SUITE) >= 96


def test_every_reference_matches_its_oracle_at_w2_and_w4():
    """At the small shape and at its held-out counterpart (the shape only the final scoring uses)."""
    started = time.perf_counter()
    results = validate_problems(load_suite(), [2, 4], trials=2)
    failed = [f"W={v.world_size} {v.problem} {v.shape}: {v.verdict}: {v.message[:500]}" for v in results if not v.ok]
    assert not failed, "\n".join(failed)
    expected = sum(p.supports(2) for p in SUITE) + sum(p.supports(4) for p in SUITE)
    assert len(results) == 2 * expected
    assert {v.shape for v in results} == {"small", "held-out:small"}
    print(f"suite validated: {len(results)} (problem, W) pairs in {time.perf_counter() - started:.1f} s")
