"""The replay benchmark across machines: a replay resumed on another machine (its run folder carried) reports
its wall over all its segments, and refuses to resume what is not there."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gpu_pkb_replay as replay


def test_the_table_says_the_wall_is_summed_over_segments() -> None:
    args = argparse.Namespace(set=Path("solutions_x"), budget_s=540.0, concurrency=14, evaluations_per_gpu=4,
                              device="cuda")
    rows = [{"file": "1_a.py", "problem": "1_a", "status": "finished", "verdict": "correct", "seconds": 10.0}]
    assert "Command wall: 1450 s over 3 segments" in replay.markdown(rows, 1450.0, True, args, segments=3)
    assert "Command wall: 900 s (budget 540 s, finished)" in replay.markdown(rows, 900.0, True, args)


def test_resume_without_a_replay_to_continue_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "1_a.py").write_text("")
    monkeypatch.setattr(sys, "argv", ["gpu_pkb_replay.py", "--checkout", str(tmp_path), "--set",
                                      str(tmp_path / "set"), "--out", str(tmp_path / "out"), "--resume"])
    with pytest.raises(SystemExit) as stopped:
        replay.main()
    assert stopped.value.code == 2
    assert "no replay to continue" in capsys.readouterr().err


def test_each_file_shows_how_long_it_held_the_gpu_and_how_long_its_check_took() -> None:
    """The long holds of the whole-set runs were checks (77_magi1's comparisons): the table shows both."""
    args = argparse.Namespace(set=Path("solutions_x"), budget_s=540.0, concurrency=14, evaluations_per_gpu=4,
                              device="cuda")
    magi = {"file": "78_magi.py", "problem": "77_magi", "status": "finished", "verdict": "output_mismatch",
            "seconds": 554.7, "compile_s": 127.6, "held_s": 243.000656, "check_s": 101.04, "reason": "bad"}
    vae = {"file": "79_vae.py", "problem": "78_vae", "status": "running", "verdict": None}
    rows: list[dict[str, Any]] = [magi, vae]
    table = replay.markdown(rows, 900.0, False, args)
    assert "| 78_magi.py |  | 77_magi | output_mismatch | 554.7 | 127.6 |  | 243.0 | 101.0 | bad |" in table
    assert "| 79_vae.py |  | 78_vae | running |  |  |  |  |  | running |" in table


def test_multicast_files_are_marked_and_their_verdicts_counted_and_only_gpt55_gets_the_old_column() -> None:
    """Issue 48: every multicast file's verdict is listed; the 2026-12-01 column is GPT-5.5's set's alone."""
    rows: list[dict[str, Any]] = [
        {"file": "1_ar.py", "problem": "1_allreduce", "status": "finished", "verdict": "correct", "multicast": True},
        {"file": "4_r.py", "problem": "4_reduce", "status": "finished", "verdict": "output_mismatch",
         "multicast": True},
        {"file": "5_s.py", "problem": "5_scatter", "status": "finished", "verdict": "correct", "multicast": False}]
    for name, old_column in (("solutions_cuda_bf16_h100_8_anthropic_claude-opus-4-7", False),
                             ("solutions_cuda_bf16_h100_8_openai_gpt-5.5", True)):
        args = argparse.Namespace(set=Path(name), budget_s=540.0, concurrency=14, evaluations_per_gpu=4,
                                  device="cuda")
        table = replay.markdown(rows, 900.0, True, args)
        assert "| multicast files (rewritten to unicast) | 2: correct: 1, output_mismatch: 1 |" in table
        assert "| 1_ar.py | yes | 1_allreduce | correct |" in table
        assert "| 5_s.py |  | 5_scatter | correct |" in table
        assert ("2026-12-01" in table) is old_column
