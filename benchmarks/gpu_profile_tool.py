"""The agent's `profile` tool on a GPU: its answer for expert kernels (EXPERTS), with Nsight Compute's counters, and how
long it takes; the raw Nsight Compute exports are kept as test fixtures.

    python benchmarks/gpu_profile_tool.py --out OUTDIR [--world-size 2] [--ranks-per-gpu auto] [--shape default]
    python benchmarks/gpu_profile_tool.py --out OUTDIR --dry-run     # CPU: the same plumbing, no GPU, no Nsight

The tool runs as the agent runs it (tools.dispatch.run_tool("profile", {"source": ...}, ctx)): every rank's
timeline, then one rank under `ncu` (kernel replay, `--clock-control none`) while the other runs free, and
Nsight Systems where nsys is installed. With fewer GPUs than ranks the ranks share one (`--ranks-per-gpu`
auto: W on one GPU; harness.emulation), as on the one-H200 machine. The experts are built first, both at once.

Writes into OUTDIR: results.json (per expert: the tool's answer, wall seconds, the Nsight statuses and
timings, the machine's ncu / nsys), results.md (a table), answers/<expert>.txt (the text the model reads),
ncu/<expert>/agent.csv and .ncu-rep (the raw export: copy agent.csv to
tests/fixtures/ncu/recorded_<expert>.csv), nsys/<expert>/ where nsys ran. Prints the table last.
Needs pydantic (and its dependencies) besides torch; nothing of the model stack.
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.compiling.compile import compile_candidate  # noqa: E402
from harness.config import EvalConfig, Limits, TimingConfig  # noqa: E402
from harness.measure import ncu, nsys  # noqa: E402
from harness.problems.registry import get, load_suite  # noqa: E402
from tools import profile as profile_tool  # noqa: E402
from tools.base import ToolContext, ToolSettings  # noqa: E402
from tools.dispatch import run_tool  # noqa: E402

# On one GPU (2026-12-02, docs/profiling.md): the one-shot all-reduce survives ncu's replay; the copy-engine two-shot
# does once the emulation's barrier kernels are left out of the profile (harness.measure.ncu.NOT_PROFILED); the
# pull all-gather waits on its peer inside its own kernel, so its replay never finishes and the tool counts it
# again in one pass (harness.measure.ncu.ONE_PASS).
EXPERTS = [("all_reduce", "problems/collective/solutions/all_reduce__one_shot.py"),
           ("all_reduce", "problems/collective/solutions/all_reduce__two_shot_copy_engine.py"),
           ("all_gather", "problems/collective/solutions/all_gather__pull.py")]
DRY_CANDIDATE = ("all_reduce", "tests/candidates/correct_all_gather_sum.py")  # PyTorch only: runs on CPU


def machine() -> dict[str, Any]:
    found: dict[str, Any] = {"ncu": ncu.ncu_path(), "nsys": nsys.find_nsys(),
                             "nsys_looked_in": ["PATH", *nsys.SEARCH],
                             "nsys_candidates": sorted({p for pat in nsys.SEARCH for p in glob.glob(pat)})}
    if found["ncu"]:
        try:
            found["ncu_version"] = subprocess.run([found["ncu"], "--version"], capture_output=True, text=True,
                                                  timeout=60).stdout.strip().splitlines()[-1:]
        except (OSError, subprocess.TimeoutExpired) as err:
            found["ncu_version"] = f"unknown ({err})"
    try:
        import torch

        found["torch"] = torch.__version__
        found["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as err:  # report, do not fail: the table says what ran
        found["torch"] = f"unavailable ({err})"
    return found


def profile_one(problem_name: str, file: Path, *, device: str, world_size: int, ranks_per_gpu: int, shape: str,
                out: Path) -> dict[str, Any]:
    problem = get(load_suite(), problem_name)
    config = EvalConfig(trials=2, timing=TimingConfig.for_device(device), limits=Limits(check_s=120),
                        **({"ranks_per_gpu": ranks_per_gpu} if ranks_per_gpu > 1 else {}))
    stem = file.stem
    gpus = [rank // ranks_per_gpu for rank in range(world_size)] if device == "cuda" else None
    ctx = ToolContext(problem=problem, settings=ToolSettings(world_size, device, shape, answer_tokens=600),
                      config=config, workdir=out / "samples" / stem, gpus=gpus, artifacts_dir=out / "kept" / stem)
    started = time.perf_counter()
    outcome = run_tool("profile", {"source": file.read_text()}, ctx)
    seconds = time.perf_counter() - started
    result = (outcome.data or {}).get("result") or {}
    ncu_data, nsys_data = result.get("ncu") or {}, result.get("nsys") or {}
    (out / "answers").mkdir(parents=True, exist_ok=True)
    (out / "answers" / f"{stem}.txt").write_text(outcome.text + "\n")
    for kind in ("ncu", "nsys"):  # the raw exports, where the tool kept them
        kept = out / "kept" / stem / kind
        if kept.is_dir():
            shutil.copytree(kept, out / kind / stem, dirs_exist_ok=True)
    direct: dict[str, Any] | None = None
    if device == "cuda" and not ncu_data:  # the tool did not reach Nsight (its timeline failed): ncu alone, once
        t0 = time.perf_counter()
        report = ncu.collect(problem, file, world_size=world_size, device=device, shape=shape, seed=config.seed,
                             budget_s=profile_tool.NCU_BUDGET_S, metrics=ncu.AGENT_SETS, gpus=gpus,
                             ranks_per_gpu=ranks_per_gpu, keep_dir=out / "ncu" / stem)
        direct = {"status": report.status, "seconds": round(time.perf_counter() - t0, 1),
                  "missing": dict(list(report.missing.items())[:3]),
                  "runs": [{"status": r.status, "seconds": round(r.seconds, 1), "message": r.message[:300]}
                           for r in report.runs]}
    return {"expert": stem, "problem": problem_name, "shape": shape, "world_size": world_size,
            "ranks_per_gpu": ranks_per_gpu, "device": device, "tool_seconds": round(seconds, 1),
            "profile_seconds": round(float(result.get("seconds") or 0.0), 1),
            "ncu_status": ncu_data.get("status"), "ncu_seconds": round(float(ncu_data.get("seconds") or 0.0), 1),
            "ncu_runs": [{k: r.get(k) for k in ("metric_set", "status", "seconds", "passes", "message")}
                         for r in ncu_data.get("runs") or []],
            "ncu_missing": ncu_data.get("missing"), "nsys_status": nsys_data.get("status"),
            "nsys_message": nsys_data.get("message"), "nsys_seconds": round(float(nsys_data.get("seconds") or 0.0), 1),
            "kernel_summary": result.get("kernel_summary"), "ceilings": result.get("ceilings"),
            "error": (outcome.data or {}).get("error"), "verdict": (outcome.data or {}).get("verdict"),
            "ncu_without_the_tool": direct,
            "answer": outcome.text, "answer_chars": len(outcome.text)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--ranks-per-gpu", default="auto", help="auto: W on one GPU when there are fewer GPUs than W")
    parser.add_argument("--shape", default="default")
    parser.add_argument("--dry-run", action="store_true", help="CPU: the tool on a PyTorch-only candidate, no Nsight")
    parser.add_argument("--expert", action="append", default=[], metavar="PROBLEM=FILE",
                        help="profile this expert instead of EXPERTS (repeatable), e.g. "
                             "all_reduce=problems/collective/solutions/all_reduce__two_shot.py")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    found = machine()
    print(json.dumps({"machine": found}), flush=True)
    if args.dry_run:
        device, shape, rpg, jobs = "cpu", "small", 1, [DRY_CANDIDATE]
    else:
        import torch

        device, shape = "cuda", args.shape
        jobs = [tuple(e.split("=", 1)) for e in args.expert] or EXPERTS
        visible = torch.cuda.device_count()
        rpg = (args.world_size if visible < args.world_size else 1) if args.ranks_per_gpu == "auto" \
            else int(args.ranks_per_gpu)
        suite = load_suite()
        built_at = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:  # all builds at once, before any rank starts
            built = list(pool.map(lambda job: compile_candidate(ROOT / job[1], 600.0, "cuda",
                                                                problem=get(suite, job[0]).loader_spec), jobs))
        print(json.dumps({"prebuilt": [b.ok for b in built], "seconds": round(time.perf_counter() - built_at, 1)}),
              flush=True)
    rows = []
    for problem_name, rel in jobs:
        row = profile_one(problem_name, ROOT / rel, device=device, world_size=args.world_size, ranks_per_gpu=rpg,
                          shape=shape, out=args.out)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "answer"}), flush=True)
        (args.out / "results.json").write_text(json.dumps({"machine": found, "rows": rows}, indent=1))
    total = time.perf_counter() - started
    table = ["| expert | shape | W (ranks/GPU) | tool s | ncu | ncu s | nsys | answer (first kernel line) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        first = next((line.strip() for line in r["answer"].splitlines() if line.startswith("  ")), "")
        table.append(f"| {r['expert']} | {r['shape']} | {r['world_size']} ({r['ranks_per_gpu']}) | {r['tool_seconds']} "
                     f"| {r['ncu_status']} | {r['ncu_seconds']} | {r['nsys_status']} | {first[:160]} |")
    (args.out / "results.json").write_text(json.dumps({"machine": found, "rows": rows, "seconds": round(total, 1)},
                                                      indent=1))
    (args.out / "results.md").write_text("\n".join(table) + f"\n\ntotal {total:.0f} s\n")
    for r in rows:
        print(f"\n--- {r['expert']}: the tool's answer ({r['tool_seconds']} s) ---\n{r['answer']}")
    print("\n".join(table))
    print(f"total {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
