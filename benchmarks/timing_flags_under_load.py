"""How often an honest candidate is flagged from its times when evaluations share the machine.

Evaluates one candidate --n times, --at-once at a time (threads in one process, each evaluation its own
rank pools, as the Ray executor and `pkb run --concurrency` do), and counts the flags read from times
(harness.common.flags.FROM_TIMES). It also keeps every evaluation's pairs of timed calls (a rotated call,
then one on never-seen buffers) and replays the input-caching rule on them at several ratios, so one run
shows what each ratio would have flagged on the same calls.

    python benchmarks/timing_flags_under_load.py --n 30 --at-once 3 --out /tmp/flags.json

CPU, W=2, all_reduce at `small` by default. Exit status 0; the figures are for docs/harness.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.common.flags import FROM_TIMES  # noqa: E402
from harness.common.integrity import IntegrityConfig  # noqa: E402
from harness.config import EvalConfig, Limits, TimingConfig  # noqa: E402
from harness.evaluate import evaluate  # noqa: E402
from harness.judge import plausibility, timing  # noqa: E402
from harness.problems.registry import get, load_suite  # noqa: E402

RATIOS = (1.5, 2.0, 2.5, 3.0)


class PairRecorder:
    """Wraps harness.judge.timing.stats to keep each timing run's (rotated, never-seen) pairs: the slowest
    rank's claimed time of each call, as the judge reads them."""

    def __init__(self) -> None:
        self.pairs: dict[int, list[tuple[float, float]]] = {}
        self._original = timing.stats
        self._lock = threading.Lock()

    def __enter__(self) -> PairRecorder:
        def recording(run: timing.TimingRun, clock: Any) -> Any:
            pairs = timing.fresh_pairs(run)
            with self._lock:
                self.pairs[threading.get_ident()] = pairs
            return self._original(run, clock)

        timing.stats = recording  # the evaluation reads it through the module, at call time
        return self

    def __exit__(self, *exc: object) -> None:
        timing.stats = self._original


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidate", type=Path, default=ROOT / "tests" / "candidates" / "correct_all_gather_sum.py")
    parser.add_argument("--problem", default="all_reduce")
    parser.add_argument("--shape", default="small")
    parser.add_argument("--n", type=int, default=30, help="evaluations in all (default 30)")
    parser.add_argument("--at-once", type=int, default=3, help="evaluations running together (default 3)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for every evaluation and the summary")
    args = parser.parse_args(argv)
    problem = get(load_suite(), args.problem)
    config = EvalConfig(trials=3, timing=TimingConfig.for_device("cpu"), limits=Limits(check_s=8))
    checks = IntegrityConfig.for_device("cpu")
    recorder = PairRecorder()

    def one(index: int) -> dict[str, Any]:
        result = evaluate(problem, args.candidate, world_size=2, device="cpu", shape=args.shape, config=config)
        pairs = recorder.pairs.pop(threading.get_ident(), [])
        row = {"index": index, "verdict": result.verdict, "flags": result.flags,
               "from_times": sorted(set(result.flags) & FROM_TIMES), "pairs_ms": pairs}
        print(json.dumps({k: row[k] for k in ("index", "verdict", "from_times")}), flush=True)
        return row

    started = time.perf_counter()
    with recorder, ThreadPoolExecutor(args.at_once) as pool:
        rows = list(pool.map(one, range(args.n)))
    replayed = {}
    for ratio in RATIOS:
        at = dataclasses.replace(checks, caching_ratio=ratio)
        excess = [plausibility.caching_excess_ms(r["pairs_ms"], at) for r in rows]
        # The margin as the judge sets it needs the reference's median; the floor is used here for all.
        replayed[str(ratio)] = {"flagged": sum(1 for e in excess if e is not None and e > at.caching_margin_ms),
                                "largest_median_excess_ms": max((e for e in excess if e is not None), default=None)}
    summary = {"n": args.n, "at_once": args.at_once, "wall_s": round(time.perf_counter() - started, 1),
               "verdicts": dict(sorted(Counter(r["verdict"] for r in rows).items())),
               "flagged_from_times": {f: sum(1 for r in rows if f in r["from_times"]) for f in sorted(FROM_TIMES)},
               "caching_rule_replayed": replayed}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "evaluations": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
