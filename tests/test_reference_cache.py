"""The reference-timing cache: entries round-trip, concurrent writers lose nothing, and an entry changed
by anyone without the cache's key is ignored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import reference_cache
from harness.results import TimingStats


def stats(median_ms: float) -> TimingStats:
    return TimingStats(median_ms=median_ms, p10_ms=median_ms, p90_ms=median_ms, mean_ms=median_ms, cv=0.0,
                       iterations=10, host_median_ms=median_ms, input_sets=2, spin_us=0.0, slowest_rank=0,
                       rank_medians_ms=[median_ms, median_ms], clock="host")


ROOT = Path(__file__).resolve().parent.parent
WRITER = """
import sys
from harness import reference_cache
from tests.test_reference_cache import stats
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
