"""Loading a candidate solution file and classifying what goes wrong. Worker-safe."""

from __future__ import annotations

import inspect
import subprocess
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.common import failures
from harness.problems.problem import import_file, module_name_for

MAX_TRACEBACK_LINES = 40
MAX_TRACEBACK_CHARS = 4000

# Signs that an exception came from building native code (load_inline, NVRTC), not from running it.
_COMPILE_MARKERS = ("Error building extension", "nvcc", "NVRTC", "nvrtc", "ptxas", "compilation terminated")


class CandidateError(Exception):
    """A candidate failed in a way the model is charged for; carries its failure class."""

    def __init__(self, verdict: str, message: str, evidence: str = "") -> None:
        super().__init__(message)
        self.verdict = verdict
        self.message = message
        self.evidence = evidence


def trimmed_traceback(exc: BaseException) -> str:
    """The end of a traceback, where the candidate's own frames and the error are."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    lines = text.rstrip().splitlines()
    if len(lines) > MAX_TRACEBACK_LINES:
        lines = ["... (traceback trimmed)"] + lines[-MAX_TRACEBACK_LINES:]
    text = "\n".join(lines)
    return text[-MAX_TRACEBACK_CHARS:]


def classify_load_error(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return failures.COMPILE_ERROR
    if isinstance(exc, subprocess.CalledProcessError):
        return failures.COMPILE_ERROR
    text = f"{type(exc).__name__}: {exc}"
    if any(marker in text for marker in _COMPILE_MARKERS):
        return failures.COMPILE_ERROR
    if isinstance(exc, (ImportError, AttributeError, NameError)):
        return failures.API_ERROR
    return failures.RUNTIME_ERROR


def load_candidate(path: Path, required_positional: int) -> ModuleType:
    """Import the candidate file and check that its `solution` can take the reference's arguments (the
    reference takes `required_positional` positional arguments without defaults)."""
    try:
        module = import_file(path, module_name_for(path, "pkb_candidate"))
    except BaseException as exc:  # SystemExit from a hostile candidate is a failure too
        verdict = classify_load_error(exc)
        raise CandidateError(verdict, f"import failed: {type(exc).__name__}: {exc}", trimmed_traceback(exc)) from exc
    solution = getattr(module, "solution", None)
    if solution is None:
        raise CandidateError(failures.API_ERROR, f"{path.name} defines no `solution`")
    if not callable(solution):
        raise CandidateError(failures.API_ERROR, f"`solution` in {path.name} is not callable")
    check_signature(solution, required_positional)
    return module


def required_positional(reference: Any) -> list[str]:
    """Names of the reference's positional parameters without defaults: what every call passes."""
    return [p.name for p in inspect.signature(reference).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]


def check_signature(candidate: Any, required: int) -> None:
    try:
        sig = inspect.signature(candidate)
    except (TypeError, ValueError):
        return  # builtins and C extensions: nothing to check statically
    try:
        sig.bind(*range(required))
    except TypeError as exc:
        raise CandidateError(
            failures.API_ERROR,
            f"solution{sig} cannot be called with the reference's {required} positional argument(s): {exc}",
        ) from exc
