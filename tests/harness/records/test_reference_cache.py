"""The reference-timing cache: entries round-trip, concurrent writers lose nothing, an entry changed by
anyone without the cache's key is ignored, and only a steady timing is cached."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.common.paths import REPO_ROOT
from harness.records import reference_cache
from harness.records.results import TimingStats


def stats(median_ms: float, cv: float = 0.0) -> TimingStats:
    return TimingStats(median_ms=median_ms, p10_ms=median_ms, p90_ms=median_ms, mean_ms=median_ms, cv=cv,
                       iterations=10, host_median_ms=median_ms, input_sets=2, spin_us=0.0, slowest_rank=0,
                       rank_medians_ms=[median_ms, median_ms], clock="host")


ROOT = REPO_ROOT
WRITER = """
import sys
from harness.records import reference_cache
from tests.harness.records.test_reference_cache import stats
who, count = int(sys.argv[1]), int(sys.argv[2])
for i in range(count):
    reference_cache.store(f"writer{who}-entry{i}", stats(who + i / 100))
"""


def test_an_entry_comes_back_marked_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_CACHE_DIR", str(tmp_path))
    assert reference_cache.lookup("k") is None
    reference_cache.store("k", stats(1.5))
    got = reference_cache.lookup("k")
    assert got is not None and got.cached and got.median_ms == 1.5


def test_concurrent_writers_lose_no_entry(tmp_path, monkeypatch):
    # Eight processes add ten entries each at once (pkb run evaluates samples concurrently); an
    # unlocked read-modify-write keeps only the last writer's view of the file.
    # Plain subprocesses: multiprocessing's spawn would leave its resource tracker running.
    env = {**os.environ, "PKB_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(who), "10"], env=env, cwd=ROOT)
             for who in range(8)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    monkeypatch.setenv("PKB_CACHE_DIR", str(tmp_path))
    for who in range(8):
        for i in range(10):
            got = reference_cache.lookup(f"writer{who}-entry{i}")
            assert got is not None and abs(got.median_ms - (who + i / 100)) < 1e-12


def test_an_entry_changed_without_the_key_is_ignored(tmp_path, monkeypatch):
    """A candidate that could write the file (no sandbox) and inflate the reference's time gets nothing:
    the tag no longer verifies, the entry reads as absent and the reference is timed again."""
    monkeypatch.setenv("PKB_CACHE_DIR", str(tmp_path))
    reference_cache.store("k", stats(1.5))
    path = reference_cache.cache_file()
    data = json.loads(path.read_text())
    data["k"]["stats"]["median_ms"] = 150.0  # 100x slower reference, 100x the speedup
    path.write_text(json.dumps(data))
    assert reference_cache.lookup("k") is None
    data["k"] = {"stats": data["k"]["stats"], "tag": "0" * 64}  # a made-up tag fares no better
    path.write_text(json.dumps(data))
    assert reference_cache.lookup("k") is None
    assert oct(path.with_name("reference_timings.key").stat().st_mode & 0o777) == "0o600"


def test_an_unsteady_timing_is_timed_again_and_the_steadiest_is_used():
    seen = iter([stats(3.2, cv=1.16), stats(0.47, cv=0.9), stats(0.5, cv=0.95)])
    used, record = reference_cache.time_until_stable(lambda: next(seen), cv_max=0.5, attempts=3)
    assert used.median_ms == 0.47 and record["attempts"] == 3 and record["stable"] is False
    assert record["attempt_cvs"] == [1.16, 0.9, 0.95] and record["cv"] == 0.9
    steady = iter([stats(3.2, cv=1.16), stats(0.47, cv=0.2), stats(9.0, cv=0.0)])
    used, record = reference_cache.time_until_stable(lambda: next(steady), cv_max=0.5, attempts=3)
    assert used.median_ms == 0.47 and record["attempts"] == 2 and record["stable"] is True  # stops once steady


def test_an_entry_cached_before_steadiness_was_required_is_not_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_CACHE_DIR", str(tmp_path))
    reference_cache.store("k", stats(3.2, cv=1.16))  # what an older version cached on a loaded machine
    assert reference_cache.lookup("k") is not None  # signed, so readable ...
    assert reference_cache.lookup("k", cv_max=0.5) is None  # ... but not steady enough to reuse


def test_a_reference_timing_with_high_variance_is_not_cached(tmp_path, monkeypatch):
    """Through the whole protocol: every timing of the reference scatters (CV 116%), so it is timed again up to
    the limit, used for this one speedup, said so in the record, and not written to the cache; a steady one is."""
    from harness.config import EvalConfig, TimingConfig
    from harness.evaluate import evaluate, reference_key
    from harness.judge.reference import ReferenceRun
    from harness.problems.registry import get, load_suite
    from tests.conftest import CANDIDATES

    monkeypatch.setenv("PKB_CACHE_DIR", str(tmp_path))
    real = ReferenceRun.time
    timed: list[float] = []
    cv = {"value": 1.16}

    def scattered(self, config, seed, plan):
        got = real(self, config, seed, plan)
        timed.append(got.median_ms)
        return got.model_copy(update={"cv": cv["value"]})

    monkeypatch.setattr(ReferenceRun, "time", scattered)
    problem = get(load_suite(), "all_reduce")
    config = EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"))
    key = reference_key(problem, "small", 2, "cpu", config)
    result = evaluate(problem, CANDIDATES / "correct_all_gather_sum.py", world_size=2, device="cpu", config=config)
    record = result.integrity["reference_timing"]
    assert len(timed) == 3 and record["attempts"] == 3 and record["stable"] is False and record["cached"] is False
    # Not tests.conftest's timings_of: the writers import this module, and conftest gives a process its own cache.
    assert result.timings is not None
    assert record["cv"] == result.timings.reference.cv == 1.16 and record["cv_max"] == 0.5
    assert reference_cache.lookup(key) is None  # nothing cached: the next evaluation times it again
    cv["value"] = 0.1
    result = evaluate(problem, CANDIDATES / "correct_all_gather_sum.py", world_size=2, device="cpu", config=config)
    assert result.integrity["reference_timing"]["cached"] is True and len(timed) == 4
    assert reference_cache.lookup(key) is not None
