"""Finding problems: discover the suite under problems/<category>/, select by name, glob or category, and load
one by its loader spec (what a rank worker receives)."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

from harness.common.paths import REPO_ROOT
from harness.problems.parallelkernelbench import checkout
from harness.problems.problem import CATEGORIES, MalformedProblem, Problem, load_problem

SUITE_ROOT = REPO_ROOT / "problems"


class UnknownProblem(LookupError):
    """A selector that matches nothing; the message suggests close names."""


def problem_files(root: Path = SUITE_ROOT) -> list[Path]:
    """Problem modules: problems/<category>/<name>.py, skipping private files and expert solutions."""
    files: list[Path] = []
    for category_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        files.extend(sorted(f for f in category_dir.glob("*.py") if not f.name.startswith("_")))
    return files


@lru_cache(maxsize=4)
def _load_suite(root: Path) -> tuple[Problem, ...]:
    problems = [load_problem(f) for f in problem_files(root)]
    seen: dict[str, Path] = {}
    for p in problems:
        if p.name in seen:
            raise MalformedProblem(f"{p.path}: name {p.name!r} is already used by {seen[p.name]}")
        seen[p.name] = p.path
    return tuple(problems)


def load_suite(root: Path = SUITE_ROOT) -> list[Problem]:
    """Every problem of the suite, in category then name order. Raises MalformedProblem on a bad file."""
    return list(_load_suite(root.resolve()))


def discover(root: Path = SUITE_ROOT) -> tuple[list[Problem], list[MalformedProblem]]:
    """Like load_suite, but keeps going past malformed files and returns them as errors."""
    problems: list[Problem] = []
    errors: list[MalformedProblem] = []
    for f in problem_files(root):
        try:
            problems.append(load_problem(f))
        except MalformedProblem as err:
            errors.append(err)
    return problems, errors


def _matches(problem: Problem, selector: str) -> bool:
    if selector.startswith("category:"):
        return problem.category == selector.split(":", 1)[1]
    if selector in CATEGORIES:
        return problem.category == selector
    return fnmatch.fnmatchcase(problem.name, selector)


def select(problems: Sequence[Problem], selectors: Iterable[str] | None) -> list[Problem]:
    """Problems matching any selector (name, glob such as 'all_*', a category, or 'category:NAME').

    No selector selects everything. A selector that matches nothing raises UnknownProblem.
    """
    selectors = [s.strip() for s in (selectors or []) for s in s.split(",") if s.strip()]
    if not selectors:
        return list(problems)
    chosen: list[Problem] = []
    for selector in selectors:
        hits = [p for p in problems if _matches(p, selector)]
        if not hits:
            raise UnknownProblem(_unknown_message(selector, problems))
        chosen.extend(p for p in hits if p not in chosen)
    return chosen


def get(problems: Sequence[Problem], name: str) -> Problem:
    for p in problems:
        if p.name == name:
            return p
    raise UnknownProblem(_unknown_message(name, problems))


def _unknown_message(selector: str, problems: Sequence[Problem]) -> str:
    names = [p.name for p in problems] + list(CATEGORIES)
    close = difflib.get_close_matches(selector, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `pkb problems list` shows them all"
    return f"no problem or category matches {selector!r}{hint}"


def load_problem_spec(spec: str) -> Problem:
    """Load a problem from its loader spec (Problem.loader_spec): a file path, or "pkb:..." for a
    ParallelKernelBench checkout's problem."""
    if spec.startswith(checkout.SPEC_PREFIX):
        return checkout.load_spec(spec)
    return load_problem(spec)
