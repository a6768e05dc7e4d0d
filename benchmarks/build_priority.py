"""Whether native builds running beside an evaluation slow it less when they run nicer (issue 30:
harness.compiling.compile.BUILD_NICENESS). On the one-GPU node the compile stage builds many candidates while
another evaluation holds the GPU; fourteen builds at once doubled the time an evaluation held it.

    python benchmarks/build_priority.py --builders 2 --repeats 3 --out docs/measurements/DIR

Phases, in this order: the evaluation alone; then with --builders threads each building a fresh C++
load_inline candidate through the real compile stage (sandbox included) one after another, at niceness 0
and at BUILD_NICENESS, alternated (0, nice, 0, nice) so a drifting load favours neither. Each phase waits
--warm-s for the builds to reach the compiler, runs --repeats evaluations of a plain torch candidate on CPU
(untimed, W = 2; its ranks and the reference's at the harness's priority), then lets the builds in flight
finish. Prints and writes the evaluation wall (median, each run) and the builds finished per phase.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["PKB_CACHE_DIR"] = tempfile.mkdtemp(prefix="pkb-build-priority-")  # every build cold

from harness.compiling import compile as build  # noqa: E402
from harness.config import EvalConfig  # noqa: E402
from harness.evaluate import evaluate  # noqa: E402
from harness.problems.registry import get, load_suite  # noqa: E402

CANDIDATE = ROOT / "tests" / "candidates" / "correct_all_gather_sum.py"
BUILDER = '''import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
torch::Tensor twice(torch::Tensor x) {{ return x * {k}; }}
"""
_module = load_inline("pkb_build_priority_{k}", cpp_sources=SOURCE, functions=["twice"])


def solution(x):
    return _module.twice(x)
'''


_NUMBERS, _NUMBER_LOCK = [0], threading.Lock()  # every build of the run a new source: none is a cache hit


class Builders:
    """`count` threads, each compiling a new candidate as soon as its last one finished, until stopped."""

    def __init__(self, count: int, folder: Path) -> None:
        self.stop = threading.Event()
        self.finished: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._folder = folder
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(count)]

    def _loop(self) -> None:
        while not self.stop.is_set():
            with _NUMBER_LOCK:
                _NUMBERS[0] += 1
                k = _NUMBERS[0]
            path = self._folder / f"build_{os.getpid()}_{k}.py"
            path.write_text(BUILDER.format(k=k + 1000 * os.getpid()))
            outcome = build.compile_candidate(path, 900.0, "cpu")
            with self._lock:
                self.finished.append({"ok": outcome.ok, "seconds": round(outcome.seconds, 1)})

    def __enter__(self) -> Builders:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join()


def evaluations(repeats: int) -> list[dict[str, Any]]:
    problem = get(load_suite(), "all_reduce")
    rows = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = evaluate(problem, CANDIDATE, world_size=2, device="cpu", shape="small",
                          config=EvalConfig(trials=3, skip_timing=True))
        rows.append({"wall_s": round(time.perf_counter() - started, 2), "verdict": result.verdict,
                     "stages": {k: round(v, 2) for k, v in result.stages.items()}})
    return rows


def phase(name: str, niceness: int | None, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    started = time.perf_counter()
    if niceness is None:
        runs = evaluations(args.repeats)
        builds: list[dict[str, Any]] = []
    else:
        build.BUILD_NICENESS = niceness
        with Builders(args.builders, folder) as builders:
            time.sleep(args.warm_s)
            runs = evaluations(args.repeats)
        builds = builders.finished
    walls = [r["wall_s"] for r in runs]
    row = {"phase": name, "niceness": niceness, "evaluation_wall_median_s": statistics.median(walls),
           "runs": runs, "builds": builds, "phase_s": round(time.perf_counter() - started, 1)}
    print(json.dumps({k: v for k, v in row.items() if k != "runs"} | {"walls": walls}), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--builders", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warm-s", type=float, default=8.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    nice = build.BUILD_NICENESS
    folder = Path(tempfile.mkdtemp(prefix="pkb-build-priority-src-"))
    rows = [phase("alone", None, args, folder)]
    for round_ in (1, 2):
        rows.append(phase(f"builds at niceness 0 ({round_})", 0, args, folder))
        rows.append(phase(f"builds at niceness {nice} ({round_})", nice, args, folder))
    lines = ["| phase | evaluation wall, median (each) | builds finished (median s) |", "|---|---|---|"]
    for row in rows:
        each = ", ".join(f"{r['wall_s']:.1f}" for r in row["runs"])
        done = [b["seconds"] for b in row["builds"] if b["ok"]]
        built = f"{len(done)} ({statistics.median(done):.0f} s)" if done else "-"
        lines.append(f"| {row['phase']} | {row['evaluation_wall_median_s']:.1f} s ({each}) | {built} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"cores": len(os.sched_getaffinity(0)), "builders": args.builders, "repeats": args.repeats}
        (args.out / "build_priority.json").write_text(json.dumps({**meta, "phases": rows}, indent=1))
        (args.out / "build_priority.md").write_text(
            f"# Builds beside an evaluation, by niceness\n\n`python benchmarks/build_priority.py --builders "
            f"{args.builders} --repeats {args.repeats}`, {meta['cores']} cores.\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
