"""Wall and CPU time per evaluation: this checkout against another (an older commit's tree), and with the
sandbox on and off, on the same candidates, interleaved in one run so machine load hits every variant
alike.

    python benchmarks/eval_cost.py --before /path/to/old/tree --repeats 5 --out docs/measurements/DIR
    python benchmarks/eval_cost.py --before .device/before31 --device cuda --repeats 2 --out OUT   # one H200
    python benchmarks/eval_cost.py --before OLD --shape decode --variants before after \
        --candidates tests/exploits/_shm_all_reduce.py tests/candidates/correct_all_gather_sum.py
    python benchmarks/eval_cost.py --before OLD --shape default --no-timing --variants before after \
        --candidates tests/candidates/correct_all_gather_sum.py tests/candidates/output_mismatch_rank1.py
    python benchmarks/eval_cost.py --before OLD --evaluations 6 --variants before after   # as a pkb run sees it

Each evaluation runs in a fresh interpreter (its own process, as `pkb eval` would) and reports the
seconds evaluate() took, from inside, plus its stages. Variants: `before` (the other tree, as it was),
`after` (this tree, sandbox as probed), `after_no_sandbox` (this tree, PKB_SANDBOX=off). The summary is
the median per candidate and variant, its stages, and the differences. Variants run in ABBA order (the
order reversed every other candidate and round), so a drifting load favours none. `--out` is a folder
(eval_cost.json and eval_cost.md) or a .json file. Rounds (every candidate under every variant) stop being started once
`--budget-s` has passed, so a slow machine ends with fewer repeats rather than past its time. The old tree
needs no .git: `git archive COMMIT --prefix=.device/before31/ | tar -x` makes one inside an ignored folder.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
from harness.problems.registry import get, load_suite
device, shape, skip_timing = sys.argv[2], sys.argv[3], sys.argv[4] == "untimed"
problem = get(load_suite(), "all_reduce")
walls = []
for _ in range(int(sys.argv[5])):
    started = time.perf_counter()
    r = evaluate(problem, sys.argv[1], world_size=2, device=device, shape=shape,
                 config=EvalConfig(trials=5, timing=TimingConfig.for_device(device), use_reference_cache=False,
                                   skip_timing=skip_timing))
    walls.append(time.perf_counter() - started)
timed = {"median_ms": r.timings.candidate.median_ms, "reference_ms": r.timings.reference.median_ms} if r.timings else {}
warm = sorted(walls[1:] or walls)
print(json.dumps({"seconds": warm[len(warm) // 2], "verdict": r.verdict, "stages": r.stages, **timed,
                  "sandbox": r.integrity.get("sandbox", {}).get("backend", "none (before)")}))
"""


def run_one(tree: Path, candidate: Path, sandbox_off: bool, device: str, shape: str, timed: bool = True,
            evaluations: int = 1) -> dict:
    # The tree first; what the caller's path held after it (a GPU machine's carried wheels, say).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)}
    if sandbox_off:
        env["PKB_SANDBOX"] = "off"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", ONE, str(candidate), device, shape,
                           "timed" if timed else "untimed", str(evaluations)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    # CPU seconds of the whole evaluation, its interpreter and every process under it (each one waited for by
    # its parent, the sandbox's included): what two evaluations at once on a 2-core machine compete for. With
    # several evaluations in one interpreter, the whole interpreter's CPU over their number.
    cpu_s = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) / evaluations
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "cpu_s": round(cpu_s, 3)}


def table(summary: dict, before: str) -> str:
    def cell(row: dict, key: str, sign: bool = False) -> str:
        return "-" if key not in row else (f"{row[key]:+.2f} s" if sign else f"{row[key]:.2f} s")

    lines = [f"| candidate | before ({before}) | after, sandboxed | after, `PKB_SANDBOX=off` | sandbox's cost | "
             "after - before | check+timing stages, before / after | CPU s, before / after / off | verdicts |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for candidate, row in summary.items():
        cpu = " / ".join(cell(row, f"cpu_{name}_s") for name in ("before", "after", "after_no_sandbox"))
        lines.append(f"| `{Path(candidate).name}` | {cell(row, 'before_s')} | {cell(row, 'after_s')} | "
                     f"{cell(row, 'after_no_sandbox_s')} | {cell(row, 'sandbox_cost_s', True)} | "
                     f"{cell(row, 'after_minus_before_s', True)} | {cell(row, 'check_timing_before_s')} / "
                     f"{cell(row, 'check_timing_after_s')} | {cpu} | {', '.join(row['verdicts'])} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="a tree of the commit to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--shape", default="small", help="all_reduce's shape (decode: the work dominates)")
    parser.add_argument("--candidates", nargs="+", default=CANDIDATES, help="paths relative to the repository "
                        "(each taken from this tree, so it need not exist in the old one)")
    parser.add_argument("--variants", nargs="+", choices=("before", "after", "after_no_sandbox"),
                        default=["before", "after", "after_no_sandbox"])
    parser.add_argument("--no-timing", action="store_true", help="correctness only: the check stage is the "
                        "judge's work on the outputs (a large shape shows its comparisons)")
    parser.add_argument("--evaluations", type=int, default=1, help="evaluations per interpreter, as in a pkb run "
                        "or a test worker: the wall is then the median of all but the first, the CPU the "
                        "interpreter's whole over their number")
    parser.add_argument("--budget-s", type=float, default=480.0, help="start no round after this many seconds")
    parser.add_argument("--out", type=Path, default=None, help="a folder (eval_cost.json, eval_cost.md) or a .json")
    args = parser.parse_args()
    everything = {"before": (args.before.resolve(), False), "after": (ROOT, False), "after_no_sandbox": (ROOT, True)}
    variants = {name: everything[name] for name in args.variants}
    rows = []
    started = time.time()
    for repeat in range(args.repeats):
        if repeat and time.time() - started > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s spent: {repeat} round(s)", flush=True)
            break
        for i, candidate in enumerate(args.candidates):
            names = list(variants) if (repeat + i) % 2 == 0 else list(reversed(variants))  # ABBA order
            for name in names:
                tree, off = variants[name]
                row = {"repeat": repeat, "candidate": candidate, "variant": name, "shape": args.shape,
                       **run_one(tree, ROOT / candidate, off, args.device, args.shape, not args.no_timing,
                                 args.evaluations)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary: dict = {}
    for candidate in args.candidates:
        medians = {name: statistics.median(r["seconds"] for r in rows
                                           if r["candidate"] == candidate and r["variant"] == name)
                   for name in variants}
        # The judge's own work with the candidate's files (check and timing stages): where this tree's file
        # handling shows, apart from process start-up, which dominates the total on a small shape.
        judged = {name: statistics.median(r["stages"].get("check", 0.0) + r["stages"].get("timing", 0.0) for r in rows
                                          if r["candidate"] == candidate and r["variant"] == name)
                  for name in variants}
        stages = {name: {stage: round(statistics.median(r["stages"].get(stage, 0.0) for r in rows
                                                        if r["candidate"] == candidate and r["variant"] == name), 3)
                         for stage in ("reference", "check", "timing", "timing_judge", "timing_reference")}
                  for name in variants}
        cpu = {name: statistics.median(r["cpu_s"] for r in rows if r["candidate"] == candidate and r["variant"] == name)
               for name in variants}
        summary[candidate] = {**{f"{k}_s": round(v, 3) for k, v in medians.items()}, "stages": stages,
                              **{f"cpu_{k}_s": round(v, 3) for k, v in cpu.items()},
                              **{f"check_timing_{k}_s": round(v, 3) for k, v in judged.items()},
                              "verdicts": sorted({r["verdict"] for r in rows if r["candidate"] == candidate})}
        if "before" in medians and "after" in medians:
            summary[candidate]["after_minus_before_s"] = round(medians["after"] - medians["before"], 3)
        if "after_no_sandbox" in medians and "after" in medians:
            summary[candidate]["sandbox_cost_s"] = round(medians["after"] - medians["after_no_sandbox"], 3)
    rounds = 1 + max(r["repeat"] for r in rows)
    result = {"date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - started, 1), "device": args.device,
              "shape": args.shape, "untimed": args.no_timing, "repeats": rounds, "before": str(args.before),
              "evaluations_per_interpreter": args.evaluations, "summary": summary, "rows": rows}
    text = table(summary, args.before.name)
    heading = (f"{args.device}, shape {args.shape}{', untimed' if args.no_timing else ''}, W=2, medians of {rounds}"
               f"{f', {args.evaluations} evaluations per interpreter' if args.evaluations > 1 else ''}")
    if args.out:
        folder = args.out if args.out.suffix != ".json" else args.out.parent
        folder.mkdir(parents=True, exist_ok=True)
        (args.out if args.out.suffix == ".json" else folder / "eval_cost.json").write_text(json.dumps(result, indent=1))
        if args.out.suffix != ".json":
            (folder / "eval_cost.md").write_text(f"{heading}\n\n{text}\n")
    print(f"{heading} (seconds per evaluation)")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
