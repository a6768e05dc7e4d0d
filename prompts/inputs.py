"""The inputs' layout a task prompt shows: one line per positional input of rank 0."""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any


def _describe(value: Any, depth: int = 0) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        dims = ", ".join(str(d) for d in value.shape)
        return f"Tensor[{str(value.dtype).replace('torch.', '')}]({dims})"
    if isinstance(value, (tuple, list)) and depth < 2:
        inner = [_describe(v, depth + 1) for v in value[:6]]
        more = f", ... ({len(value)} items)" if len(value) > 6 else ""
        bracket = "()" if isinstance(value, tuple) else "[]"
        return bracket[0] + ", ".join(inner) + more + bracket[1]
    if isinstance(value, (int, float, bool, str)) or value is None:
        return repr(value)[:80]
    return type(value).__name__


@lru_cache(maxsize=64)
def input_lines(spec: str, shape_name: str, world_size: int) -> str:
    """One line per positional input of rank 0: name, type, dtype and dims.

    Built under FakeTensorMode (no memory, no time); problems whose inputs depend on data (routing counts)
    fall back to a real call on the CPU. Both are the harness's own make_inputs at this shape."""
    # Deferred: loading a problem imports torch; the prompts are read (hashed, listed) without it.
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from harness.problems.registry import load_problem_spec

    problem = load_problem_spec(spec)
    shape = problem.shape(shape_name)

    def make() -> tuple:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(1)
        return tuple(problem.make_inputs(shape, 0, world_size, generator, torch.device("cpu")))

    try:
        with FakeTensorMode():
            inputs = make()
            described = [_describe(v) for v in inputs]
    except Exception:
        try:
            described = [_describe(v) for v in make()]
        except Exception:
            return "  (not available)"
    names = list(inspect.signature(problem.solution).parameters)
    names += [f"arg{i}" for i in range(len(names), len(described))]
    return "\n".join(f"  - `{n}`: {d}" for n, d in zip(names, described))
