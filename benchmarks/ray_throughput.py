"""Evaluation throughput of the Ray executor against the number of nodes, on one CPU machine.

Starts a loopback Ray cluster of N logical nodes (a head without resources plus N nodes of
--gpus-per-node logical GPUs each), submits --evals evaluations of W=2 ranks at once through
agent.executors.RayExecutor, and reports evaluations per minute for each N and the ratio to the first N.
Three workloads:

- synthetic: each task holds its W logical GPUs for --sleep-s seconds and does nothing else: a GPU-bound
  evaluation whose host side costs nothing. It measures what Ray's scheduling and the executor add.
- sleep: the full harness protocol on all_reduce (small shape, gloo) for a candidate whose first call on
  each rank sleeps --sleep-s seconds: a real evaluation whose cost is mostly waiting, as on GPUs where the
  host only launches and waits.
- real: the full harness protocol on tests/candidates/correct_all_gather_sum.py: CPU-bound on CPU.

Every evaluation must come back correct, or the measurement is void (a failed evaluation is quick). Run
it from a checkout nobody edits meanwhile: the nodes re-check the harness's code fingerprint on every
evaluation and answer infra_error when it changed under them.

All logical nodes share this machine's cores. The rank processes of every evaluation (torch start-up,
gloo collectives, the checks) compete for them, so CPU-bound evaluations cannot scale with the number of
logical nodes here; on a real cluster each node brings its own cores. The machine's load average is
recorded beside every figure because other work on it skews them.

    python benchmarks/ray_throughput.py --nodes 1,4 --evals 8 --modes synthetic,sleep,real --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WORLD_SIZE = 2
SLEEPER = '''
import os, time
import torch.distributed as dist

_slept = False

def solution(x):
    global _slept
    if not _slept:  # the first call on each rank waits, as a GPU-bound evaluation would
        _slept = True
        time.sleep({sleep_s})
    out = x.clone()
    dist.all_reduce(out)
    return out
'''


def hold(seconds: float) -> float:
    """A synthetic evaluation: the task holds its devices and waits."""
    time.sleep(seconds)
    return seconds


def loopback_env(scratch: str) -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only; read when ray is imported
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a loopback cluster: no token written to ~/.ray
    os.environ["RAY_TMPDIR"] = scratch


def measure(nodes: int, args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    import ray
    from ray.cluster_utils import Cluster

    from agent.executors.ray_cluster import RayExecutor
    from agent.executors.request import EvalRequest
    from harness.config import EvalConfig, TimingConfig
    from harness.problems.registry import get, load_suite

    problem = get(load_suite(), "all_reduce")
    config = EvalConfig(trials=args.trials, timing=TimingConfig.for_device("cpu"))
    sleeper = workdir / "sleeper.py"
    sleeper.write_text(SLEEPER.format(sleep_s=args.sleep_s))
    correct = REPO / "tests" / "candidates" / "correct_all_gather_sum.py"

    started = time.perf_counter()
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 0, "include_dashboard": False})
    rows: list[dict[str, Any]] = []
    executor: RayExecutor | None = None
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=2, num_gpus=args.gpus_per_node)
        executor = RayExecutor(cluster.address, cpu_resource="GPU")
        print(f"[{nodes} node(s)] cluster up in {time.perf_counter() - started:.1f} s; capacity "
              f"{executor.capacity(WORLD_SIZE, 'cpu')} evaluations at once", flush=True)
        synthetic = ray.remote(hold).options(**executor.task_options(WORLD_SIZE, "cpu"))

        def requests(path: Path, count: int) -> list[EvalRequest]:
            return [EvalRequest.build(problem, path, world_size=WORLD_SIZE, device="cpu", shape="small",
                                      config=config) for _ in range(count)]

        # Warm-up, untimed: a worker process on every node with torch imported, reference timings cached.
        executor.evaluate_many(requests(correct, executor.capacity(WORLD_SIZE, "cpu")))
        for mode in args.modes:
            load_before = os.getloadavg()[0]
            t0 = time.perf_counter()
            if mode == "synthetic":
                ray.get([synthetic.remote(args.sleep_s) for _ in range(args.evals)])
                verdicts = ["correct"] * args.evals
            else:
                results = executor.evaluate_many(requests(sleeper if mode == "sleep" else correct, args.evals))
                verdicts = [r.verdict for r in results]
                broken = [r for r in results if r.verdict != "correct"]
                if broken:  # a failed evaluation is quick: counting it would inflate the figure
                    failure = broken[0].failure
                    raise SystemExit(f"[{nodes} node(s)] {mode}: {len(broken)} evaluation(s) not correct, the "
                                     f"measurement is void; first: {broken[0].verdict}: "
                                     f"{failure.message if failure else ''}")
            wall = time.perf_counter() - t0
            row = {"mode": mode, "nodes": nodes, "evals": args.evals, "wall_s": round(wall, 2),
                   "evals_per_min": round(60 * args.evals / wall, 2), "verdicts": sorted(set(verdicts)),
                   "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}
            rows.append(row)
            print(f"[{nodes} node(s)] {mode}: {args.evals} evaluations in {wall:.1f} s "
                  f"({row['evals_per_min']:.1f}/min; verdicts {', '.join(row['verdicts'])}; "
                  f"load {row['load_before']} -> {row['load_after']})", flush=True)
    finally:
        if executor is not None:
            executor.close()  # the driver lets go first: Ray refuses to remove the head a driver is connected to
        cluster.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,4", help="logical node counts, comma-separated (default 1,4)")
    parser.add_argument("--gpus-per-node", type=int, default=2, help="logical GPUs per node (default 2: one "
                                                                     "W=2 evaluation at a time per node)")
    parser.add_argument("--evals", type=int, default=8, help="evaluations per measurement (default 8)")
    parser.add_argument("--modes", default="synthetic,sleep,real")
    parser.add_argument("--sleep-s", type=float, default=20.0, help="wait per evaluation in synthetic and sleep")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", default=None, help="folder for ray_throughput.json")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(args.modes) - {"synthetic", "sleep", "real"}
    if unknown:
        parser.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    counts = [int(n) for n in args.nodes.split(",") if n.strip()]

    scratch = tempfile.mkdtemp(prefix="pkbray")
    loopback_env(scratch)
    os.environ.setdefault("PKB_CACHE_DIR", str(Path(scratch) / "cache"))  # builds and reference timings
    rows: list[dict[str, Any]] = []
    try:
        for n in counts:
            rows.extend(measure(n, args, Path(scratch)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    base = {r["mode"]: r["evals_per_min"] for r in rows if r["nodes"] == counts[0]}
    print(f"\n| mode | nodes | evaluations | wall s | evaluations/min | vs {counts[0]} node(s) | load avg |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        r["scaling"] = round(r["evals_per_min"] / base[r["mode"]], 2) if base.get(r["mode"]) else None
        print(f"| {r['mode']} | {r['nodes']} | {r['evals']} | {r['wall_s']} | {r['evals_per_min']} | "
              f"{r['scaling']}x | {r['load_before']} -> {r['load_after']} |")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        record = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.node(),
                  "cpus": os.cpu_count(), "argv": sys.argv[1:], "sleep_s": args.sleep_s,
                  "gpus_per_node": args.gpus_per_node, "world_size": WORLD_SIZE, "rows": rows}
        (out / "ray_throughput.json").write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
