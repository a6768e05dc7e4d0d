"""harness.evaluation's pieces that decide something without ranks: the context's inputs stay fixed, the record
names the user's file, a rank's report is a claim, an unanticipated exception's verdict, a hostile scratch file.
The phases themselves run end to end in tests/harness/test_eval_verdicts.py and tests/harness/test_exploits.py."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import pytest

from harness.common import failures, hostile_files, integrity
from harness.common.flags import EMULATED
from harness.config import EvalConfig, TimingConfig
from harness.evaluation.context import Context
from harness.evaluation.prepare import integrity_checks
from harness.evaluation.record import Record
from harness.evaluation.stop import Stop, candidate_files, failure_from, first_failure, unexpected_failure
from harness.launch.pool import PoolError
from harness.launch.sandbox.private import remove_private
from harness.problems.registry import get, load_suite
from harness.records.results import Failure
from tests.conftest import CANDIDATES


@pytest.fixture
def context() -> Iterator[Context]:
    config = EvalConfig(timing=TimingConfig.for_device("cpu"), ranks_per_gpu=2)
    ctx = Context.open(get(load_suite(), "all_reduce"), CANDIDATES / "correct_all_gather_sum.py", world_size=2,
                       device="cpu", shape="small", config=config, checks=integrity_checks(config, None, "cpu"),
                       log_dir=None, gpus=None, salt=7, rng=random.Random(1))
    yield ctx
    remove_private(ctx.folder)


def test_the_context_is_fixed_and_its_folder_private(context: Context):
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.shape = "default"  # type: ignore[misc]
    assert context.code_path.read_bytes() == context.source == context.path.read_bytes()
    assert context.code_path != context.path and context.ref_dir.is_dir()
    assert context.seed == integrity.mixed_seed(context.config.seed, 7) != context.config.seed
    assert context.emulated


def test_sharing_gpus_stresses_more_and_later():
    plain = integrity_checks(EvalConfig(), None, "cpu")
    shared = integrity_checks(EvalConfig(ranks_per_gpu=2), None, "cpu")
    assert shared.stress_trials >= max(plain.stress_trials, 6) and shared.stress_delay_s >= 0.02


def test_the_record_names_the_users_file_and_says_emulated(context: Context):
    record = Record.start(context)
    assert record.evidence["salt"] == 7 and record.evidence["checks"] == context.checks.to_dict()
    record.failure = Failure(verdict=failures.RUNTIME_ERROR, message=f"File {context.code_path}, line 3",
                             evidence=f"at {context.code_path}")
    result = record.result(context)
    assert result.failure is not None and str(context.code_path) not in result.failure.message
    assert result.failure.message == f"File {context.path}, line 3" and result.failure.evidence == f"at {context.path}"
    assert result.verdict == failures.RUNTIME_ERROR and not result.correct
    assert EMULATED in result.flags and result.emulated and not result.fast_eligible


@pytest.mark.parametrize(("claimed", "build", "verdict"), [
    (failures.CORRECT, False, failures.RUNTIME_ERROR),  # a tampered rank claiming success
    (failures.INFRA_ERROR, False, failures.RUNTIME_ERROR),  # retried, never charged: not the rank's to say
    ("no such verdict", False, failures.RUNTIME_ERROR),
    (failures.RUNTIME_ERROR, True, failures.COMPILE_ERROR),  # a build inside the first call failed
    (failures.DEADLOCK, False, failures.DEADLOCK),  # a failure that only hurts the candidate: taken at its word
])
def test_a_ranks_report_is_a_claim(claimed: str, build: bool, verdict: str):
    failure, flags = failure_from({"verdict": claimed, "build": build, "rank": "1", "flags": ["x", 3],
                                   "message": "m" * 5000}, "check")
    assert failure.verdict == verdict and failure.phase == "check"
    assert failure.rank is None and len(failure.message) == 1500 and flags == ["x"]


def test_the_root_failure_is_a_dead_rank_else_the_lowest():
    assert first_failure([{"rank": 0}, {"rank": 1, "died": True}])["rank"] == 1
    assert first_failure([{"rank": 1}, {"rank": 0}])["rank"] == 0


@pytest.mark.parametrize(("phase", "verdict"), [("compile", failures.COMPILE_ERROR), ("check", failures.RUNTIME_ERROR),
                                                ("timing", failures.RUNTIME_ERROR), ("launch", failures.INFRA_ERROR),
                                                ("reference", failures.INFRA_ERROR)])
def test_an_unanticipated_exception_is_the_candidates_in_its_phases(phase: str, verdict: str):
    failure = unexpected_failure(PoolError("gone"), phase)
    assert failure.verdict == verdict and failure.phase == phase
    assert (failure.infra_cause == "harness") == (verdict == failures.INFRA_ERROR)


def test_a_hostile_scratch_file_is_tampering():
    with pytest.raises(Stop) as stop, candidate_files("timing"):
        raise hostile_files.HostileFile("a symbolic link")
    assert stop.value.failure.verdict == failures.RUNTIME_ERROR and stop.value.failure.phase == "timing"
    assert stop.value.flags == [integrity.TAMPERING]
