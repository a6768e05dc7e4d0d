"""Wall time per evaluation: this checkout against another (an older commit's worktree), and with the
sandbox on and off, on the same candidates, interleaved in one run so machine load hits every variant
alike.

    python benchmarks/eval_cost.py --before /path/to/old/worktree --repeats 5 --out docs/measurements/x.json
    python benchmarks/eval_cost.py --before OLD --shape decode --variants before after \
        --candidates tests/exploits/_shm_all_reduce.py tests/candidates/correct_all_gather_sum.py

Each evaluation runs in a fresh interpreter (its own process, as `pkb eval` would) and reports the
seconds evaluate() took, from inside, plus its stages. Variants: `before` (the other tree, as it was),
`after` (this tree, sandbox as probed), `after_no_sandbox` (this tree, PKB_SANDBOX=off). The summary is
the median per candidate and variant, and the differences.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ["tests/candidates/correct_all_gather_sum.py", "tests/candidates/output_mismatch_rank1.py",
              "tests/exploits/nccl_all_reduce.py"]
ONE = """
import json, sys, time
from harness.config import EvalConfig, TimingConfig
from harness.evaluate import evaluate
from harness.registry import get, load_suite
problem = get(load_suite(), "all_reduce")
started = time.perf_counter()
r = evaluate(problem, sys.argv[1], world_size=2, device="cpu", shape=sys.argv[2],
             config=EvalConfig(trials=5, timing=TimingConfig.for_device("cpu"), use_reference_cache=False))
print(json.dumps({"seconds": time.perf_counter() - started, "verdict": r.verdict, "stages": r.stages,
                  "sandbox": r.integrity.get("sandbox", {}).get("backend", "none (before)")}))
"""


def run_one(tree: Path, candidate: Path, sandbox_off: bool, shape: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if sandbox_off:
        env["PKB_SANDBOX"] = "off"
    done = subprocess.run([sys.executable, "-c", ONE, str(candidate), shape], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="a worktree of the commit to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shape", default="small", help="all_reduce's shape (decode: the work dominates)")
    parser.add_argument("--candidates", nargs="+", default=CANDIDATES, help="paths relative to the repository "
                        "(the candidate is taken from this tree; it must exist there, not in the old one)")
    parser.add_argument("--variants", nargs="+", choices=("before", "after", "after_no_sandbox"),
                        default=["before", "after", "after_no_sandbox"])
    args = parser.parse_args()
    everything = {"before": (args.before.resolve(), False), "after": (ROOT, False), "after_no_sandbox": (ROOT, True)}
    variants = {name: everything[name] for name in args.variants}
    rows = []
    started = time.time()
    for repeat in range(args.repeats):
        for i, candidate in enumerate(args.candidates):
            names = list(variants) if (repeat + i) % 2 == 0 else list(reversed(variants))  # ABBA order
            for name in names:
                tree, off = variants[name]
                row = {"repeat": repeat, "candidate": candidate, "variant": name, "shape": args.shape,
                       **run_one(tree, ROOT / candidate, off, args.shape)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary: dict = {}
    for candidate in args.candidates:
        medians = {name: statistics.median(r["seconds"] for r in rows
                                           if r["candidate"] == candidate and r["variant"] == name)
                   for name in variants}
        stages = {name: {stage: round(statistics.median(r["stages"].get(stage, 0.0) for r in rows
                                                        if r["candidate"] == candidate and r["variant"] == name), 3)
                         for stage in ("reference", "check", "timing", "timing_judge", "timing_reference")}
                  for name in variants}
        summary[candidate] = {**{f"{k}_s": round(v, 3) for k, v in medians.items()}, "stages": stages,
                              "verdicts": sorted({r["verdict"] for r in rows if r["candidate"] == candidate})}
        if "before" in medians and "after" in medians:
            summary[candidate]["after_minus_before_s"] = round(medians["after"] - medians["before"], 3)
        if "after_no_sandbox" in medians and "after" in medians:
            summary[candidate]["sandbox_cost_s"] = round(medians["after"] - medians["after_no_sandbox"], 3)
    result = {"date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - started, 1), "shape": args.shape,
              "repeats": args.repeats, "summary": summary, "rows": rows}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
