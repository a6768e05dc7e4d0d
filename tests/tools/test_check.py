"""tools.check's hints: one for every verdict the harness gives but `correct` (harness.common.failures lists them)."""

from __future__ import annotations

from harness.common import failures
from tools.check import HINTS


def test_every_failure_verdict_has_a_hint_and_nothing_else_does():
    assert set(HINTS) == set(failures.VERDICTS) - {failures.CORRECT}
