"""`pkb eval` gives the right failure class for each kind of broken candidate (CPU, gloo, W=2)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import fields
from pathlib import Path

import pydantic
import pytest

from agent.cli import main as pkb
from harness.common.integrity import IntegrityConfig
from harness.config import EvalConfig, IntegrityChecks, Limits, TimingConfig
from harness.evaluate import evaluate
from harness.problems.registry import get, load_suite
from harness.records.results import EvalResult
from tests.conftest import CANDIDATES, failure_of, live_children, processes_mentioning, timings_of


@pytest.fixture(scope="module")
def all_reduce():
    return get(load_suite(), "all_reduce")


def run(problem, name: str, **limits) -> EvalResult:
    config = EvalConfig(trials=3, timing=TimingConfig.for_device("cpu"), limits=Limits(**limits))
    result = evaluate(problem, CANDIDATES / name, world_size=2, device="cpu", shape="small", config=config)
    assert live_children() == [], "an evaluation left a process behind"
    return result


def test_correct_alternative_is_correct_and_timed(all_reduce):
    r = run(all_reduce, "correct_all_gather_sum.py")
    assert r.verdict == "correct" and r.correct and r.failure is None
    assert r.timings is not None and r.speedup is not None and r.speedup > 0
    assert timings_of(r).candidate.iterations == 10 and timings_of(r).candidate.clock == "host"
    assert set(r.stages) >= {"compile", "launch", "load", "check", "timing"}
    assert r.max_abs_err is not None and r.max_abs_err < 0.05
    # It all-gathers inside solution(): correct, flagged, and never counted as fast.
    assert "uses_torch_collectives" in r.flags and not r.fast_eligible and r.counted_speedup is None
    assert all(c["calls"].get("all_gather", 0) > 0 for c in r.integrity["collectives"]["check"].values())
    fresh = timings_of(r).candidate.fresh_median_ms
    assert timings_of(r).candidate.fresh_iterations == 5 and fresh is not None and fresh > 0


def test_integrity_checks_are_configured_in_eval_config(all_reduce):
    """EvalConfig.integrity lays its settings over the device's defaults, is recorded with the result,
    and decides which checks run."""
    assert {f.name for f in fields(IntegrityConfig)} == set(IntegrityChecks.model_fields)
    with pytest.raises(pydantic.ValidationError):
        IntegrityChecks.model_validate({"audti": False})  # a misspelt check is an error, not a silently ignored setting
    config = EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"), skip_timing=True,
                        integrity=IntegrityChecks.model_validate({"precision_probe": False, "stress_trials": 0}))
    r = evaluate(all_reduce, CANDIDATES / "correct_all_gather_sum.py", world_size=2, device="cpu", shape="small",
                 config=config)
    assert r.verdict == "correct"
    checks = r.integrity["checks"]
    assert checks["precision_probe"] is False and checks["stress_trials"] == 0
    assert checks["fresh_iters"] == IntegrityConfig.for_device("cpu").fresh_iters  # a default kept
    assert sorted(r.integrity["order"]) == [0, 1]  # only the two ordinary trials ran
    assert r.config["integrity"]["precision_probe"] is False and r.config["integrity"]["guard"] is None
    assert live_children() == []


def test_syntax_error_is_compile_error(all_reduce):
    r = run(all_reduce, "compile_error_syntax.py")
    assert r.verdict == "compile_error"
    assert "line 4" in failure_of(r).message
    assert "launch" not in r.stages  # no rank ever started


@pytest.mark.parametrize("name", ["api_error_no_solution.py", "api_error_signature.py",
                                  "api_error_missing_import.py"])
def test_api_errors(all_reduce, name):
    r = run(all_reduce, name)
    assert r.verdict == "api_error", r.failure
    assert failure_of(r).phase == "load"


def test_raise_on_rank1_is_runtime_error_naming_the_rank(all_reduce):
    r = run(all_reduce, "runtime_error_rank1.py")
    assert r.verdict == "runtime_error"
    assert failure_of(r).rank == 1
    assert "rank 1" in failure_of(r).message and "ValueError" in failure_of(r).message
    assert "rank one lost its buffer" in failure_of(r).evidence
    assert len(failure_of(r).evidence.splitlines()) <= 41  # trimmed


def test_wrong_shape_is_shape_mismatch(all_reduce):
    r = run(all_reduce, "shape_mismatch.py")
    assert r.verdict == "shape_mismatch"
    assert "shape" in failure_of(r).message


def test_wrong_values_on_one_rank_is_output_mismatch(all_reduce):
    r = run(all_reduce, "output_mismatch_rank1.py")
    assert r.verdict == "output_mismatch"
    assert failure_of(r).rank == 1
    worst = failure_of(r).max_abs_err
    assert worst is not None and worst > 2.0
    assert failure_of(r).max_rel_err is not None
    assert "max abs err" in failure_of(r).message


def test_hang_on_one_rank_is_deadlock_and_nothing_survives(all_reduce, monkeypatch):
    token = f"pkb-test-orphan-{os.getpid()}"
    monkeypatch.setenv("PKB_TEST_CHILD_TOKEN", token)
    r = run(all_reduce, "deadlock_rank1.py", check_s=4)
    assert r.verdict == "deadlock"
    assert failure_of(r).phase == "check"
    assert "1" in failure_of(r).message
    # Rank 0 waited in the all-reduce for rank 1: its stack says so, and the record keeps both stacks.
    assert "waiting on another rank" in failure_of(r).message
    assert set(r.integrity["stacks"]) == {"0", "1"} and "all_reduce" in r.integrity["stacks"]["0"]
    # The child process rank 1 started died with the evaluation.
    assert processes_mentioning(token) == []


def test_mutating_inputs_fails(all_reduce):
    r = run(all_reduce, "mutates_inputs.py")
    assert r.verdict == "output_mismatch"
    assert "mutates_inputs" in r.flags
    assert failure_of(r).phase == "check" and failure_of(r).trial in range(3)  # an ordinary trial


def test_stale_result_fails(all_reduce):
    r = run(all_reduce, "stale_output.py")
    assert r.verdict == "output_mismatch"
    call = failure_of(r).call
    assert call is not None and call >= 1  # right on the first call, wrong from then on
    assert "stale_output" in r.flags


def test_cli_eval_json_and_exit_codes(tmp_path, capsys):
    out = tmp_path / "result.json"
    code = pkb(["eval", "--problem", "all_reduce", "--solution", str(CANDIDATES / "shape_mismatch.py"),
                "--json", "--out", str(out), "--no-timing"])
    assert code == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["verdict"] == "shape_mismatch"
    assert json.loads(Path(out).read_text())["verdict"] == "shape_mismatch"


def test_cli_eval_reuses_the_reference_timing_unless_asked_for_a_fresh_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PKB_CACHE_DIR", str(tmp_path / "cache"))  # an empty cache of this test's own
    # Reuse is under test, not steadiness (tests/harness/records/test_reference_cache.py): any timing counts as
    # steady here, or a loaded machine would keep the reference out of the cache.
    defaults = IntegrityConfig.for_device
    monkeypatch.setattr(IntegrityConfig, "for_device", classmethod(
        lambda cls, device: dataclasses.replace(defaults(device), reference_cv_max=1e9)))
    args = ["eval", "--problem", "all_reduce", "--solution", str(CANDIDATES / "correct_all_gather_sum.py"),
            "--trials", "2", "--json"]
    cached = []
    for extra in ([], [], ["--fresh-reference"]):
        assert pkb(args + extra) == 0
        cached.append(json.loads(capsys.readouterr().out)["timings"]["reference"]["cached"])
    assert cached == [False, True, False]


def test_one_rank_asleep_with_its_peers_in_a_barrier_is_deadlock_with_stacks(all_reduce):
    r = run(all_reduce, "sleeps_on_one_rank.py", check_s=5, grace_s=1)
    assert r.verdict == "deadlock", r.failure
    assert "rank(s) 1 were waiting on another rank" in failure_of(r).message
    stacks = r.integrity["stacks"]
    assert "sleep" in stacks["0"] or "solution" in stacks["0"]
    assert "barrier" in stacks["1"]
    assert "[rank 0]" in failure_of(r).evidence and "[rank 1]" in failure_of(r).evidence  # what the agent's tools show


def test_every_rank_busy_for_long_is_timeout_not_deadlock(all_reduce):
    r = run(all_reduce, "computes_for_long.py", check_s=5, grace_s=1)
    assert r.verdict == "timeout", r.failure
    assert "all busy in their own code" in failure_of(r).message
    assert all("_grind" in r.integrity["stacks"][str(rank)] for rank in (0, 1))
