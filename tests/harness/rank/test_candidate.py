"""harness.rank.candidate: loading a candidate file in a rank, and the failure class of what goes wrong."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.common import failures
from harness.rank.candidate import (
    CandidateError,
    check_signature,
    classify_load_error,
    load_candidate,
    required_positional,
    trimmed_traceback,
)


def write(tmp_path: Path, text: str, name: str = "cand.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_file_loads_and_its_solution_is_callable(tmp_path: Path):
    module = load_candidate(write(tmp_path, "def solution(x, y):\n    return x + y\n"), 2)
    assert module.solution(1, 2) == 3


@pytest.mark.parametrize(("text", "verdict", "says"), [
    ("def solution(x):\n    return x +\n", failures.COMPILE_ERROR, "SyntaxError"),
    ("import no_such_module_here\ndef solution(x):\n    return x\n", failures.API_ERROR, "no_such_module_here"),
    ("def solve(x):\n    return x\n", failures.API_ERROR, "defines no `solution`"),
    ("solution = 3\n", failures.API_ERROR, "not callable"),
    ("def solution(x):\n    return x\n", failures.API_ERROR, "cannot be called with the reference's 2"),
    ("raise SystemExit(3)\n", failures.RUNTIME_ERROR, "SystemExit"),  # a hostile exit is its failure too
    ("raise ValueError('at import')\n", failures.RUNTIME_ERROR, "at import"),
])
def test_what_goes_wrong_has_its_failure_class(tmp_path: Path, text: str, verdict: str, says: str):
    with pytest.raises(CandidateError) as caught:
        load_candidate(write(tmp_path, text), 2)
    assert caught.value.verdict == verdict and says in caught.value.message + caught.value.evidence


def test_build_failures_read_as_compile_errors():
    assert classify_load_error(subprocess.CalledProcessError(1, ["ninja"])) == failures.COMPILE_ERROR
    assert classify_load_error(RuntimeError("Error building extension 'x'")) == failures.COMPILE_ERROR
    assert classify_load_error(AttributeError("no attribute 'fast'")) == failures.API_ERROR
    assert classify_load_error(ZeroDivisionError()) == failures.RUNTIME_ERROR


def test_the_signature_is_read_from_the_references_required_positionals():
    def reference(x, group, scale=1.0, *, out=None):  # noqa: ANN001, ANN202 - a stand-in of any signature
        return x

    assert required_positional(reference) == ["x", "group"]
    check_signature(lambda *args: None, 2)  # takes anything
    check_signature(lambda a, b, c=0: None, 2)
    with pytest.raises(CandidateError):
        check_signature(lambda a: None, 2)
    check_signature(max, 5)  # a builtin without a readable signature: nothing to check statically


def test_a_traceback_keeps_its_end():
    try:
        raise ValueError("\n".join(f"detail {i}" for i in range(100)) + "\nthe end")
    except ValueError as exc:
        text = trimmed_traceback(exc)
    assert text.startswith("... (traceback trimmed)") and text.endswith("the end")
    assert "detail 99" in text and "detail 10\n" not in text
