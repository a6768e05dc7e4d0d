"""What the harness does to a ParallelKernelBench problem's inputs, examined in the harness's own process.

Parent side only: the inputs are drawn on the CPU (in a child with a fake process group where the
checkout's generator builds groups: .input_probe), and the record says which inputs are re-drawn per trial
and which are left constant, on which ranks, and why (.inputs decides).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch

from harness.common.paths import REPO_ROOT
from harness.common.seeds import rank_seed
from harness.problems.parallelkernelbench.checkout import ReferenceModule, load_spec
from harness.problems.parallelkernelbench.inputs import InputReport, leaves, merge_rows
from harness.problems.problem import Problem

MAX_PROBE_BYTES = 1 << 30  # a rank's inputs larger than this are not drawn in the harness's own process
PROBE_TIMEOUT_S = 300.0


def _tensor_bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for _, t in leaves(value)
               if isinstance(t, torch.Tensor) and t.layout == torch.strided)


def draw_plans(problem: Problem, shape: str, world_size: int, seed: int = 0, max_bytes: int = MAX_PROBE_BYTES,
               ranks: Sequence[int] | None = None) -> dict[int, list[tuple[str, str, str]]]:
    """Each rank's InputPlan.rows() for one shape and world size, drawn in this process on the CPU.

    Where the checkout's generator builds process groups, a process group must already exist in this process (the
    probe child starts a fake one). A rank whose inputs exceed `max_bytes` (sized first on the meta
    device, which allocates nothing) is not drawn: ValueError says how large they are.
    """
    module = problem.module
    assert isinstance(module, ReferenceModule)
    base_shape = tuple(int(d) for d in problem.shape(shape)["base_shape"])
    rows: dict[int, list[tuple[str, str, str]]] = {}
    for rank in (range(world_size) if ranks is None else ranks):
        try:
            size = _tensor_bytes(module.draw(base_shape, rank, world_size, 0, torch.device("meta")))
        except Exception:  # generators that read values (.item()) cannot run on meta: size unknown, draw
            size = 0
        if size > max_bytes:
            raise ValueError(f"rank {rank}'s inputs take {size / 2**30:.1f} GiB at shape {shape!r} "
                             f"(base_shape {list(base_shape)}), more than the {max_bytes / 2**30:.1f} GiB the "
                             "harness draws in its own process: not examined")
        gen = torch.Generator()
        gen.manual_seed(rank_seed(seed, 0, rank))
        problem.make_inputs(problem.shape(shape), rank, world_size, gen, torch.device("cpu"))
        rows[rank] = module.input_plans[(base_shape, world_size, rank, "cpu")].rows()
    return rows


@lru_cache(maxsize=256)
def _report(spec: str, sha256: str, shape: str, world_size: int, seed: int) -> InputReport:
    """Drawn here when the checkout's generator needs no process group, else in a child with a fake one."""
    problem = load_spec(spec)
    try:
        return merge_rows(problem.name, shape, world_size, draw_plans(problem, shape, world_size, seed))
    except ValueError as err:
        if "not examined" in str(err):
            return InputReport(problem.name, shape, world_size, (), str(err))
        first = f"{type(err).__name__}: {err}"
    except Exception as err:  # most often: the generator builds process groups
        first = f"{type(err).__name__}: {err}"
    return _report_in_child(problem, shape, world_size, seed, first)


def _report_in_child(problem: Problem, shape: str, world_size: int, seed: int, first: str) -> InputReport:
    command = [sys.executable, "-m", "harness.problems.parallelkernelbench.input_probe", problem.loader_spec, shape,
               str(world_size), str(seed)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    try:
        proc = subprocess.run(command, cwd=str(REPO_ROOT), env=env,
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return InputReport(problem.name, shape, world_size, (),
                           f"inputs could not be examined: drawing them took over {PROBE_TIMEOUT_S:.0f} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return InputReport(problem.name, shape, world_size, (),
                           f"inputs could not be examined ({first}; with a fake process group: {tail})")
    data = json.loads(lines[-1])
    # the probe prints InputPlan.rows() of each rank: (input, action, reason) triples
    rows: dict[int, list[tuple[str, str, str]]] = {int(rank): [tuple(r) for r in rs]
                                                   for rank, rs in data["rows"].items()}
    return merge_rows(problem.name, shape, world_size, rows, data.get("error"))


def input_report(problem: Problem, shape: str = "small", world_size: int | None = None,
                 seed: int = 0) -> InputReport:
    """What the harness does to a ParallelKernelBench problem's inputs at `shape` and `world_size`: which inputs it
    re-draws per trial and which it leaves constant, on which ranks, and why (cached per checkout state). For a
    result record: `input_report(...).as_dict()`; its `flags()` say whether anything was perturbed or left
    constant. Empty for this suite's own problems."""
    w = world_size or problem.world_sizes[0]
    if not isinstance(problem.module, ReferenceModule):
        return InputReport(problem.name, shape, w)
    return _report(problem.loader_spec, problem.source_sha256, shape, w, seed)


def probe_inputs(problem: Problem, shape: str = "small", world_size: int | None = None, seed: int = 0) -> list[str]:
    """input_report as lines for a person (empty when nothing is perturbed or constant)."""
    return input_report(problem, shape, world_size, seed).lines()


def input_flags(problem: Problem, shape: str = "small", world_size: int | None = None) -> list[str]:
    """pkb_inputs_perturbed / pkb_inputs_constant for a result record (empty for this suite's problems)."""
    return sorted(input_report(problem, shape, world_size).flags())
