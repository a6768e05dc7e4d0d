"""In-process checks of a problem's inputs: random, reproducible, different per rank and per trial.

These run without any process group (make_inputs only), so the whole suite is checked in seconds.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.common.compare import same_values
from harness.common.seeds import rank_seed
from harness.problems.problem import Problem


def draw_inputs(problem: Problem, shape_name: str, world_size: int, seed: int, trial: int, rank: int,
                device: str = "cpu") -> tuple[Any, ...]:
    gen = torch.Generator(device=device)
    gen.manual_seed(rank_seed(seed, trial, rank))
    return tuple(problem.make_inputs(problem.shape(shape_name), rank, world_size, gen, torch.device(device)))


def _tensors(inputs: tuple[Any, ...]) -> list[tuple[int, torch.Tensor]]:
    out: list[tuple[int, torch.Tensor]] = []
    for i, value in enumerate(inputs):
        if isinstance(value, torch.Tensor):
            out.append((i, value))
        elif isinstance(value, (list, tuple)):
            out.extend((i, v) for v in value if isinstance(v, torch.Tensor))
    return out


def _is_constant(t: torch.Tensor) -> bool:
    if t.numel() < 2:
        return False
    flat = t.detach().reshape(-1)
    if t.dtype.itemsize == 1 and not t.dtype.is_floating_point and t.dtype != torch.bool:
        pass
    elif t.dtype.is_floating_point and t.dtype.itemsize == 1:  # fp8: compare raw bytes
        flat = flat.view(torch.uint8)
    return bool((flat == flat[0]).all())


def input_issues(problem: Problem, shape_name: str = "small", world_size: int | None = None,
                   seed: int = 1234) -> list[str]:
    """What is wrong with the problem's inputs; an empty list means nothing."""
    w = world_size or problem.world_sizes[0]
    issues: list[str] = []
    t0 = [draw_inputs(problem, shape_name, w, seed, 0, r) for r in range(w)]
    t1 = [draw_inputs(problem, shape_name, w, seed, 1, r) for r in range(w)]
    again = draw_inputs(problem, shape_name, w, seed, 0, 0)
    if not same_values(t0[0], again):
        issues.append("make_inputs is not reproducible from the generator's seed")
    if not _tensors(t0[0]):
        issues.append("make_inputs returns no tensor")
    if w > 1 and all(same_values(t0[0], t0[r]) for r in range(1, w)):
        issues.append("every rank gets identical inputs")
    for r in range(w):
        for (i, a), (_, b) in zip(_tensors(t0[r]), _tensors(t1[r])):
            if a.dtype.is_floating_point and _is_constant(a):
                issues.append(f"input #{i} on rank {r} is a constant tensor")
            if a.numel() > 1 and same_values(a, b):
                issues.append(f"input #{i} on rank {r} is identical across trials")
    return sorted(set(issues))


def metadata_issues(problem: Problem) -> list[str]:
    issues: list[str] = []
    for key in ("codebase", "path", "symbol"):
        if not problem.source.get(key):
            issues.append(f"source lacks {key}")
    for shape in ("default", "small"):
        if shape not in problem.shapes:
            issues.append(f"no {shape!r} shape")
        elif not problem.held_out_shapes(shape):
            issues.append(f"no held-out shape for {shape!r} (PROBLEM['held_out'])")
    if problem.oracle is None:
        issues.append("no oracle")
    return issues


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(describe(v) for v in value) + "]"
    return type(value).__name__
