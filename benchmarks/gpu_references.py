"""Every problem's reference under NCCL: validated against its oracle at the `small` shape on the GPUs,
then timed at the `default` shape with the harness's timing protocol. One trusted rank pool serves
every problem.

    python benchmarks/gpu_references.py --out OUTDIR [--world-size 2] [selection ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import TimingConfig  # noqa: E402
from harness.launch.pool import Hang, RankPool  # noqa: E402
from harness.measure.roofline import RooflineError, time_reference  # noqa: E402
from harness.problems.registry import load_suite, select  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("selection", nargs="*")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--shape", default="default")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per phase per problem")
    parser.add_argument("--keep-logs", type=Path, default=None, help="keep the rank processes' logs here")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    problems = [p for p in select(load_suite(), args.selection) if p.supports(args.world_size)]
    timing = TimingConfig(warmup=5, iters=30, host_iters=5).model_dump()
    rows = []
    pool = None
    progress = (args.out / "references.jsonl").open("w")  # line by line: a timeout keeps what was done
    for p in problems:
        if pool is None:
            pool = RankPool(args.world_size, args.device, keep_logs=args.keep_logs).start()
        row: dict[str, Any] = {"problem": p.name, "category": p.category}
        started = time.perf_counter()
        try:
            val = pool.request({"op": "validate", "problem": p.loader_spec, "shape": "small", "seed": 7,
                                "trials": 2}, timeout=args.timeout)
            row["valid_small"] = all(r.get("ok") for r in val)
            if not row["valid_small"]:
                row["message"] = next(r.get("message", "") for r in val if not r.get("ok"))[:300]
                pool.kill()
                pool = None
                rows.append(row)
                print(json.dumps(row), flush=True)
                progress.write(json.dumps(row) + "\n")
                progress.flush()
                continue
            shape = args.shape if args.shape in p.shapes else "default"
            try:
                stats = time_reference(pool, p, shape, args.device, seed=0, config=timing, timeout=2 * args.timeout)
                row.update(median_us=stats.median_ms * 1e3, p10_us=stats.p10_ms * 1e3, p90_us=stats.p90_ms * 1e3,
                           cv=stats.cv, host_us=stats.host_median_ms * 1e3, input_sets=stats.input_sets)
            except RooflineError as err:
                row["message"] = str(err)[:300]
                pool.kill()
                pool = None
        except Hang as hang:
            row["message"] = f"hang: {hang}"
            if pool is not None:
                pool.kill()
            pool = None
        row["seconds"] = time.perf_counter() - started
        rows.append(row)
        print(json.dumps(row), flush=True)
        progress.write(json.dumps(row) + "\n")
        progress.flush()
    if pool is not None:
        pool.close()
    (args.out / "references.json").write_text(json.dumps(rows, indent=1))
    print("\n| problem | category | valid (small) | default median µs | p10 | p90 | CV | host µs |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "median_us" in r:
            print(f"| {r['problem']} | {r['category']} | {r['valid_small']} | {r['median_us']:.1f} | "
                  f"{r['p10_us']:.1f} | {r['p90_us']:.1f} | {r['cv']:.1%} | {r['host_us']:.1f} |")
        else:
            print(f"| {r['problem']} | {r['category']} | {r.get('valid_small')} | FAILED: {r.get('message', '')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
