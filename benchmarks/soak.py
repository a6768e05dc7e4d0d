"""Soak: many evaluations in a row, mixing good, wrong, crashing, hanging, broken and tampering
candidates, in one harness process. Checks after every evaluation that its verdict is right, that no
process it started (at any depth) and no temporary folder is left, and at the end that the
harness's memory (RSS after warm-up against RSS at the end) grew less than 10% and its open file
descriptors did not grow. On CUDA it also reads each GPU's used memory (nvidia-smi) before the first
evaluation and after every one: an allocation left behind by a killed rank would show as growth.

    python benchmarks/soak.py --out OUTDIR                         # CPU: 500 evaluations, gloo, W=2
    python benchmarks/soak.py --n 60 --out OUTDIR                  # a short CPU run
    python benchmarks/soak.py --device cuda --n 50 --deadlocks 10 --out OUTDIR   # the GPU run

Exit status 1 when any check fails. Writes OUTDIR/soak.json (every evaluation and the summary), or
the file itself when --out names a .json file.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import EvalConfig, Limits, TimingConfig  # noqa: E402
from harness.evaluate import evaluate  # noqa: E402
from harness.problems.registry import get, load_suite  # noqa: E402

CANDIDATES = ROOT / "tests" / "candidates"
EXPLOITS = ROOT / "tests" / "exploits"
SOLUTIONS = ROOT / "problems" / "collective" / "solutions"


@dataclass(frozen=True)
class Kind:
    name: str
    path: Path
    verdict: str


def kinds(device: str) -> dict[str, Kind]:
    good = SOLUTIONS / "all_reduce__one_shot.py" if device == "cuda" else CANDIDATES / "correct_all_gather_sum.py"
    crash = EXPLOITS / ("gpu_illegal_address.py" if device == "cuda" else "segfault_rank1.py")
    return {k.name: k for k in (
        Kind("good", good, "correct"),
        Kind("wrong", CANDIDATES / "output_mismatch_rank1.py", "output_mismatch"),
        Kind("crash", crash, "runtime_error"),
        Kind("hang", CANDIDATES / "deadlock_rank1.py", "deadlock"),
        Kind("api", CANDIDATES / "api_error_no_solution.py", "api_error"),
        Kind("tamper", EXPLOITS / "timer_patch.py", "runtime_error"),
    )}


# Ten evaluations: four good, two wrong, one crash, one hang, one broken import, one tampering.
CYCLE = ("good", "wrong", "good", "crash", "good", "hang", "api", "good", "wrong", "tamper")


def schedule(n: int, deadlocks: int | None) -> list[str]:
    """The CYCLE repeated; with `deadlocks`, exactly that many hangs, spread evenly."""
    plan = [CYCLE[i % len(CYCLE)] for i in range(n)]
    if deadlocks is None:
        return plan
    plan = ["good" if k == "hang" else k for k in plan]
    for j in range(min(deadlocks, n)):
        plan[(j * n) // max(deadlocks, 1) + (n // max(deadlocks, 1)) // 2] = "hang"
    return plan


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def gpu_memory_mb() -> list[int] | None:
    """Used memory of every visible GPU in MiB, or None where nvidia-smi is absent or fails."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return [int(x) for x in out.split()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


# A GPU's used memory after an evaluation may exceed the idle figure by this much before it counts as a
# leak: the driver's own bookkeeping moves by a few MiB; a leaked CUDA context holds hundreds.
GPU_SLACK_MB = 64


def leftover_processes(marker: bytes) -> list[int]:
    """Live processes, other than this one, whose environment holds `marker`: everything the harness
    starts inherits it, so this sees grandchildren that left their parent's process group too."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--deadlocks", type=int, default=None, help="exactly this many hangs (default: 1 in 10)")
    parser.add_argument("--check-s", type=float, default=None, help="correctness time limit (what a hang costs)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.n < 20:
        parser.error("--n must be at least 20 (the first 10% are warm-up for the memory check)")
    report = args.out if args.out.suffix == ".json" else args.out / "soak.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp(prefix="pkb-soak-"))
    try:
        return soak(args, private, report)
    finally:
        tempfile.tempdir = None
        shutil.rmtree(private, ignore_errors=True)  # the build and timing caches of this run


def soak(args: argparse.Namespace, private: Path, report: Path) -> int:
    tempfile.tempdir = str(private)  # rank pools make their folders here, so leftovers show
    os.environ.setdefault("PKB_CACHE_DIR", str(private / "cache"))
    marker = f"PKB_SOAK_RUN={private.name}".encode()
    os.environ["PKB_SOAK_RUN"] = private.name  # inherited by every process an evaluation starts

    device, shape = args.device, ("decode" if args.device == "cuda" else "small")
    check_s = args.check_s or (10.0 if device == "cuda" else 3.0)
    config = EvalConfig(trials=3, timing=TimingConfig.for_device(device),
                        limits=Limits(check_s=check_s, grace_s=2.0))
    problem = get(load_suite(), "all_reduce")
    table = kinds(device)
    plan = schedule(args.n, args.deadlocks)
    warmup = max(10, args.n // 10)
    rows: list[dict[str, Any]] = []
    baseline: dict[str, Any] | None = None
    gpu_idle = gpu_memory_mb() if device == "cuda" else None
    started = time.perf_counter()
    for i, name in enumerate(plan):
        kind = table[name]
        t0 = time.perf_counter()
        try:
            result = evaluate(problem, kind.path, world_size=args.world_size, device=device, shape=shape,
                              config=config)
            verdict: str = result.verdict
            message = result.failure.message[:200] if result.failure else ""
        except Exception as exc:  # the harness itself broke: that is a soak failure, keep going
            verdict, message = "harness_exception", f"{type(exc).__name__}: {exc}"[:200]
        seconds = time.perf_counter() - t0
        children = leftover_processes(marker)
        leftovers = sorted(p.name for p in private.iterdir() if p.name != "cache")
        gc.collect()
        gpu_mb = gpu_memory_mb() if gpu_idle is not None else None
        gpu_leak = gpu_mb is not None and gpu_idle is not None and any(
            now > idle + GPU_SLACK_MB for now, idle in zip(gpu_mb, gpu_idle))
        row = {"i": i, "kind": name, "expected": kind.verdict, "verdict": verdict, "ok": verdict == kind.verdict,
               "seconds": round(seconds, 2), "rss_mb": round(rss_mb(), 1), "fds": open_fds(),
               "children": children, "leftovers": leftovers, "gpu_mb": gpu_mb, "gpu_leak": gpu_leak,
               "message": message}
        rows.append(row)
        if i + 1 == warmup:
            baseline = {"rss_mb": row["rss_mb"], "fds": row["fds"]}
        bad = not row["ok"] or children or leftovers or gpu_leak
        gpu_note = f" gpu {'/'.join(map(str, gpu_mb))} MiB" if gpu_mb is not None else ""
        print(f"{i + 1:4d}/{args.n} {name:6s} {verdict:16s} {'ok ' if not bad else 'BAD'} {seconds:5.1f}s "
              f"rss {row['rss_mb']:.0f} MB fds {row['fds']}{gpu_note}" + (f"  {message}" if bad else ""),
              flush=True)

    end = rows[-1]
    assert baseline is not None
    growth = (end["rss_mb"] - baseline["rss_mb"]) / baseline["rss_mb"]
    wrong = [r for r in rows if not r["ok"]]
    leaked = [r for r in rows if r["children"] or r["leftovers"] or r["gpu_leak"]]
    per_kind: dict[str, dict[str, Any]] = {}
    for name in table:
        mine = [r for r in rows if r["kind"] == name]
        if mine:
            per_kind[name] = {"n": len(mine), "right": sum(r["ok"] for r in mine),
                              "median_s": round(statistics.median(r["seconds"] for r in mine), 2)}
    summary = {
        "device": device, "world_size": args.world_size, "n": args.n, "wall_s": round(time.perf_counter() - started, 1),
        "verdicts_right": len(rows) - len(wrong), "wrong": [(r["i"], r["kind"], r["verdict"]) for r in wrong],
        "evaluations_leaving_processes_or_folders": len(leaked),
        "gpu_mb_idle": gpu_idle, "gpu_mb_end": end["gpu_mb"],
        "rss_mb_after_warmup": baseline["rss_mb"], "rss_mb_end": end["rss_mb"], "rss_growth": round(growth, 4),
        "fds_after_warmup": baseline["fds"], "fds_end": end["fds"], "per_kind": per_kind,
    }
    passed = not wrong and not leaked and growth < 0.10 and end["fds"] <= baseline["fds"]
    summary["passed"] = passed
    tmp = report.with_suffix(".json.tmp")  # atomic: a reader never sees half a report
    tmp.write_text(json.dumps({"summary": summary, "evaluations": rows}, indent=1))
    tmp.replace(report)
    print("\n" + json.dumps(summary, indent=1))
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
