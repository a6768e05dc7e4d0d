"""The offline search benchmark across machines: busy taken over every segment, and no resume of nothing."""

from __future__ import annotations

import sys
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
    assert "no search to continue" in capsys.readouterr().err
