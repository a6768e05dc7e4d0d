"""Shared by the registry and contract-check tests: a valid problem file, and writing one into a suite folder."""

from __future__ import annotations

import textwrap
from pathlib import Path

GOOD = textwrap.dedent('''
    import torch
    PROBLEM = {
        "name": "toy", "category": "collective",
        "source": {"codebase": "x", "path": "y.py", "symbol": "z"},
        "summary": "A toy.", "dtype": "float32",
        "shapes": {"default": {"n": 8}, "small": {"n": 4}},
        "world_sizes": [2], "tolerance": {"atol": 0.0, "rtol": 0.0},
    }
    def make_inputs(shape, rank, world_size, generator, device):
        return (torch.randn(shape["n"], generator=generator, device=device),)
    def solution(x):
        return x
    def oracle(shape, world_size, inputs_by_rank):
        return [i[0] for i in inputs_by_rank]
''')


def write(root: Path, text: str, name: str = "toy", category: str = "collective") -> Path:
    path = root / category / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
