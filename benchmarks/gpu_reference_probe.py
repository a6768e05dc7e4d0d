"""One problem's reference on the GPUs, step by step with timestamps: input generation, single calls,
then the harness timing protocol. For a reference that does not finish in gpu_references.py, this
says which step is slow (and dumps every thread's stack if one stalls).

    python benchmarks/gpu_reference_probe.py PROBLEM [--shape default] [--world-size 2] [--stall-s 90]
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import spawn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rank_main(rank: int, args: argparse.Namespace, init_file: str) -> None:
    from harness.measure.calibrate_worker import time_calls  # the ranks' per-call protocol, in process
    from harness.problems.registry import get, load_suite  # in the child, after spawn

    faulthandler.dump_traceback_later(args.stall_s, repeat=True)
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=args.world_size,
                            device_id=device, timeout=timedelta(seconds=600))
    problem = get(load_suite(), args.problem)
    module = problem.module
    shape = problem.shapes[args.shape]
    t0 = time.perf_counter()

    def stamp(what: str) -> None:
        torch.cuda.synchronize()
        print(f"[rank {rank}] {time.perf_counter() - t0:8.3f} s  {what}", flush=True)

    def make_set(i: int) -> tuple:
        gen = torch.Generator(device=device)
        gen.manual_seed(1000 * i + rank)
        return tuple(module.make_inputs(shape, rank, args.world_size, gen, device))

    inputs = make_set(0)
    stamp("make_inputs")
    for i in range(3):
        module.solution(*inputs)
        stamp(f"call {i}")
    timed = time_calls(module.solution, [inputs, make_set(1)], device, {"warmup": 3, "iters": 10, "host_iters": 3})
    stamp(f"time_calls: median {sorted(timed['times_ms'])[len(timed['times_ms']) // 2] * 1e3:.1f} us, "
          f"{timed['input_sets']} input sets, spin {timed['spin_us']:.0f} us")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("problem")
    parser.add_argument("--shape", default="default")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--stall-s", type=float, default=90.0)
    args = parser.parse_args()
    for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        os.environ[key] = "0" if key == "NCCL_NVLS_ENABLE" else "1"
    with tempfile.TemporaryDirectory() as tmp:
        spawn(rank_main, args=(args, os.path.join(tmp, "init")), nprocs=args.world_size, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
