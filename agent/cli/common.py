"""Helpers shared by the CLI commands: errors, problem selection, world-size parsing, the console."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from harness.problem import MalformedProblem, Problem
from harness.registry import UnknownProblem, get, load_suite, select

console = Console()
err_console = Console(stderr=True)


class CliError(Exception):
    """A user mistake: printed as one line, exit code 2."""


def suite() -> list[Problem]:
    try:
        return load_suite()
    except MalformedProblem as err:
        raise CliError(f"malformed problem: {err}") from None


def selected(selectors: Sequence[str] | None) -> list[Problem]:
    try:
        return select(suite(), selectors)
    except UnknownProblem as err:
        raise CliError(str(err)) from None


def one_problem(name: str) -> Problem:
    try:
        return get(suite(), name)
    except UnknownProblem as err:
        raise CliError(str(err)) from None


def world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise CliError(f"--world-size takes integers separated by commas, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise CliError(f"--world-size must be positive integers, got {text!r}")
    return sizes


def existing_file(path: str, what: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise CliError(f"{what} {path} does not exist")
    if not p.is_file():
        raise CliError(f"{what} {path} is not a file")
    return p


def check_shape(problem: Problem, shape: str) -> None:
    if shape not in problem.shapes:
        raise CliError(f"problem {problem.name} has no shape {shape!r}; it has: {', '.join(problem.shapes)}")


def check_world_size(problem: Problem, world_size: int) -> None:
    if not problem.supports(world_size):
        sizes = ", ".join(map(str, problem.world_sizes))
        raise CliError(f"problem {problem.name} does not support world size {world_size}; it supports {sizes}")


def add_target_arguments(p: argparse.ArgumentParser, solution_help: str) -> None:
    """What `pkb roofline` and `pkb profile` look at: a problem, optionally a candidate, where and how big."""
    p.add_argument("--problem", required=True, help="problem name")
    p.add_argument("--solution", default=None, help=solution_help)
    p.add_argument("--shape", default=None, help="shape name (default: 'small' on cpu, 'default' on cuda)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--seed", type=int, default=0)
