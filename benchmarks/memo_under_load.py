"""The identity memo of issue 45 (class 7) evaluated again and again on a loaded machine: how often it is
counted fast.

Evaluates each candidate --n times in a row (CPU, gloo, W=2, all_reduce at `small`, the exploit suite's
settings) while --burners processes spin on the CPU, and counts verdicts, counted speedups (correct and fast
eligible) and those above 1x, and timing iterations whose inputs were not refilled (`timings.*.refilled`).
Two candidates by default: `tests/exploits/memo_by_identity.py` (the memo, with a lever that stops the
refills) and the same memo without the lever, as the held-out case keyed it (written to a temporary file);
`--only honest` runs the honest kernel both wrap, for comparison.

    python benchmarks/memo_under_load.py --n 20 --burners 2 --out /tmp/memo.json

Exit status 0 when neither the exploit nor any iteration not refilled was ever counted; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.common.integrity import IntegrityConfig  # noqa: E402
from harness.config import EvalConfig, Limits, TimingConfig  # noqa: E402
from harness.evaluate import evaluate  # noqa: E402
from harness.judge.timing import NOT_REFILLED  # noqa: E402
from harness.problems.registry import get, load_suite  # noqa: E402

EXPLOIT = ROOT / "tests" / "exploits" / "memo_by_identity.py"
HONEST = ROOT / "tests" / "exploits" / "_shm_all_reduce.py"  # its `solution` is the honest kernel
# The memo alone: what the exploit does without its lever (the rank's cwd is the checkout: the helper is found).
PLAIN = '''import importlib.util, weakref
from pathlib import Path
_spec = importlib.util.spec_from_file_location("_shm_all_reduce",
                                               Path.cwd() / "tests" / "exploits" / "_shm_all_reduce.py")
_shm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shm)
_memo = {}
def solution(x):
    got = _memo.get(id(x))
    if got is not None and got[0]() is x and got[1] == x.data_ptr() and got[2] == x._version:
        return got[3]
    out = _shm.all_reduce(x)
    _memo[id(x)] = (weakref.ref(x), x.data_ptr(), x._version, out)
    return out
'''


def burn(stop: Any) -> None:
    while not stop.is_set():
        sum(range(100_000))  # pure Python: one core busy, no memory


def once(path: Path) -> dict[str, Any]:
    started = time.perf_counter()
    r = evaluate(get(load_suite(), "all_reduce"), path, world_size=2, device="cpu", shape="small",
                 config=EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"),
                                   limits=Limits(check_s=60, time_s=120)),
                 integrity_config=IntegrityConfig.for_device("cpu").to_dict())
    marks = {side: (getattr(r.timings, side).refilled or {}) if r.timings else {}
             for side in ("candidate", "reference")}
    missed = sum(m.count(NOT_REFILLED) for side in marks.values() for m in side.values())
    return {"verdict": r.verdict, "flags": r.flags, "speedup": r.speedup, "counted": r.counted_speedup,
            "candidate_ms": r.timings.candidate.median_ms if r.timings else None,
            "reference_ms": r.timings.reference.median_ms if r.timings else None,
            "refilled": marks, "not_refilled": missed, "message": (r.failure.message[:200] if r.failure else ""),
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--burners", type=int, default=2, help="CPU-spinning processes in the background")
    parser.add_argument("--only", choices=("exploit", "plain", "honest"),
                        help="one candidate only (honest: the kernel both memos wrap; not run by default)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=burn, args=(stop,), daemon=True) for _ in range(args.burners)]
    for p in burners:
        p.start()
    report: dict[str, Any] = {"n": args.n, "burners": args.burners, "candidates": {}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            plain = Path(tmp) / "memo_plain.py"
            plain.write_text(PLAIN)
            todo = {"exploit": EXPLOIT, "plain": plain, "honest": HONEST}
            for name, path in todo.items():
                if name != args.only and (args.only or name == "honest"):
                    continue
                runs = []
                for i in range(args.n):
                    runs.append(once(path))
                    print(name, i, json.dumps({k: runs[-1][k] for k in ("verdict", "counted", "candidate_ms",
                                                                      "reference_ms", "not_refilled")}), flush=True)
                report["candidates"][name] = {
                    "verdicts": dict(Counter(r["verdict"] for r in runs)),
                    "counted": sum(r["counted"] is not None for r in runs),
                    "counted_above_1x": sum(r["counted"] is not None and r["counted"] > 1.0 for r in runs),
                    "counted_with_iterations_not_refilled": sum(r["counted"] is not None and r["not_refilled"] > 0
                                                                for r in runs),
                    "runs": runs}
    finally:
        stop.set()
        for p in burners:
            p.join(timeout=5)
    summary = {k: {f: v[f] for f in ("verdicts", "counted", "counted_above_1x", "counted_with_iterations_not_refilled")}
               for k, v in report["candidates"].items()}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    exploit = report["candidates"].get("exploit", {})
    bad = exploit.get("counted", 0) + sum(v["counted_with_iterations_not_refilled"]
                                          for v in report["candidates"].values())
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
