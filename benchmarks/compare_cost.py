"""Seconds the judge spends comparing one large output with the expected one: this tree's
harness.common.compare against another tree's, on the same tensors, in fresh processes, alternated.

    python benchmarks/compare_cost.py --before .device/before-chunks --elements 74649600 --repeats 3 \
        --out docs/measurements/DIR/compare_cost.json

The default size is the output of PKB's 77_magi1_cso_async_attention at its default shape on one rank
(74.6M bf16 elements), whose check held the H200 for minutes in the whole-set replays. Cases: the same
values (a collective's exact answer), close values with a few out of tolerance, wrong values everywhere,
and the judge's yes-or-no question on a wrong output (is it the previous call's answer?), which a tree
with `matches` answers with it and an older tree with the full comparison. Each case is timed in its own
process, after one warm-up comparison there, so allocator and page-fault state is the same for both trees.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("equal", "close", "wrong", "stale_question")
ONE = """
import json, sys, time, torch
from harness.common import compare
case, n = sys.argv[1], int(sys.argv[2])
gen = torch.Generator().manual_seed(0)
expected = torch.randn(n, generator=gen).to(torch.bfloat16)
if case == "equal":
    got = expected.clone()
elif case == "close":  # bf16 rounding of a small error: about 0.1% of the elements out of tolerance
    got = (expected.float() + 0.004 * torch.randn(n, generator=gen)).to(torch.bfloat16)
else:
    got = torch.randn(n, generator=gen).to(torch.bfloat16)
if case == "stale_question":
    ask = getattr(compare, "matches", None) or (lambda e, g, a, r: compare.compare_outputs(e, g, a, r)["ok"])
    run = lambda: ask(expected, got, 1e-2, 1e-2)
else:
    run = lambda: compare.compare_outputs(expected, got, 1e-2, 1e-2)["ok"]
run()
started = time.perf_counter()
answer = run()
print(json.dumps({"seconds": time.perf_counter() - started, "ok": bool(answer)}))
"""


def run_one(tree: Path, case: str, elements: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", ONE, case, str(elements)], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="a tree of the commit to compare with")
    parser.add_argument("--elements", type=int, default=74_649_600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="a .json file for the rows and the summary")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": ROOT}
    rows = []
    for repeat in range(args.repeats):
        for i, case in enumerate(CASES):
            order = list(trees) if (repeat + i) % 2 == 0 else list(reversed(trees))  # ABBA: drift favours neither
            for name in order:
                row = {"repeat": repeat, "case": case, "tree": name, **run_one(trees[name], case, args.elements)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for case in CASES:
        medians = {name: statistics.median(r["seconds"] for r in rows if r["case"] == case and r["tree"] == name)
                   for name in trees}
        answers = {name: sorted({r["ok"] for r in rows if r["case"] == case and r["tree"] == name}) for name in trees}
        if answers["before"] != answers["after"]:
            raise SystemExit(f"{case}: the trees disagree ({answers})")
        summary[case] = {**{f"{k}_s": round(v, 3) for k, v in medians.items()}, "ok": answers["after"]}
    print("\n| case | before | after | same answer |\n| --- | --- | --- | --- |")
    for case, row in summary.items():
        print(f"| {case} | {row['before_s']:.3f} s | {row['after_s']:.3f} s | yes ({row['ok']}) |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"elements": args.elements, "before": str(args.before), "rows": rows,
                                        "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
