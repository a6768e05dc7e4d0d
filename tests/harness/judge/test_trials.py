"""harness.judge.trials on its own: the schedule of trials, the delays that hide the stress trials, the judgement
of one call from the files ranks wrote (as the judge reads them: data only, through the scratch's folder), and
the verdict over every call."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.common import failures, hostile_files, integrity
from harness.common.integrity import IntegrityConfig
from harness.judge.trials import (
    MIN_OUTPUT_LIMIT,
    STRICT,
    CallResult,
    Judge,
    Trial,
    decide,
    delays,
    output_limit,
    schedule,
    worst_errors,
)
from harness.rank import transport

CHECKS = IntegrityConfig()


def test_the_schedule_holds_every_trial_once_in_an_order_drawn_from_the_secret():
    order = schedule(5, CHECKS, 2, random.Random(1))
    kinds = Counter(t.kind for t in order)
    assert kinds == {"normal": 5, "stress": CHECKS.stress_trials, "probe": 1}
    assert sorted(t.id for t in order if t.kind == "normal") == list(range(5))
    stress = sorted((t.id, t.late_rank) for t in order if t.kind == "stress")
    assert stress == [(integrity.STRESS_TRIAL_BASE + i, i % 2) for i in range(CHECKS.stress_trials)]
    assert order != schedule(5, CHECKS, 2, random.Random(2))  # another secret, another order
    assert all(t.kind != "probe" for t in schedule(5, IntegrityConfig(precision_probe=False), 2,
                                                  random.Random(1)))


def test_only_a_stress_trials_late_rank_gets_the_full_delay():
    rng = random.Random(3)
    plain = delays(Trial(0, "normal"), CHECKS, 4, rng)
    assert len(plain) == 4 and all(0.0 <= d <= CHECKS.jitter_s for d in plain)
    late = delays(Trial(integrity.STRESS_TRIAL_BASE + 1, "stress", 1), CHECKS, 4, rng)
    assert late[1] >= CHECKS.stress_delay_s and all(d <= CHECKS.jitter_s for i, d in enumerate(late) if i != 1)


def test_the_output_limit_leaves_room_for_a_wrong_layout_and_no_more():
    assert output_limit(0, 2) == MIN_OUTPUT_LIMIT
    big = 100 << 20
    assert output_limit(big, 4) == 8 * big + (1 << 20)


class Call:
    """One call's files as a rank leaves them in its scratch, and the reference pool's in the private folder."""

    def __init__(self, tmp: Path, trial: Trial, expected: list[Any]) -> None:
        self.ref_dir, self.scratch, self.trial = tmp / "ref", tmp / "scratch", trial
        self.ref_dir.mkdir(exist_ok=True)
        self.scratch.mkdir(exist_ok=True)
        for rank, value in enumerate(expected):
            transport.write_tree(self.ref_dir / f"exp-{trial.id}-r{rank}.bin", value)

    def paths(self, rank: int) -> dict[str, str]:
        stem = str(self.scratch / f"out-{self.trial.id}-r{rank}")
        return {"output": stem + ".bin", "inputs_after": stem + ".in", "previous_output": stem + ".prev"}

    def answer(self, rank: int, value: Any, **reply: Any) -> dict[str, Any]:
        transport.write_tree(Path(self.paths(rank)["output"]), value)
        return {"rank": rank, "ok": True, "input_fingerprint": [1], **reply}


def judge_one(tmp_path: Path, expected: list[Any], got: list[Any], **reply: Any) -> tuple[CallResult, Judge]:
    call = Call(tmp_path, Trial(0, "normal"), expected)
    with hostile_files.Folder.open(call.scratch) as files:
        judge = Judge(1e-5, 1e-5, "cpu", call.ref_dir, files, len(expected))
        result = CallResult(call.trial, 0)
        replies = [call.answer(r, g, **reply) for r, g in enumerate(got)]
        judge.judge_call(result, replies, {r: call.paths(r) for r in range(len(got))},
                         {r: {"fingerprint": [1]} for r in range(len(got))})
    return result, judge


def test_right_outputs_on_every_rank_pass(tmp_path: Path):
    x = torch.arange(4.0)
    result, judge = judge_one(tmp_path, [x, 2 * x], [x.clone(), 2 * x])
    assert result.failure is None and not result.flags and judge.rules == {STRICT}


def test_a_wrong_rank_is_named_with_its_trial_and_call(tmp_path: Path):
    x = torch.arange(4.0)
    result, _ = judge_one(tmp_path, [x, 2 * x], [x.clone(), 3 * x])
    assert result.failure is not None and result.failure["verdict"] == failures.OUTPUT_MISMATCH
    assert result.failure["rank"] == 1 and result.failure["trial"] == 0 and result.failure["call"] == 0


def test_a_rank_that_modified_its_inputs_fails_under_the_strict_rule(tmp_path: Path):
    x = torch.arange(4.0)
    result, _ = judge_one(tmp_path, [x], [x.clone()], input_fingerprint=[2])
    assert result.failure is not None and integrity.MUTATES_INPUTS in result.flags


def test_an_output_that_cannot_be_read_is_the_candidates_failure_and_tampering(tmp_path: Path):
    call = Call(tmp_path, Trial(0, "normal"), [torch.zeros(2)])
    Path(call.paths(0)["output"]).write_bytes(b"not a tree")  # a rank claims ok and leaves garbage
    with hostile_files.Folder.open(call.scratch) as files:
        judge = Judge(1e-5, 1e-5, "cpu", call.ref_dir, files, 1)
        result = CallResult(call.trial, 0)
        judge.judge_call(result, [{"rank": 0, "ok": True, "input_fingerprint": [1]}], {0: call.paths(0)},
                         {0: {"fingerprint": [1]}})
    assert result.failure is not None and result.failure["verdict"] == failures.RUNTIME_ERROR
    assert integrity.TAMPERING in result.flags


def test_an_output_that_changed_after_the_call_returned_is_lazy(tmp_path: Path):
    call = Call(tmp_path, Trial(0, "normal"), [torch.ones(2)])
    transport.write_tree(Path(call.paths(0)["output"] + ".later"), torch.ones(2))
    with hostile_files.Folder.open(call.scratch) as files:
        judge = Judge(1e-5, 1e-5, "cpu", call.ref_dir, files, 1)
        result = CallResult(call.trial, 0)
        reply = call.answer(0, torch.zeros(2), changed_after_return=True)
        judge.judge_call(result, [reply], {0: call.paths(0)}, {0: {"fingerprint": [1]}})
    assert result.failure is not None and "only the later value is right" in result.failure["message"]
    assert integrity.LAZY_OUTPUT in result.flags


def failed(trial: Trial, call: int, verdict: str = failures.OUTPUT_MISMATCH, *flags: str) -> CallResult:
    return CallResult(trial, call, {"verdict": verdict, "message": "wrong", "trial": trial.id, "call": call},
                      set(flags))


def test_the_first_failing_ordinary_trial_decides_before_stress_and_probe():
    stress = Trial(integrity.STRESS_TRIAL_BASE, "stress", 1)
    results = [failed(stress, 0), failed(Trial(3, "normal"), 2), failed(Trial(1, "normal"), 1),
               CallResult(Trial(0, "normal"), 3)]
    failure, _, _ = decide(results, {})
    assert failure is not None and failure["trial"] == 1


def test_a_failure_only_with_one_rank_late_is_a_race():
    stress = Trial(integrity.STRESS_TRIAL_BASE, "stress", 1)
    failure, flags, _ = decide([CallResult(Trial(0, "normal"), 0), failed(stress, 1)], {})
    assert failure is not None and integrity.RACE in flags and "a race" in failure["message"]


@pytest.mark.parametrize("why_not", [None, "the reference is not exact on probe inputs"])
def test_a_failure_only_on_the_probe_is_reduced_precision_unless_the_probe_cannot_judge(why_not: str | None):
    probe = Trial(integrity.PROBE_TRIAL, "probe")
    failure, flags, notes = decide([CallResult(Trial(0, "normal"), 0), failed(probe, 1)], {0: why_not})
    if why_not is None:
        assert failure is not None and integrity.REDUCED_PRECISION in flags
    else:
        assert failure is None and integrity.REDUCED_PRECISION not in flags
        assert notes["precision_probe"] == f"skipped: {why_not}"


def test_the_worst_errors_are_the_largest_over_every_call():
    a, b = CallResult(Trial(0, "normal"), 0), CallResult(Trial(1, "normal"), 1)
    a.worst_abs, a.worst_rel, b.worst_abs, b.worst_rel = 0.1, 0.5, 0.3, 0.2
    assert worst_errors([a, b]) == (0.3, 0.5) and worst_errors([]) == (0.0, 0.0)
