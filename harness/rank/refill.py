"""Fresh inputs for every timed call, drawn on the rank's device by the problem's own make_inputs. Rank
side (reference pool and candidate ranks alike); torch + stdlib.

A timed call that sees the same tensor objects, or the same contents, as an earlier call can be answered
from memory (by pointer, or keyed on a few sampled elements). So before every timed iteration, outside
the timed window and before the L2 flush, the rank draws that call's inputs anew and copies them into the
buffers the call will get (in place: same objects, same addresses, new contents); where a draw's structure
differs from the buffers' (problems whose sizes are random per trial) the call gets the draw itself.

What a rank is handed for a call is a recipe (harness.common.seeds.fill_recipe): the trial seed its problem
derives shared metadata from, the same on every rank, and a private seed of its own, independent of every
peer's. `SplitGenerator` reports the trial seed as `initial_seed() - rank` (the convention problems use
for metadata every rank must agree on: problems/README.md) while its stream comes from the private seed.
So a rank can draw its own inputs but not a peer's: a peer's private seed cannot be derived from anything
the rank holds. The reference pool draws the judged calls' inputs from the same recipes, so the judge has
their expected outputs; the candidate's process never sees the run's seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from harness.common import integrity
from harness.rank import pristine

if TYPE_CHECKING:
    from harness.problems.problem import Problem


class SplitGenerator(torch.Generator):
    """A generator whose stream is seeded with `private` and whose initial_seed() answers `reported`."""

    def __new__(cls, device: torch.device, private: int, reported: int) -> SplitGenerator:
        # torch.Generator takes its device in __new__ (its stub declares only __init__)
        return super().__new__(cls, device=device)  # type: ignore[call-arg]

    def __init__(self, device: torch.device, private: int, reported: int) -> None:
        self.manual_seed(private)
        self._reported = reported

    def initial_seed(self) -> int:
        return self._reported


Draw = Callable[[dict[str, Any]], tuple[Any, ...]]


def draw(make_inputs: Callable[..., Any], dtype: torch.dtype, shape: dict[str, Any], rank: int, world_size: int,
         recipe: dict[str, Any], device: torch.device) -> tuple[Any, ...]:
    """This rank's inputs for one recipe (with the precision probe's values where the recipe has a probe seed).
    Runs with torch's modes off, so what a candidate left active in the process cannot change the draw."""
    with pristine.quiet():
        gen = SplitGenerator(device, int(recipe["private"]), int(recipe["shared"]) + rank)
        inputs = tuple(make_inputs(shape, rank, world_size, gen, device))
        if recipe.get("probe") is not None:
            probe = torch.Generator(device=device)
            probe.manual_seed(int(recipe["probe"]))
            inputs = integrity.precision_probe_inputs(inputs, dtype, probe)
    return inputs


def drawer(problem: Problem, shape: dict[str, Any], rank: int, world_size: int, device: torch.device) -> Draw:
    """`draw` for one problem, shape and rank, with the problem's make_inputs bound now (in a candidate's
    rank: before the candidate is imported)."""
    make_inputs, dtype = problem.make_inputs, problem.dtype

    def draw_one(recipe: dict[str, Any]) -> tuple[Any, ...]:
        return draw(make_inputs, dtype, shape, rank, world_size, recipe, device)

    return draw_one


def not_refillable(value: Any, where: str = "inputs") -> str | None:
    """Why inputs like `value` cannot be drawn again in a rank (process groups, modules: what the rank could
    not make for itself from a recipe), or None."""
    if isinstance(value, torch.Tensor):
        return None if type(value) is torch.Tensor else f"{where} is a {type(value).__name__}"
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            issue = not_refillable(item, f"{where}[{i}]")
            if issue:
                return issue
        return None
    if type(value) is dict:
        for key, item in value.items():
            issue = not_refillable(item, f"{where}[{key!r}]")
            if issue:
                return issue
        return None
    if value is None or type(value) in (bool, int, float, str):
        return None
    return f"{where} holds a {type(value).__module__}.{type(value).__name__}"


def _pairs(old: Any, new: Any, out: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Collect (buffer, fresh) tensor pairs; False as soon as the two structures differ."""
    if isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor):
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return False
        if pristine.layout_of(old) is not pristine.strided or pristine.layout_of(new) is not pristine.strided:
            return False
        if (pristine.shape_of(old) != pristine.shape_of(new) or pristine.dtype_of(old) != pristine.dtype_of(new)
                or pristine.device_of(old) != pristine.device_of(new)):
            return False
        out.append((old, new))
        return True
    if type(old) is not type(new):
        return False
    if isinstance(old, (list, tuple)):
        return len(old) == len(new) and all(_pairs(a, b, out) for a, b in zip(old, new))
    if isinstance(old, dict):
        return list(old) == list(new) and all(_pairs(old[k], new[k], out) for k in old)
    return bool(old == new)


def refill(buffers: tuple[Any, ...], fresh: tuple[Any, ...]) -> tuple[tuple[Any, ...], bool]:
    """Copy `fresh` into `buffers` in place where their structures match (same containers, same scalars,
    tensors of the same shape, dtype and device); returns (the inputs the call gets, whether in place)."""
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    if not _pairs(buffers, fresh, pairs):
        return fresh, False
    with pristine.quiet():
        for old, new in pairs:
            pristine.copy_(old, new)
    return buffers, True
