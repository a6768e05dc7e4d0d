"""Expert solutions on real GPUs: the GPU path of the harness end to end (marker `gpu`; skipped on CPU).

Run on a 2-GPU node: pytest -m gpu tests/harness/test_gpu_experts.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common.paths import REPO_ROOT
from harness.config import EvalConfig, Limits, TimingConfig
from harness.evaluate import evaluate
from harness.problems.registry import get, load_suite
from tests.conftest import CANDIDATES, live_children, timings_of

ROOT = REPO_ROOT / "problems"
EXPERTS = sorted(ROOT.glob("*/solutions/*.py"))

pytestmark = pytest.mark.gpu


def problem_of(path: Path):
    return get(load_suite(), path.stem.split("__")[0])


@pytest.mark.parametrize("path", EXPERTS, ids=[p.stem for p in EXPERTS])
def test_expert_is_correct_and_timed_on_gpu(path):
    config = EvalConfig(trials=3, timing=TimingConfig(warmup=3, iters=10, host_iters=3))
    r = evaluate(problem_of(path), path, world_size=2, device="cuda", shape="small", config=config)
    assert r.verdict == "correct", r.failure
    assert r.timings is not None and timings_of(r).candidate.clock == "cuda_events"
    assert timings_of(r).candidate.median_ms > 0 and r.speedup is not None
    assert live_children() == []


def test_gpu_deadlock_is_killed_and_gpus_stay_usable():
    problem = get(load_suite(), "all_reduce")
    hung = evaluate(problem, CANDIDATES / "deadlock_rank1.py", world_size=2, device="cuda", shape="small",
                    config=EvalConfig(trials=2, limits=Limits(check_s=15)))
    assert hung.verdict == "deadlock"
    assert live_children() == []
    one_shot = ROOT / "collective/solutions/all_reduce__one_shot.py"
    ok = evaluate(problem, one_shot, world_size=2, device="cuda", shape="small",
                  config=EvalConfig(trials=2, skip_timing=True))
    assert ok.verdict == "correct"
