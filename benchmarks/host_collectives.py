"""How fast the host collectives (`pkbhost`, harness.emulation.collectives) move data, beside gloo.

W processes join a `pkbhost` default group and a gloo group over the same ranks. For every operation and
size the two backends take turns call by call (gloo, pkbhost, gloo, ...; a gloo barrier before each
call), so load from other work on a shared machine falls on both alike. A call's time is the slowest
rank's; the table gives the median over the timed calls and the ratio pkbhost / gloo. "bytes" is each
rank's input tensor (all_gather's output is W times it, reduce_scatter's output 1/W of it). On `--device
cuda` every rank uses the same GPU (the one-GPU emulation's case: NCCL refuses two ranks on one device;
gloo has no all_to_all on CUDA tensors, so that row has no gloo time).

    python benchmarks/host_collectives.py --out /tmp/hostcoll                        # CPU, W=2 and W=4
    python benchmarks/host_collectives.py --out /tmp/hostcoll --device cuda --world-size 2
    python benchmarks/host_collectives.py --out /tmp/before --tree /tmp/old-checkout # an older commit's pkbhost

`--tree` imports the harness from another checkout (before/after with the same script). `--torch-threads N`
sets each rank's torch thread count (0 keeps torch's default: as many as cores), the setting a candidate's
or reference's process may have when it calls a collective. Writes results.json and results.md into --out
(with the date, the machine, the command and the load average before and after) and prints the table.
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
SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)
OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single")
BACKENDS = ("gloo", "pkbhost")


def _buffers(op: str, nbytes: int, world: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(world, nbytes // 4 // world * world)
    x = torch.ones(n, device=device)
    out_n = {"all_gather_into_tensor": n * world, "reduce_scatter_tensor": n // world}.get(op, n)
    return x, torch.empty(out_n, device=device)


def _call(op: str, x: torch.Tensor, out: torch.Tensor, group: Any) -> None:
    if op == "all_reduce":
        dist.all_reduce(x, group=group)
    elif op == "all_gather_into_tensor":
        dist.all_gather_into_tensor(out, x, group=group)
    elif op == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(out, x, group=group)
    elif op == "broadcast":
        dist.broadcast(x, src=0, group=group)
    else:
        dist.all_to_all_single(out, x, group=group)


def _rank(rank: int, args: argparse.Namespace, init: str, queue: Any) -> None:
    sys.path.insert(0, str(args.tree))
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    from harness.emulation import collectives
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(collectives.register(), init_method=f"file://{init}", rank=rank,
                            world_size=args.world_size)
    groups = {"pkbhost": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    fence = groups["gloo"]
    times: dict[str, list[float]] = {}
    for op in OPS:
        for nbytes in SIZES:
            x, out = _buffers(op, nbytes, args.world_size, device)
            gloo_lacks = op == "all_to_all_single" and device.type == "cuda"
            backends = [b for b in BACKENDS if not (b == "gloo" and gloo_lacks)]
            for i in range(args.warmup + args.calls):
                for backend in backends:
                    dist.barrier(group=fence)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    started = time.perf_counter()
                    _call(op, x, out, groups[backend])
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    if i >= args.warmup:
                        times.setdefault(f"{backend}|{op}|{x.numel() * 4}", []).append(time.perf_counter() - started)
    queue.put((rank, times))
    dist.barrier(group=fence)
    dist.destroy_process_group()


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (backend, op, bytes) row: the median and the minimum over calls of the slowest rank's time."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="pkb-hostcoll-") as tmp:
        init = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank, args=(r, args, init, queue)) for r in range(args.world_size)]
        for p in procs:
            p.start()
        try:
            per_rank = dict(queue.get(timeout=args.timeout_s) for _ in procs)
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    rows = []
    for key in per_rank[0]:
        backend, op, nbytes = key.split("|")
        slowest = [max(calls) for calls in zip(*(per_rank[r][key] for r in per_rank))]
        rows.append({"backend": backend, "op": op, "bytes": int(nbytes), "world_size": args.world_size,
                     "median_ms": statistics.median(slowest) * 1e3, "min_ms": min(slowest) * 1e3})
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| W | op | bytes per rank | gloo median ms | pkbhost median ms | pkbhost / gloo |",
             "|---:|---|---:|---:|---:|---:|"]
    by = {(r["backend"], r["world_size"], r["op"], r["bytes"]): r["median_ms"] for r in rows}
    for world in sorted({r["world_size"] for r in rows}):
        for op in OPS:
            for nbytes in sorted({r["bytes"] for r in rows if r["op"] == op and r["world_size"] == world}):
                gloo, host = by.get(("gloo", world, op, nbytes)), by.get(("pkbhost", world, op, nbytes))
                ratio = f"{host / gloo:.2f}" if gloo and host else "—"
                lines.append(f"| {world} | {op} | {nbytes} | {f'{gloo:.3f}' if gloo else '—'} | "
                             f"{f'{host:.3f}' if host else '—'} | {ratio} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and results.md")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the tensors live (default cpu)")
    parser.add_argument("--world-size", default="2,4", help="ranks, a comma-separated list (default 2,4)")
    parser.add_argument("--calls", type=int, default=20, help="timed calls per backend, op and size (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch threads in each rank; 0 keeps torch's default (default 0)")
    parser.add_argument("--tree", type=Path, default=REPO, help="import the harness from this checkout (default ours)")
    parser.add_argument("--timeout-s", type=float, default=900, help="give up on a world size after this (default 900)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for world in [int(w) for w in args.world_size.split(",")]:
        rows += run(argparse.Namespace(**{**vars(args), "world_size": world}))
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "host": platform.node(),
            "cores": os.cpu_count(), "device": args.device, "world_sizes": args.world_size,
            "torch": torch.__version__, "torch_threads": args.torch_threads or "default", "calls": args.calls,
            "command": " ".join(sys.argv), "load_average_before": [round(v, 2) for v in load_before],
            "load_average_after": [round(v, 2) for v in os.getloadavg()]}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [f"host collectives vs gloo: {json.dumps(meta)}", "", *table(rows)]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
