"""Where a PKB candidate's cold build spends its time, and how long the harness's compile stage takes over a
whole recorded set at a given concurrency (issue 30). One command, a wall budget, results in --out.

    python benchmarks/gpu_build_time.py --checkout .pkb/first \\
        --set .pkb/first/solutions_cuda_bf16_h100_8_openai_gpt-5.5 --out $OUT --concurrency 16 --budget-s 500
    python benchmarks/gpu_build_time.py ... --phases-only            # the three kernels only
    python benchmarks/gpu_build_time.py ... --dry-run                 # CPU: the plumbing, builds skipped

1. Phases: each of --kernels (default: GPT-5.5's 1_allreduce, 2_allgather, 13_gemm_allreduce) built cold and
   alone through torch's load_inline exactly as PKB's compile_cuda_extension calls it (TORCH_CUDA_ARCH_LIST
   9.0, -O3, a fresh TORCH_EXTENSIONS_DIR, no compiler cache), with nvcc's own per-step times
   (NVCC_APPEND_FLAGS=--time: cudafe++, cicc, ptxas, the host compile) and the binding side (main.cpp);
   wall and CPU seconds of the whole build.
2. The set: the harness's compile stage (harness.compiling.compile.compile_candidate: syntax, the sandboxed import, the
   builds it discovers) on every file, --concurrency at once, with an empty compile cache: seconds per file
   (median, p90), and each file's verdict (ok, or compile_error with the compiler's first error line), which
   --compare OLD.json checks file by file against an earlier run of this script.

Writes OUT/build_time.json and OUT/build_time.md; prints the tables last.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_KERNELS = ("1_allreduce_cuda.py", "2_allgather_cuda.py", "13_gemm_allreduce_cuda.py")

# One build in a child: the file's module-level CUDA source through load_inline, as PKB's helper calls it.
_CHILD = r"""
import ast, json, os, sys, time
path, out = sys.argv[1], sys.argv[2]
tree = ast.parse(open(path).read())
strings = [n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
           and isinstance(n.value.value, str) and "__global__" in n.value.value]
started = time.perf_counter()
row = {"file": os.path.basename(path)}
if not strings:
    row["error"] = "no module-level CUDA source"
else:
    from torch.utils.cpp_extension import load_inline
    try:
        load_inline(name="probe_" + row["file"].split("_")[0], cpp_sources="", cuda_sources=strings[0],
                    extra_cuda_cflags=["-O3"], with_cuda=True, verbose=True)
        row["ok"] = True
    except Exception as exc:
        row["ok"] = False
        row["error"] = str(exc)[-1500:]
row["wall_s"] = round(time.perf_counter() - started, 2)
open(out, "w").write(json.dumps(row))
"""


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def phases(kernel: Path, scratch: Path, dry: bool) -> dict[str, Any]:
    """One cold load_inline build, alone, with nvcc's step times and the CPU seconds of everything it ran."""
    folder = Path(tempfile.mkdtemp(prefix="build-", dir=scratch))
    times = folder / "nvcc_time.csv"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(folder / "ext"), "TORCH_CUDA_ARCH_LIST": "9.0",
           "TORCH_NO_COMPILER_WRAPPER": "1", "NVCC_APPEND_FLAGS": f"--time {times}"}
    if dry:
        return {"file": kernel.name, "skipped": "dry run"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = folder / "row.json"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(kernel), str(out)], env=env, capture_output=True,
                          text=True, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    row: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"file": kernel.name,
                                                                           "error": proc.stderr[-1500:]}
    row["wall_s"] = round(time.perf_counter() - started, 2)
    row["cpu_s"] = round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2)
    if times.exists():
        steps: dict[str, float] = {}
        with times.open() as f:
            for rec in csv.reader(f):
                if len(rec) >= 8 and rec[-1].strip() == "ms":
                    name = rec[1].strip()
                    steps[name] = round(steps.get(name, 0.0) + float(rec[-2]) / 1000.0, 2)
        row["nvcc_steps_s"] = steps
    log = next((folder / "ext").rglob("build.ninja"), None)
    row["binding"] = "main.cpp (torch/extension.h through the host compiler)" if log else None
    shutil.rmtree(folder, ignore_errors=True)
    return row


def compile_stage(path: Path, problem: str, limit: float) -> dict[str, Any]:
    from harness.compiling.compile import compile_candidate

    started = time.perf_counter()
    try:
        outcome = compile_candidate(path, limit, "cuda", problem=problem)
    except Exception as exc:  # the harness failed on this file: that is a row, not the end of the run
        return {"file": path.name, "verdict": "harness error", "message": f"{type(exc).__name__}: {exc}"[:300],
                "seconds": round(time.perf_counter() - started, 2)}
    first = next((line for line in (outcome.message + "\n" + outcome.evidence).splitlines()
                  if "error" in line.lower()), outcome.message.splitlines()[0] if outcome.message else "")
    return {"file": path.name, "verdict": "ok" if outcome.ok else outcome.verdict, "message": first[:300],
            "seconds": round(time.perf_counter() - started, 2), "cached": outcome.cached,
            "builds": [{"name": b.get("name"), "seconds": b.get("seconds"), "ok": b.get("ok")}
                       for b in outcome.builds]}


def whole_set(args: argparse.Namespace, deadline: float) -> list[dict[str, Any]]:
    sys.path.insert(0, str(REPO))
    from harness.problems.parallelkernelbench import checkout, solutions

    problems = {p.name: p for p in checkout.list_problems(args.checkout)}
    # Each file's problem as the replay pairs it (older numbering, renames): its checkout must be importable.
    specs = {m.file: problems[m.problem].loader_spec for m in solutions.match_solution_set(list(problems.values()),
                                                                                          args.set)
             if m.problem in problems}
    files = sorted(args.set.glob("*.py"), key=lambda p: (int(p.name.split("_")[0]), p.name))
    if args.limit is not None:
        files = files[:args.limit]
    rows: list[dict[str, Any]] = []

    def one(path: Path) -> dict[str, Any]:
        if time.monotonic() > deadline:
            return {"file": path.name, "verdict": "not run (budget)"}
        spec = specs.get(path.name)
        if args.dry_run:
            return {"file": path.name, "verdict": "dry run", "problem": spec}
        return compile_stage(path, spec or "", args.limit_s)

    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        for row in pool.map(one, files):
            rows.append(row)
            print(f"{row['file']}: {row['verdict']} {row.get('seconds', '')}", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", type=Path, required=True)
    parser.add_argument("--set", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kernels", nargs="*", default=list(DEFAULT_KERNELS))
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--budget-s", type=float, default=500.0, help="no new build starts after this")
    parser.add_argument("--limit-s", type=float, default=600.0, help="the compile stage's limit per file")
    parser.add_argument("--limit", type=int, default=None, help="only the first N files of the set")
    parser.add_argument("--phases-only", action="store_true")
    parser.add_argument("--compare", type=Path, default=None, help="an earlier build_time.json: verdicts per file")
    parser.add_argument("--dry-run", action="store_true", help="no builds (CPU): check the plumbing")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + args.budget_s
    scratch = Path(tempfile.mkdtemp(prefix="pkb-build-time-"))
    cache = scratch / "cache"
    os.environ["PKB_CACHE_DIR"] = str(cache)  # an empty compile cache: every build is cold
    try:
        phase_rows = [phases(args.set / name, scratch, args.dry_run) for name in args.kernels]
        for row in phase_rows:
            print(json.dumps(row), flush=True)
        set_rows = [] if args.phases_only else whole_set(args, deadline)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    built = [float(r["seconds"]) for r in set_rows if r.get("verdict") in ("ok", "compile_error") and "seconds" in r]
    summary = {"concurrency": args.concurrency, "files": len(set_rows), "timed": len(built),
               "median_s": _percentile(built, 0.5), "p90_s": _percentile(built, 0.9),
               "verdicts": {v: sum(1 for r in set_rows if r.get("verdict") == v)
                            for v in sorted({str(r.get("verdict")) for r in set_rows})},
               "wall_s": round(time.monotonic() - started, 1)}
    changed = []
    if args.compare is not None and args.compare.exists():
        old = {r["file"]: r for r in json.loads(args.compare.read_text()).get("set", [])}
        for r in set_rows:
            before = old.get(r["file"])
            if before and (before.get("verdict"), before.get("message")) != (r.get("verdict"), r.get("message")):
                changed.append({"file": r["file"], "before": before.get("verdict"), "after": r.get("verdict")})
        summary["verdicts_changed"] = changed
    (args.out / "build_time.json").write_text(json.dumps({"phases": phase_rows, "set": set_rows,
                                                          "summary": summary}, indent=1))
    lines = ["| kernel | ok | wall s | CPU s | nvcc steps (s) |", "|---|---|---|---|---|"]
    for r in phase_rows:
        steps = ", ".join(f"{k} {v}" for k, v in (r.get("nvcc_steps_s") or {}).items())
        lines.append(f"| {r['file']} | {r.get('ok', r.get('skipped', ''))} | {r.get('wall_s', '')} | "
                     f"{r.get('cpu_s', '')} | {steps} |")
    lines += ["", f"Set: {summary['files']} files at concurrency {args.concurrency}: median {summary['median_s']} s, "
                  f"p90 {summary['p90_s']} s per compile stage; verdicts {summary['verdicts']}; "
                  f"wall {summary['wall_s']} s" + (f"; verdicts changed: {len(changed)}" if args.compare else "")]
    (args.out / "build_time.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
