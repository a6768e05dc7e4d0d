"""Expert solutions on GPUs: correctness at small and default shapes, speedup over NCCL, repeatability
in separate processes, deadlock recovery, and per-stage evaluation latency.

    python benchmarks/gpu_experts.py --out OUTDIR [--world-size 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import EvalConfig, Limits, TimingConfig  # noqa: E402
from harness.evaluate import evaluate  # noqa: E402
from harness.problems.registry import get, load_suite  # noqa: E402

SOL = ROOT / "problems"
EXPERTS = [
    ("all_reduce", "collective/solutions/all_reduce__one_shot.py", ["small", "decode", "1mib", "default"]),
    ("all_reduce", "collective/solutions/all_reduce__two_shot.py", ["small", "1mib", "default", "large"]),
    ("all_reduce", "collective/solutions/all_reduce__two_shot_copy_engine.py", ["small", "1mib", "default", "large"]),
    ("all_reduce", "collective/solutions/all_reduce__two_shot_push.py", ["small", "1mib", "default", "large"]),
    ("all_gather", "collective/solutions/all_gather__pull.py", ["small", "decode", "default"]),
    ("all_gather", "collective/solutions/all_gather__copy_engine.py", ["small", "decode", "default"]),
    ("reduce_scatter", "collective/solutions/reduce_scatter__pull.py", ["small", "default"]),
    ("all_to_all", "collective/solutions/all_to_all__pull.py", ["small", "default"]),
    ("all_to_all", "collective/solutions/all_to_all__copy_engine.py", ["small", "default"]),
    ("all_reduce_residual_rmsnorm", "tensor/solutions/all_reduce_residual_rmsnorm__one_shot.py",
     ["small", "default", "prefill"]),
]


def row(r) -> dict:
    t = r.timings
    return {
        "problem": r.problem, "shape": r.shape, "candidate": Path(r.candidate.path).name, "verdict": r.verdict,
        "message": r.failure.message[:300] if r.failure else "",
        "evidence": r.failure.evidence[-1500:] if r.failure else "",
        "max_abs_err": r.max_abs_err,
        "ref_median_us": t.reference.median_ms * 1e3 if t else None,
        "cand_median_us": t.candidate.median_ms * 1e3 if t else None,
        "ref_cv": t.reference.cv if t else None, "cand_cv": t.candidate.cv if t else None,
        "cand_host_us": t.candidate.host_median_ms * 1e3 if t else None,
        "ref_host_us": t.reference.host_median_ms * 1e3 if t else None,
        "input_sets": t.candidate.input_sets if t else None, "spin_us": t.candidate.spin_us if t else None,
        "speedup": r.speedup, "stages": r.stages,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="fewer shapes, no repeatability runs")
    parser.add_argument("--only", default=None, help="only expert files whose name contains this")
    parser.add_argument("--shapes", default=None, help="comma-separated shapes to run (default: each expert's list)")
    parser.add_argument("--skip-extras", action="store_true", help="no deadlock and repeatability runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    suite = load_suite()
    config = EvalConfig(trials=3, timing=TimingConfig(), use_reference_cache=False)
    rows = []
    for name, rel, shapes in EXPERTS:
        if args.only and args.only not in rel:
            continue
        problem = get(suite, name)
        if args.shapes:
            shapes = [s for s in args.shapes.split(",") if s in problem.shapes]
        for shape in shapes[:2] if args.quick else shapes:
            started = time.perf_counter()
            r = evaluate(problem, SOL / rel, world_size=args.world_size, device="cuda", shape=shape, config=config)
            d = row(r)
            d["wall_s"] = time.perf_counter() - started
            rows.append(d)
            print(json.dumps({k: d[k] for k in ("problem", "shape", "candidate", "verdict", "ref_median_us",
                                                  "cand_median_us", "speedup", "wall_s", "message")}), flush=True)
            if d["evidence"]:
                print(d["evidence"], flush=True)
    (args.out / "experts.json").write_text(json.dumps(rows, indent=1))

    if args.skip_extras:
        print_table(rows)
        return 0
    # Deadlock on GPU: killed within its limit, and the next evaluation on the same GPUs succeeds.
    hang = ROOT / "tests" / "candidates" / "deadlock_rank1.py"
    started = time.perf_counter()
    r = evaluate(get(suite, "all_reduce"), hang, world_size=args.world_size, device="cuda", shape="decode",
                 config=EvalConfig(trials=2, limits=Limits(check_s=20)))
    dead = {"verdict": r.verdict, "wall_s": time.perf_counter() - started, "stages": r.stages}
    r2 = evaluate(get(suite, "all_reduce"), SOL / EXPERTS[0][1], world_size=args.world_size, device="cuda",
                  shape="decode", config=config)
    dead["next_verdict"] = r2.verdict
    print("deadlock:", json.dumps(dead), flush=True)
    (args.out / "deadlock.json").write_text(json.dumps(dead, indent=1))

    if not args.quick:
        # Repeatability: the same candidate, 3 separate `pkb eval` processes.
        reps = []
        for shape in ("decode", "default"):
            medians = []
            for _ in range(3):
                out = subprocess.run([sys.executable, "-m", "agent.cli", "eval", "--problem", "all_reduce",
                                      "--solution", str(SOL / EXPERTS[0][1]), "--device", "cuda", "--shape", shape,
                                      "--world-size", str(args.world_size), "--json"],
                                     capture_output=True, text=True, cwd=ROOT)
                res = json.loads(out.stdout)
                medians.append({"cand_us": res["timings"]["candidate"]["median_ms"] * 1e3,
                                "cand_cv": res["timings"]["candidate"]["cv"],
                                "ref_us": res["timings"]["reference"]["median_ms"] * 1e3,
                                "ref_cached": res["timings"]["reference"]["cached"],
                                "stages": res["stages"]})
            c = [m["cand_us"] for m in medians]
            reps.append({"shape": shape, "runs": medians,
                         "spread": (max(c) - min(c)) / statistics.median(c)})
            print("repeatability:", json.dumps(reps[-1]), flush=True)
        (args.out / "repeatability.json").write_text(json.dumps(reps, indent=1))

    print_table(rows)
    return 0


def print_table(rows: list[dict]) -> None:
    print("\n| problem | shape | candidate | verdict | NCCL ref µs | expert µs | speedup | eval s |")
    print("|---|---|---|---|---|---|---|---|")
    for d in rows:
        ref = f"{d['ref_median_us']:.1f}" if d["ref_median_us"] else "-"
        cand = f"{d['cand_median_us']:.1f}" if d["cand_median_us"] else "-"
        sp = f"{d['speedup']:.2f}" if d["speedup"] else "-"
        print(f"| {d['problem']} | {d['shape']} | {d['candidate']} | {d['verdict']} | {ref} | {cand} | {sp} | "
              f"{d['wall_s']:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
