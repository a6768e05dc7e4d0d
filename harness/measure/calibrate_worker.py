"""One rank of the NCCL all-reduce calibration, started by harness.measure.calibration.all_reduce_curve.

Joins the process group (NCCL with device_id set; FileStore rendezvous, so no port), times a bf16 sum
all-reduce at each size with the ranks' own per-call protocol (harness.rank.timed.TimedSession: L2 flush,
device spin, device barrier, events around one call; the spin sized from the warm-up's enqueue times by
harness.common.spin, as the judge sizes it), and writes its per-iteration times to <out>/rank<R>.json; the
parent takes the slowest rank per iteration. `--device cpu` runs the same plumbing under gloo, for tests.
Imports torch, the standard library and the rank side's timing modules only.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.common import messages
from harness.common.messages import TimedKind
from harness.common.spin import MAX_SPIN_US, MIN_SPIN_US, spin_us
from harness.rank.timed import TimedSession, agree_min, input_sets_needed, l2_and_free


def _no_issue(out: Any) -> str | None:
    """Every output is plain here (all_reduce returns None): nothing to refuse."""
    return None


def _spin(warmup: list[dict[str, Any]], device: torch.device, config: dict[str, Any]) -> float:
    """The spin of the timed calls, as harness.judge.timing.spin_for sizes it: per warm-up call after the first
    the slowest rank's enqueue of barrier and call, their median, through harness.common.spin."""
    enqueue = [float(r.get("enqueue_us", 0.0)) + float(r.get("barrier_enqueue_us", 0.0)) for r in warmup]
    t = torch.tensor(enqueue or [0.0], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    per_iter = t.tolist()
    median = statistics.median(per_iter[1:] or per_iter)
    return spin_us(median, float(config.get("min_spin_us", MIN_SPIN_US)), float(config.get("max_spin_us", MAX_SPIN_US)))


def time_calls(fn: Callable[..., Any], sets: list[tuple[Any, ...]], device: torch.device,
               config: dict[str, Any]) -> dict[str, Any]:
    """`fn` on the input sets, in rotation, by the per-call protocol: warm-up, timed and host-latency calls in
    the order the judge sends them, the spin sized from the warm-up."""
    session = TimedSession(fn, sets, [], device, plain=_no_issue)
    turn = iter(range(1 << 62))

    def call(kind: TimedKind, spin: float) -> dict[str, Any]:
        index = next(turn) % len(sets)
        session.prepare(messages.TimePrepare(kind=kind, set=index))  # no recipe: the trusted calibration rotates
        return session.call(messages.TimeCall(kind=kind, set=index, spin_us=spin))

    warm = [call("warmup", 0.0) for _ in range(max(int(config.get("warmup", 10)), 1))]
    spin = _spin(warm, device, config) if device.type == "cuda" else 0.0
    times = [call("timed", spin)["ms"] for _ in range(int(config.get("iters", 50)))]
    host = [call("host", 0.0)["ms"] for _ in range(int(config.get("host_iters", 10)))]
    session.finish(messages.TimeEnd())
    return {"times_ms": times, "host_ms": host, "input_sets": len(sets), "spin_us": spin}


def time_size(nbytes: int, rank: int, device: torch.device, config: dict[str, Any]) -> dict[str, Any]:
    """A bf16 sum all-reduce of `nbytes`, on enough input sets to rotate past the L2 (as timed calls do)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(1_000_003 * rank + nbytes)

    def make_set() -> tuple[torch.Tensor]:
        return (torch.randn(nbytes // 2, generator=gen, dtype=torch.bfloat16, device=device),)

    first = make_set()
    l2_bytes, free_bytes = l2_and_free(device)
    if device.type == "cuda":
        n_sets = agree_min(input_sets_needed(nbytes, l2_bytes, config, free_bytes), device)
    else:
        n_sets = int(config.get("min_input_sets", 2))
    sets = [first] + [make_set() for _ in range(1, n_sets)]
    timed = time_calls(dist.all_reduce, sets, device, config)
    return {"bytes": nbytes, "set_bytes": nbytes, "l2_bytes": l2_bytes, **timed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-file", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", required=True, help="bytes, comma-separated")
    parser.add_argument("--config", required=True, help="harness.config.TimingConfig as JSON")
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
    config = json.loads(args.config)
    try:
        results = []
        for nbytes in (int(s) for s in args.sizes.split(",")):
            results.append(time_size(nbytes, args.rank, device, config))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    path = args.out / f"rank{args.rank}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"rank": args.rank, "sizes": results}))
    tmp.replace(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
