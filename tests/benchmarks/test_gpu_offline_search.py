"""The offline search benchmark across machines: busy taken over every segment, no resume of nothing, and the
figures of a search whose device call ended before it did, from the folder the call brought back."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gpu_offline_search as search


def test_utilization_is_weighted_by_each_segments_samples() -> None:
    segments: list[dict[str, Any]] = [{"sm_busy": 0.9, "sm_samples": 300}, {"sm_busy": 0.5, "sm_samples": 100},
                {"sm_busy": None, "sm_samples": 0}]
    assert search.sm_over(segments) == pytest.approx((0.9 * 300 + 0.5 * 100) / 400)
    assert search.sm_over([{"sm_busy": None, "sm_samples": 0}]) is None


def test_resume_without_a_search_to_continue_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["gpu_offline_search.py", "--out", str(tmp_path), "--resume"])
    with pytest.raises(SystemExit) as stopped:
        search.main()
    assert stopped.value.code == 2
    assert "no search in" in capsys.readouterr().err


RECORDED = Path(__file__).resolve().parents[2] / "docs/measurements/2026-12-03-one-h200/search-alone.tgz"


def test_a_search_cut_off_by_its_call_is_reported_from_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The H200 search of 2026-12-03: its call ended while it rescored, so only the folder came back."""
    with tarfile.open(RECORDED) as archive:
        archive.extractall(tmp_path, filter="data")
    monkeypatch.setattr(sys, "argv", ["gpu_offline_search.py", "--out", str(tmp_path), "--report-only",
                                      "--minutes", "99"])
    assert search.main() == 0
    text = capsys.readouterr().out
    record = (tmp_path / "search.md").read_text()
    assert text.strip() == record.strip()
    # The search's own budget and layout, not the options of this command: both ranks held one GPU.
    assert "budget 8.5 min" in record and "on one GPU (emulated)" in record
    assert "| candidates | 14 (compile_error 1, correct 13, not judged 1) |" in record
    assert "| GPU held by an evaluation | 91% |" in record
