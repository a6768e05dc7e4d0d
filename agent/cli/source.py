"""`--source`: which problems a command works on. None is this suite; "pkb:PATH" a PKB checkout.

Selection within a source follows harness.registry (names, globs, categories); for PKB problems a
plain number also selects by PKB's problem id, so `--problem 12` finds reference/12_<name>.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agent.cli_common import CliError, suite
from harness.parallelkernelbench import checkout
from harness.problem import Problem
from harness.registry import UnknownProblem, get, select

PKB_PREFIX = "pkb:"


def resolve_source(text: str | None) -> list[Problem]:
    """The problems of a source: None (or "") for this suite, "pkb:PATH" for a PKB checkout."""
    if not text:
        return suite()
    if not text.startswith(PKB_PREFIX) or not text[len(PKB_PREFIX):].strip():
        raise CliError(f"--source takes pkb:PATH (a ParallelKernelBench checkout), got {text!r}")
    try:
        return checkout.suite(Path(text[len(PKB_PREFIX):].strip()).expanduser())
    except checkout.CheckoutError as err:
        raise CliError(str(err)) from None


def _by_id(problems: Sequence[Problem], selector: str) -> str:
    """A numeric selector becomes the name of the PKB problem with that id (unchanged otherwise)."""
    if not selector.isdigit():
        return selector
    for p in problems:
        if checkout.problem_id(p) == int(selector):
            return p.name
    return selector


def select_in(problems: Sequence[Problem], selectors: Sequence[str] | None) -> list[Problem]:
    """Problems of a source matching any selector; no selector selects all. Unknown: CliError."""
    parts = [s.strip() for s in (selectors or []) for s in s.split(",") if s.strip()]
    try:
        return select(problems, [_by_id(problems, s) for s in parts])
    except UnknownProblem as err:
        raise CliError(str(err)) from None


def one_in(problems: Sequence[Problem], name: str) -> Problem:
    """One problem of a source by name (or PKB id)."""
    try:
        return get(problems, _by_id(problems, name.strip()))
    except UnknownProblem as err:
        raise CliError(str(err)) from None
