"""Every expert solution, and the GPU exploits about synchronisation, through the full harness with W ranks
sharing one GPU (`ranks_per_gpu = W`: gloo, symmetric memory emulated by harness.emulation).

    python benchmarks/gpu_emulation_eval.py --out OUTDIR [--world-sizes 2,4] [--shape small]

Writes OUTDIR/gpu_emulation_eval.json (every evaluation: verdict, flags, wall seconds, stages).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import EvalConfig, Limits, TimingConfig  # noqa: E402
from harness.evaluate import evaluate  # noqa: E402
from harness.problems.registry import get, load_suite  # noqa: E402

EXPLOITS = ["gpu_race_no_barrier.py", "gpu_stale_epoch.py", "gpu_side_stream.py", "gpu_copy_engine_side.py",
            "gpu_illegal_address.py"]


def expectation(path: Path) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EXPECT" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--shape", default="small")
    parser.add_argument("--timing", action="store_true", help="also time (emulated timings are not speedups)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    suite = load_suite()
    rows: list[dict] = []

    def run(problem, path: Path, w: int, expected: str | None) -> None:
        config = EvalConfig(trials=3, timing=TimingConfig.for_device("cuda"), ranks_per_gpu=w,
                            skip_timing=not args.timing, limits=Limits(check_s=60, grace_s=3))
        started = time.perf_counter()
        r = evaluate(problem, path, world_size=w, device="cuda", shape=args.shape, config=config)
        row = {"file": path.name, "problem": problem.name, "world_size": w, "verdict": r.verdict, "flags": r.flags,
               "emulated": r.emulated, "expected": expected, "seconds": round(time.perf_counter() - started, 2),
               "message": r.failure.message[:300] if r.failure else None, "stages": r.stages,
               "sandbox": r.integrity.get("sandbox", {}).get("backend")}
        rows.append(row)
        print(json.dumps(row), flush=True)
        (args.out / "gpu_emulation_eval.json").write_text(json.dumps(rows, indent=1))

    # Build every native extension first, all at once (each in its own sandboxed precompile process): the
    # evaluations then find their builds in the cache.
    from concurrent.futures import ThreadPoolExecutor

    from harness.compiling.compile import compile_candidate

    files = {f: get(suite, f.stem.split("__")[0]).loader_spec for f in sorted(ROOT.glob("problems/*/solutions/*.py"))}
    for name in EXPLOITS:
        path = ROOT / "tests" / "exploits" / name
        files[path] = get(suite, expectation(path)["problem"]).loader_spec
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(files)) as pool:
        built = list(pool.map(lambda f: compile_candidate(f, 600.0, "cuda", problem=files[f]), files))
    print(json.dumps({"prebuilt": sum(b.ok for b in built), "of": len(files),
                      "seconds": round(time.perf_counter() - started, 1)}), flush=True)

    for w in [int(x) for x in args.world_sizes.split(",")]:
        for path in sorted(ROOT.glob("problems/*/solutions/*.py")):
            problem = get(suite, path.stem.split("__")[0])
            if problem.supports(w):
                run(problem, path, w, "correct")
        if w == 2:
            for name in EXPLOITS:
                path = ROOT / "tests" / "exploits" / name
                expect = expectation(path)
                run(get(suite, expect["problem"]), path, w, expect["verdict"])
    ok = sum(r["verdict"] == r["expected"] for r in rows)
    print(json.dumps({"as_expected": ok, "of": len(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
