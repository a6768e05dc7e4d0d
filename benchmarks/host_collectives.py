"""How fast the host collectives (`pkbhost`, harness.emulation.collectives) move data, beside gloo.

W processes join one process group of each backend through a file:// rendezvous; each times `all_reduce`,
`all_gather_into_tensor` and `all_to_all_single` of float32 tensors at several sizes (median of the timed
calls, a barrier before each). On `--device cuda` every rank uses the same GPU (the one-GPU emulation's
case: NCCL refuses two ranks on one device; gloo's all_to_all is skipped as gloo lacks it on CUDA).

    python benchmarks/host_collectives.py --out /tmp/hostcoll                  # CPU, W=2
    python benchmarks/host_collectives.py --out /tmp/hostcoll --device cuda --world-size 2
    python benchmarks/host_collectives.py --out /tmp/hostcoll --torch-threads 0 # torch's default pool

`--torch-threads N` sets each rank's torch thread count before it starts (0 keeps torch's default: as
many as cores), the setting a candidate's or reference's process may have when it calls a collective.
Writes results.json and results.md into --out and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parent.parent
SIZES = (4 << 10, 256 << 10, 1 << 20, 16 << 20)
OPS = ("all_reduce", "all_gather_into_tensor", "all_to_all_single")


def _call(op: str, x: torch.Tensor, out: torch.Tensor) -> None:
    if op == "all_reduce":
        dist.all_reduce(x)
    elif op == "all_gather_into_tensor":
        dist.all_gather_into_tensor(out, x)
    else:
        dist.all_to_all_single(out[: x.numel()], x)


def _rank(rank: int, args: argparse.Namespace, backend: str, init: str, queue: Any) -> None:
    sys.path.insert(0, str(REPO))
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if backend == "pkbhost":
        from harness.emulation import collectives
        backend = collectives.register()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init}", rank=rank, world_size=args.world_size)
    rows: list[dict[str, Any]] = []
    for op in OPS:
        if op == "all_to_all_single" and backend == "gloo" and device.type == "cuda":
            continue  # gloo has no all_to_all on CUDA tensors (issue 30's finding)
        for nbytes in SIZES:
            n = nbytes // 4 // args.world_size * args.world_size
            x = torch.ones(n, device=device)
            out = torch.empty(n * args.world_size, device=device)
            for _ in range(args.warmup):
                _call(op, x, out)
            times = []
            for _ in range(args.calls):
                dist.barrier()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                _call(op, x, out)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - started)
            rows.append({"op": op, "bytes": n * 4, "median_ms": statistics.median(times) * 1e3,
                         "min_ms": min(times) * 1e3})
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def run_backend(args: argparse.Namespace, backend: str) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="pkb-hostcoll-") as tmp:
        init = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank, args=(r, args, backend, init, queue)) for r in range(args.world_size)]
        for p in procs:
            p.start()
        try:
            rows: list[dict[str, Any]] = queue.get(timeout=args.timeout_s)
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    return [{"backend": backend, **row} for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and results.md")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the tensors live (default cpu)")
    parser.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--calls", type=int, default=20, help="timed calls per op and size (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch threads in each rank; 0 keeps torch's default (default 0)")
    parser.add_argument("--timeout-s", type=float, default=600, help="give up on a backend after this (default 600)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = run_backend(args, "gloo") + run_backend(args, "pkbhost")
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "host": platform.node(),
            "cores": os.cpu_count(), "device": args.device, "world_size": args.world_size,
            "torch": torch.__version__, "torch_threads": args.torch_threads or "default", "calls": args.calls}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [f"host collectives vs gloo: {json.dumps(meta)}", "",
             "| op | bytes per rank | gloo median ms | pkbhost median ms |", "|---|---:|---:|---:|"]
    by = {(r["backend"], r["op"], r["bytes"]): r for r in rows}
    for op in OPS:
        for nbytes in sorted({r["bytes"] for r in rows if r["op"] == op}):
            gloo, host = by.get(("gloo", op, nbytes)), by.get(("pkbhost", op, nbytes))
            lines.append(f"| {op} | {nbytes} | {gloo['median_ms']:.3f} |" if gloo else f"| {op} | {nbytes} | — |")
            lines[-1] += f" {host['median_ms']:.3f} |" if host else " — |"
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
