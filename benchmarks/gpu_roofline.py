"""The roofline on GPUs: bound, binding resource and the fraction reached by the NCCL references and the
expert solutions; then `pkb profile` with Nsight Compute on one expert, trying the ways ncu can run.

    python benchmarks/gpu_roofline.py --out OUTDIR [--world-size 2] [--calibrate] [--quick]
                                      [--skip-roofline] [--skip-ncu] [--ncu-budget 60]

--calibrate first runs `pkb topology --calibrate` so the ceilings are measured here (else the cached
profile, else discovery's NVLink-spec and datasheet figures). Prints markdown tables and writes
roofline.json and ncu.json to OUTDIR.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import EvalConfig, TimingConfig  # noqa: E402
from harness.evaluate import evaluate  # noqa: E402
from harness.launch.pool import Hang, PoolError, RankPool  # noqa: E402
from harness.measure import ncu as nsight  # noqa: E402
from harness.measure.profiling import ProfileError, profile  # noqa: E402
from harness.measure.roofline import (  # noqa: E402
    RooflineError,
    resolve_ceilings,
    roofline,
    time_reference,
    trace_reference,
)
from harness.problems.registry import get, load_suite  # noqa: E402
from tools.summaries import fmt_bytes, fmt_time, ncu_lines, profile_text  # noqa: E402  (the text the tools show)

SOLUTIONS = [ROOT / "problems" / "collective" / "solutions", ROOT / "problems" / "tensor" / "solutions"]
# NCCL references: every collective problem at its default shape, all_reduce across sizes up to 1 GiB.
REFERENCE_SHAPES = {"all_reduce": ["decode", "1mib", "default", "large", "1gib"]}
EXTRA_REFERENCES = ["all_reduce_residual_rmsnorm"]
EXPERT_SHAPES = {"all_reduce": ["1mib", "default", "1gib"], "all_reduce_residual_rmsnorm": ["default", "prefill"]}
NCU_EXPERT = ("all_reduce", "collective/solutions/all_reduce__one_shot.py", "default")
NCU_VARIANTS = [  # (label, metric sets, replay mode): which way works on this machine
    ("application replay, sets core+throughput", ["core", "throughput"], "application"),
    ("application replay, every metric in one run", [m for s in nsight.DEFAULT_SETS for m in nsight.METRIC_SETS[s]],
     "application"),
    ("kernel replay, set core", ["core"], "kernel"),
]


def expert_files() -> list[tuple[str, Path]]:
    """(problem, file) of every expert solution: the file is named <problem>__<variant>.py."""
    found = []
    for folder in SOLUTIONS:
        for path in sorted(folder.glob("*.py")):
            if "__" in path.stem:
                found.append((path.stem.split("__")[0], path))
    return found


def row_of(r, side: str, seconds: float) -> dict:
    timed = r.candidate if side != "NCCL reference" else r.reference
    return {"problem": r.problem, "shape": r.shape, "side": side, "bound_us": r.bound_s * 1e6, "binding": r.binding,
            "traffic": r.traffic_source, "send_mib": r.send_bytes / 2**20, "recv_mib": r.recv_bytes / 2**20,
            "hbm_mib": r.hbm_bytes / 2**20, "gflop": r.flops / 1e9,
            "median_us": timed.median_ms * 1e3 if timed else None, "fraction": timed.fraction if timed else None,
            "impossible": bool(timed and timed.impossible), "flags": r.flags, "seconds": seconds,
            "ceilings": {k: v for k, v in r.ceilings.model_dump().items() if k != "notes"}}


def run_rooflines(args: argparse.Namespace) -> list[dict]:
    suite = load_suite()
    ceilings = resolve_ceilings(device="cuda")
    print(f"ceilings: link {ceilings.link_bytes_per_s / 1e9:.0f} GB/s ({ceilings.link_source}), HBM "
          f"{ceilings.hbm_bytes_per_s / 1e12:.2f} TB/s ({ceilings.hbm_source}), bf16 "
          f"{ceilings.matmul_flops_per_s / 1e12:.0f} TFLOP/s ({ceilings.matmul_source}); {ceilings.notes}", flush=True)
    timing = TimingConfig(warmup=5, iters=30, host_iters=5) if args.quick else TimingConfig()
    jobs = [(p, s) for p in suite if p.category == "collective" and p.supports(args.world_size)
            for s in REFERENCE_SHAPES.get(p.name, ["default"])]
    jobs += [(get(suite, name), "default") for name in EXTRA_REFERENCES]
    if args.quick:
        jobs = [(p, s) for p, s in jobs if s in ("default", "1gib")]
    rows, traces = [], {}
    pool: RankPool | None = None
    for problem, shape in jobs:
        started = time.perf_counter()
        try:
            pool = pool or RankPool(args.world_size, "cuda").start()
            traced = trace_reference(problem, shape, args.world_size, "cuda", pool=pool)
            traces[(problem.name, shape)] = traced
            ref = time_reference(pool, problem, shape, "cuda", config=timing.model_dump())
            r = roofline(problem, shape, args.world_size, "cuda", ceilings, reference_result=ref, traced=traced)
            rows.append(row_of(r, "NCCL reference", time.perf_counter() - started))
        except (RooflineError, PoolError, Hang) as err:
            pool = None  # a failed request kills the pool: the next job starts a fresh one
            rows.append({"problem": problem.name, "shape": shape, "side": "NCCL reference",
                         "error": str(err)[:400]})
        print(json.dumps(rows[-1]), flush=True)
    if pool is not None:
        pool.close()
    config = EvalConfig(trials=3, timing=timing, use_reference_cache=False)
    for name, path in expert_files():
        problem = get(suite, name)
        for shape in EXPERT_SHAPES.get(name, ["default"]):
            if args.quick and shape not in ("default", "1gib"):
                continue
            started = time.perf_counter()
            try:
                result = evaluate(problem, path, world_size=args.world_size, device="cuda", shape=shape, config=config)
                if not result.correct:
                    raise RooflineError(result.summary_line())
                traced = traces.get((name, shape)) or trace_reference(problem, shape, args.world_size, "cuda")
                r = roofline(problem, shape, args.world_size, "cuda", ceilings, candidate_result=result, traced=traced)
                rows.append(row_of(r, path.name, time.perf_counter() - started))
            except RooflineError as err:
                rows.append({"problem": name, "shape": shape, "side": path.name, "error": str(err)[:400]})
            print(json.dumps(rows[-1]), flush=True)
    (args.out / "roofline.json").write_text(json.dumps(rows, indent=1))
    print("\n| problem | shape | side | bound µs | binds | send MiB | median µs | fraction | flags |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in rows:
        if "error" in d:
            print(f"| {d['problem']} | {d['shape']} | {d['side']} | FAILED: {d['error'][:120]} | | | | | |")
            continue
        median = f"{d['median_us']:.1f}" if d["median_us"] else "-"
        fraction = f"{d['fraction']:.1%}" if d["fraction"] else "-"
        print(f"| {d['problem']} | {d['shape']} | {d['side']} | {d['bound_us']:.1f} | {d['binding']} | "
              f"{d['send_mib']:.2f} | {median} | {fraction} | {', '.join(d['flags'])} |")
    return rows


def run_ncu(args: argparse.Namespace) -> list[dict]:
    suite = load_suite()
    name, rel, shape = NCU_EXPERT
    problem, path = get(suite, name), ROOT / "problems" / rel
    print(f"\nncu on PATH: {nsight.ncu_path()}", flush=True)
    if nsight.ncu_path():
        subprocess.run(["ncu", "--version"], check=False)
    out: list[dict[str, Any]] = []
    # 1. What `pkb profile --ncu` does by default, end to end, with the 60 s budget.
    started = time.perf_counter()
    try:
        report = profile(problem, path, world_size=args.world_size, device="cuda", shape=shape, ncu=True,
                         ncu_budget_s=args.ncu_budget)
        wall = time.perf_counter() - started
        print(f"\n== pkb profile {rel} --shape {shape} --ncu (budget {args.ncu_budget:.0f} s): {wall:.1f} s wall, "
              f"ncu {report.ncu.seconds:.1f} s ==")
        print(profile_text(report))
        out.append({"variant": "pkb profile default", "wall_s": wall, "report": report.to_dict()})
    except ProfileError as err:
        print(f"pkb profile failed: {err.verdict}: {err}\n{err.evidence}")
        out.append({"variant": "pkb profile default", "error": str(err)})
    # 2. The other ways, ncu only, to find out which works here.
    if not args.quick:
        for label, metrics, replay in NCU_VARIANTS[1:]:
            rep = nsight.collect(problem, path, world_size=args.world_size, device="cuda", shape=shape,
                                 budget_s=args.ncu_budget, metrics=metrics, replay=replay)
            out.append({"variant": label, "report": asdict(rep)})
            print(f"\n== {label}: {rep.status} in {rep.seconds:.1f} s ==")
            print("\n".join(ncu_lines(rep)))
            for run in rep.runs:
                print(f"   run {run.metric_set}: {run.status}, {run.seconds:.1f} s, passes {run.passes}, "
                      f"{run.message[:300]}")
    (args.out / "ncu.json").write_text(json.dumps(out, indent=1, default=str))
    print("\n| variant | status | seconds | NVLink sent/call | NVLink received/call | GPU time/call | missing |")
    print("|---|---|---|---|---|---|---|")
    for d in out:
        row = d.get("report") or {}
        ncu = (row.get("ncu") if "ranks" in row else row) or {}
        per = ncu.get("per_call", {})
        gpu = per.get("gpu__time_duration.sum")
        print(f"| {d['variant']} | {ncu.get('status', d.get('error', '?'))} | {ncu.get('seconds', 0):.1f} | "
              f"{fmt_bytes(per['nvltx__bytes.sum']) if 'nvltx__bytes.sum' in per else '-'} | "
              f"{fmt_bytes(per['nvlrx__bytes.sum']) if 'nvlrx__bytes.sum' in per else '-'} | "
              f"{fmt_time(gpu / 1e9) if gpu else '-'} | {len(ncu.get('missing', {}))} |")
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--calibrate", action="store_true", help="run `pkb topology --calibrate` first")
    parser.add_argument("--quick", action="store_true", help="default and 1 GiB shapes only; one ncu variant")
    parser.add_argument("--skip-roofline", action="store_true")
    parser.add_argument("--skip-ncu", action="store_true")
    parser.add_argument("--ncu-budget", type=float, default=60.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.calibrate:
        # benchmarks/calibrate.py measures and caches the profile like `pkb topology --calibrate`, with the
        # harness's imports only (the GPU node has no agent dependencies).
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "calibrate.py"), "--out", str(args.out)],
                       cwd=ROOT, check=False)
    if not args.skip_roofline:
        run_rooflines(args)
    if not args.skip_ncu:
        run_ncu(args)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
