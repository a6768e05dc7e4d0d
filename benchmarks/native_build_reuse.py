"""Whether a native candidate's build, made ahead by the compile stage, is reused by the ranks: one C++
load_inline candidate in PKB's format (the oddities fixture) through harness.evaluate on CPU, with a fresh
cache, untimed. Prints one JSON line: the verdict, the wall, every stage (`build_in_call` is what the ranks
built inside their first call) and the seconds of the build made ahead.

    python benchmarks/native_build_reuse.py [TREE]     # TREE: a checkout of this project (default: this one)

Run against an older checkout (a `git worktree`) to compare: before 2026-12-02 the ranks rebuilt it
(docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
_parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
_parser.add_argument("tree", nargs="?", type=Path, default=HERE, help="a checkout of this project")
TREE = _parser.parse_args().tree.resolve()
if not (TREE / "harness" / "evaluate.py").is_file():
    _parser.error(f"{TREE} is not a checkout of this project (no harness/evaluate.py)")
sys.path.insert(0, str(TREE))
os.environ["PKB_CACHE_DIR"] = tempfile.mkdtemp(prefix="pkb-build-reuse-")

from harness.config import EvalConfig  # noqa: E402
from harness.evaluate import evaluate  # noqa: E402
from harness.problems.registry import load_problem_spec  # noqa: E402

ODD = HERE / "tests" / "fixtures" / "pkb_checkout_oddities"


def main() -> int:
    problem = load_problem_spec(f"pkb:{ODD}::1_all_reduce.py")
    candidate = ODD / "solutions_cuda_bf16_cpu_scripted_oldnumbers" / "1_all_reduce_cuda.py"
    started = time.perf_counter()
    result = evaluate(problem, candidate, world_size=2, device="cpu", shape="small",
                      config=EvalConfig(trials=2, skip_timing=True))
    builds = (result.integrity or {}).get("builds") or []
    print(json.dumps({"tree": str(TREE), "verdict": result.verdict,
                      "wall_s": round(time.perf_counter() - started, 1),
                      "stages": {k: round(v, 2) for k, v in result.stages.items()},
                      "built_ahead_s": [b.get("seconds") for b in builds]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
