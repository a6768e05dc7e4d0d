"""A reference's time limits come from its measured cost (harness.judge.reference): a slow one is judged,
one that hangs after its first call is cut off by a limit derived from that call, and the record says
what was measured and derived. CPU, W = 2."""

from __future__ import annotations

import textwrap

import pytest

from harness.config import EvalConfig, Limits, TimingConfig
from harness.evaluate import evaluate
from harness.problems.registry import load_problem_spec
from tests.conftest import failure_of, live_children

# The reference sleeps `first` seconds on its first call in a process, `later` on every later one.
PROBLEM = textwrap.dedent('''
    import time
    import torch
    import torch.distributed as dist
    PROBLEM = {
        "name": "slow_ref", "category": "collective",
        "source": {"codebase": "tests", "path": "slow.py", "symbol": "solution"},
        "summary": "An all-reduce whose reference is slow.", "dtype": "float32",
        "shapes": {"default": {"n": 8}, "small": {"n": 8}},
        "world_sizes": [2], "tolerance": {"atol": 1e-5, "rtol": 1e-5},
    }
    _calls = [0]
    def make_inputs(shape, rank, world_size, generator, device):
        return (torch.randn(shape["n"], generator=generator, device=device),)
    def solution(x):
        _calls[0] += 1
        time.sleep(FIRST if _calls[0] == 1 else LATER)
        out = x.clone()
        dist.all_reduce(out)
        return out
    def oracle(shape, world_size, inputs_by_rank):
        total = sum(i[0] for i in inputs_by_rank)
        return [total.clone() for _ in inputs_by_rank]
''')

LIMITS = Limits(reference_call_s=60.0, reference_scale=2.0, reference_slack_s=5.0, reference_s=900.0)


def _problem(tmp_path, first: float, later: float):
    path = tmp_path / "collective" / "slow_ref.py"
    path.parent.mkdir(parents=True)
    path.write_text(PROBLEM.replace("FIRST", repr(first)).replace("LATER", repr(later)))
    return load_problem_spec(str(path)), path


@pytest.mark.slow
def test_a_slow_reference_is_judged_and_its_cost_recorded(tmp_path):
    problem, path = _problem(tmp_path, 1.0, 1.0)
    config = EvalConfig(trials=2, skip_timing=True, timing=TimingConfig.for_device("cpu"), limits=LIMITS)
    result = evaluate(problem, path, world_size=2, device="cpu", shape="small", config=config)
    assert result.verdict == "correct", result.failure
    cost = result.integrity["reference_cost"]
    assert cost["first_call_s"] >= 1.0
    # the later trials' limit: scale x first call x calls + slack, below the ceiling
    assert cost["trials_limit_s"] < LIMITS.reference_s
    assert live_children() == []


@pytest.mark.slow
def test_a_reference_that_hangs_after_its_first_call_is_cut_off_by_the_derived_limit(tmp_path):
    problem, path = _problem(tmp_path, 0.5, 3600.0)
    config = EvalConfig(trials=2, skip_timing=True, timing=TimingConfig.for_device("cpu"), limits=LIMITS)
    result = evaluate(problem, path, world_size=2, device="cpu", shape="small", config=config)
    assert result.verdict == "infra_error" and failure_of(result).phase == "reference"
    assert "derived from the reference's measured cost" in failure_of(result).message
    assert result.integrity["reference_cost"]["trials_limit_s"] < 120  # not the 900 s ceiling
    assert result.stages.get("reference", 0.0) < 300
    assert live_children() == []


@pytest.mark.slow
def test_a_first_call_that_never_ends_meets_the_call_limit(tmp_path):
    problem, path = _problem(tmp_path, 3600.0, 0.0)
    limits = LIMITS.model_copy(update={"reference_call_s": 20.0})
    config = EvalConfig(trials=2, skip_timing=True, timing=TimingConfig.for_device("cpu"), limits=limits)
    result = evaluate(problem, path, world_size=2, device="cpu", shape="small", config=config)
    assert result.verdict == "infra_error"
    assert "Limits.reference_call_s" in failure_of(result).message
    assert live_children() == []
