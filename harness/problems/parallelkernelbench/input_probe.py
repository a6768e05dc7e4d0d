"""Draw a ParallelKernelBench problem's inputs for every rank under a fake process group, and print what is
re-drawn.

    python -m harness.problems.parallelkernelbench.input_probe SPEC SHAPE WORLD_SIZE SEED

Started by .input_report.input_report when the checkout's generator builds process groups (new_group needs
one), so the harness's own process never holds a process group. torch's fake backend makes this one
process rank r of W in turn; its collectives do nothing, which is enough for generators that only build
groups. Prints one JSON line: {"rows": {rank: [[input, action, reason], ...]}, "error": null}.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore  # torch's own test backend

from harness.problems.parallelkernelbench.checkout import load_spec
from harness.problems.parallelkernelbench.input_report import draw_plans


def main(argv: list[str] | None = None) -> int:
    spec, shape, world_size, seed = (argv if argv is not None else sys.argv[1:])[:4]
    problem = load_spec(spec)
    rows: dict[int, list[tuple[str, str, str]]] = {}
    error = None
    w = int(world_size)
    for rank in range(w):
        dist.init_process_group("fake", rank=rank, world_size=w, store=FakeStore())
        try:
            rows.update(draw_plans(problem, shape, w, int(seed), ranks=[rank]))
        except ValueError as err:
            error = str(err)
            break
        finally:
            dist.destroy_process_group()
    print(json.dumps({"rows": rows, "error": error}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
