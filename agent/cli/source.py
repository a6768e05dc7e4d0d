"""Which problems a command works on: `--source` (None is this suite; "pkb:PATH" a ParallelKernelBench
checkout), selection within it, and the checks of a problem's shape and world size.

Selection follows harness.problems.registry (names, globs, categories); for a checkout's problems a plain number
also selects by ParallelKernelBench's problem id, so `--problem 12` finds reference/12_<name>.py.

Imported by the command handlers only: loading problems imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from agent.cli import emulation
from agent.cli.common import CliError
from harness.problems.parallelkernelbench import checkout
from harness.problems.problem import MalformedProblem, Problem
from harness.problems.registry import UnknownProblem, get, load_suite, select

PKB_PREFIX = checkout.SPEC_PREFIX  # `--source pkb:PATH` (agent.cli.options defines the option)


def suite() -> list[Problem]:
    try:
        return load_suite()
    except MalformedProblem as err:
        raise CliError(f"malformed problem: {err}") from None


def one_problem(name: str) -> Problem:
    """One problem of this suite by name."""
    try:
        return get(suite(), name)
    except UnknownProblem as err:
        raise CliError(str(err)) from None


def resolve_source(text: str | None, precision: str | None = None) -> list[Problem]:
    """The problems of a source: None (or "") for this suite, "pkb:PATH" for a ParallelKernelBench checkout, whose
    inputs and tolerances follow `precision` (checkout.PRECISIONS; None: PKB's default, bf16). This suite's
    problems keep their own dtypes."""
    if not text:
        return suite()
    if not text.startswith(PKB_PREFIX) or not text[len(PKB_PREFIX):].strip():
        raise CliError(f"--source takes pkb:PATH (a ParallelKernelBench checkout), got {text!r}")
    try:
        return checkout.suite(Path(text[len(PKB_PREFIX):].strip()).expanduser(),
                              precision or checkout.DEFAULT_PRECISION)
    except checkout.CheckoutError as err:
        raise CliError(str(err)) from None


def _by_id(problems: Sequence[Problem], selector: str) -> str:
    """A numeric selector becomes the name of the checkout's problem with that id (unchanged otherwise)."""
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
    """One problem of a source by name (or ParallelKernelBench id)."""
    try:
        return get(problems, _by_id(problems, name.strip()))
    except UnknownProblem as err:
        raise CliError(str(err)) from None


def check_shape(problem: Problem, shape: str) -> None:
    if shape not in problem.shapes:
        raise CliError(f"problem {problem.name} has no shape {shape!r}; it has: {', '.join(problem.shapes)}")


def check_world_size(problem: Problem, world_size: int) -> None:
    if not problem.supports(world_size):
        sizes = ", ".join(map(str, problem.world_sizes))
        raise CliError(f"problem {problem.name} does not support world size {world_size}; it supports {sizes}")


def check_target(problem: Problem, shape: str | None, world_size: int, device: str,
                 ranks_per_gpu: int | None = None) -> str:
    """What `pkb roofline` and `pkb profile` run: the shape to use; CliError when the problem, shape, world size
    or device does not fit. `ranks_per_gpu`: the command's `--ranks-per-gpu` (None: it has none); above 1 the
    ranks share GPUs (agent.cli.emulation's check)."""
    shape = shape or ("default" if device == "cuda" else "small")
    check_shape(problem, shape)
    check_world_size(problem, world_size)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise CliError("--device cuda: no CUDA device is visible on this machine")
        if ranks_per_gpu is not None and ranks_per_gpu > 1:
            emulation.check(device, world_size, ranks_per_gpu, torch.cuda.device_count())
        elif torch.cuda.device_count() < world_size:
            share = " (or share them: --ranks-per-gpu)" if ranks_per_gpu is not None else ""
            raise CliError(f"--world-size {world_size} needs {world_size} GPUs; {torch.cuda.device_count()} visible"
                           f"{share}")
    return shape
