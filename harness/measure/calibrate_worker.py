"""One rank of the NCCL all-reduce calibration, started by harness.measure.topology.all_reduce_curve.

Joins the process group (NCCL with device_id set; FileStore rendezvous, so no port), times a bf16 sum
all-reduce at each size with harness.timing's protocol, and writes its per-iteration times to
<out>/rank<R>.json; the parent takes the slowest rank per iteration. `--device cpu` runs the same
plumbing under gloo, for tests. Imports torch, the standard library and harness.timing only.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.timing import time_function


def sweep(sizes: list[int], rank: int, device: torch.device, config: dict[str, Any]) -> list[dict[str, Any]]:
    results = []
    for nbytes in sizes:
        gen = torch.Generator(device=device)
        gen.manual_seed(1_000_003 * rank + nbytes)

        def make_set(_: int, numel: int = nbytes // 2, gen: torch.Generator = gen) -> tuple[torch.Tensor]:
            return (torch.randn(numel, generator=gen, dtype=torch.bfloat16, device=device),)

        timed = time_function(dist.all_reduce, make_set, device, config)
        results.append({"bytes": nbytes, **timed})
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-file", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", required=True, help="bytes, comma-separated")
    parser.add_argument("--config", required=True, help="harness.timing config as JSON")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args(argv)

    init = {"init_method": f"file://{args.init_file}", "rank": args.rank, "world_size": args.world_size,
            "timeout": timedelta(minutes=10)}
    if args.device == "cuda":
        device = torch.device("cuda", args.rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, **init)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        dist.init_process_group("gloo", **init)
    try:
        results = sweep([int(s) for s in args.sizes.split(",")], args.rank, device, json.loads(args.config))
    finally:
        dist.destroy_process_group()
    path = args.out / f"rank{args.rank}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"rank": args.rank, "sizes": results}))
    tmp.replace(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
