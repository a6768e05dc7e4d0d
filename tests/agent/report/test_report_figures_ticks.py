"""The speedup strip's log axis keeps its minor labels apart (issue 46: a report of 2,000 samples over 0.2-4x had
the eight minor labels of each decade written over each other)."""

from __future__ import annotations

from types import SimpleNamespace

from agent.report.figures import _minor_speedup_label


def _axis(low: float, high: float) -> SimpleNamespace:
    return SimpleNamespace(get_ylim=lambda: (low, high))


def test_over_more_than_a_decade_only_the_2x_and_5x_minor_ticks_are_labelled():
    wide = _axis(0.2, 4.0)
    assert [_minor_speedup_label(wide, v) for v in (0.3, 0.5, 0.7, 2.0, 3.0)] == ["", "0.5x", "", "2x", ""]


def test_within_a_decade_every_minor_tick_is_labelled():
    narrow = _axis(0.8, 1.3)
    assert [_minor_speedup_label(narrow, v) for v in (0.8, 0.9, 1.2)] == ["0.8x", "0.9x", "1.2x"]
