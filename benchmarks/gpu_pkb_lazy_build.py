"""`pkb eval` of a PKB solution whose kernel builds lazily inside `solution()` (through the checkout's
compile_cuda_extension), twice: with an empty extension cache (cold) and again (warm). Shows the build
seconds reported apart from the verdict, and the verdict the same both times.

    python benchmarks/gpu_pkb_lazy_build.py CHECKOUT SOLUTION --out OUTDIR [--ranks-per-gpu N] [--world-size W]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import EvalConfig, Limits, TimingConfig  # noqa: E402
from harness.evaluate import evaluate  # noqa: E402
from harness.problems.parallelkernelbench import checkout  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path)
    parser.add_argument("solution", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--ranks-per-gpu", type=int, default=1)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    matches = None
    stem = args.solution.name.rsplit("_", 1)[0]
    problem = next(p for p in checkout.list_problems(args.checkout) if p.name == stem)
    rows = []
    for label in ("cold", "warm"):
        config = EvalConfig(trials=3, timing=TimingConfig.for_device("cuda"), ranks_per_gpu=args.ranks_per_gpu,
                            limits=Limits(compile_s=600, check_s=120))
        started = time.perf_counter()
        r = evaluate(problem, args.solution, world_size=args.world_size, device="cuda", shape="small", config=config)
        row = {"cache": label, "verdict": r.verdict, "flags": r.flags,
               "seconds": round(time.perf_counter() - started, 2), "stages": r.stages,
               "builds": r.integrity.get("builds"), "message": r.failure.message[:400] if r.failure else None,
               "speedup": r.speedup, "emulated": r.emulated}
        rows.append(row)
        print(json.dumps(row), flush=True)
        (args.out / "gpu_pkb_lazy_build.json").write_text(json.dumps({"matches": matches, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
