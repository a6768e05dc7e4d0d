"""The trusted judge and the sandbox on a GPU machine: which sandbox starts there, evaluations with and
without it (wall time per evaluation, interleaved), and exploits that run on CUDA, their verdicts.

    python benchmarks/gpu_sandbox.py --out OUTDIR [--repeats 3] [--exploits]

With fewer GPUs than ranks, the W ranks share the visible GPUs under gloo (CUDA tensors): the harness
runs as on a multi-GPU node, only NCCL is missing. Writes OUTDIR/gpu_sandbox.json.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import EvalConfig, Limits, TimingConfig  # noqa: E402
from harness.evaluate import evaluate  # noqa: E402
from harness.registry import get, load_suite  # noqa: E402
from harness.sandbox import policy, probe  # noqa: E402

EXPLOITS = ROOT / "tests" / "exploits"
CANDIDATES = ROOT / "tests" / "candidates"
# Exploits that run on CUDA under gloo (the symmetric-memory and copy-engine ones need peers' memory).
CUDA_EXPLOITS = ["timer_patch.py", "timer_patch_when_timed.py", "patch_harness.py", "gc_forged_ok.py",
                 "torch_function_mode.py", "raising_comparison.py", "raising_tensor_subclass.py", "forge_reply.py",
                 "mutates_inputs_when_timed.py", "replay_when_timed.py", "replay_first_call.py", "lazy_subclass.py",
                 "lazy_next_call.py", "reduced_precision_int8.py", "empty_like_reuse.py", "reads_peer_inputs.py",
                 "nccl_all_reduce.py", "reference_call.py", "hang_forever.py", "content_cache.py"]


def expectation(path: Path) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EXPECT" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def one(problem, candidate: Path, shape: str, sandbox: bool, **kw) -> dict:
    if sandbox:
        os.environ.pop("PKB_SANDBOX", None)
    else:
        os.environ["PKB_SANDBOX"] = "off"
    policy._bwrap_works.cache_clear()
    config = EvalConfig(trials=3, timing=TimingConfig.for_device("cuda"), use_reference_cache=False,
                        limits=Limits(check_s=kw.pop("check_s", 120.0), grace_s=2))
    started = time.perf_counter()
    r = evaluate(problem, candidate, world_size=2, device="cuda", shape=shape, config=config)
    return {"candidate": candidate.name, "shape": shape, "sandbox": r.integrity.get("sandbox", {}).get("backend"),
            "seconds": round(time.perf_counter() - started, 3), "verdict": r.verdict, "flags": r.flags,
            "message": r.failure.message[:300] if r.failure else None, "stages": r.stages,
            "median_ms": r.timings.candidate.median_ms if r.timings else None,
            "reference_ms": r.timings.reference.median_ms if r.timings else None,
            "span_ms": r.timings.candidate.span_median_ms if r.timings else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--exploits", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    info = probe()
    report: dict = {"sandbox": info.record(), "date": time.strftime("%Y-%m-%d %H:%M"), "cost": [], "exploits": []}
    print(json.dumps(report["sandbox"]), flush=True)
    suite = load_suite()
    all_reduce = get(suite, "all_reduce")

    def save() -> None:
        (args.out / "gpu_sandbox.json").write_text(json.dumps(report, indent=1))

    good = CANDIDATES / "correct_all_gather_sum.py"
    for repeat in range(args.repeats):
        for shape in ("small", "default"):
            for sandbox in (True, False):
                row = {"repeat": repeat, **one(all_reduce, good, shape, sandbox)}
                report["cost"].append(row)
                print(json.dumps(row), flush=True)
                save()
    summary = {}
    for shape in ("small", "default"):
        on = [r["seconds"] for r in report["cost"] if r["shape"] == shape and r["sandbox"] == "bwrap"]
        off = [r["seconds"] for r in report["cost"] if r["shape"] == shape and r["sandbox"] == "none"]
        if on and off:
            summary[shape] = {"sandboxed_s": statistics.median(on), "unsandboxed_s": statistics.median(off),
                              "difference_s": statistics.median(on) - statistics.median(off)}
    report["cost_summary"] = summary
    print(json.dumps(summary), flush=True)
    save()
    if args.exploits:
        for name in CUDA_EXPLOITS:
            expect = expectation(EXPLOITS / name)
            problem = get(suite, expect.get("problem", "all_reduce"))
            row = one(problem, EXPLOITS / name, "small", True,
                      **({"check_s": 8.0} if name == "hang_forever.py" else {}))
            row["expected"] = expect.get("verdict")
            row["expected_flags"] = expect.get("flags", [])
            row["as_expected"] = row["verdict"] == row["expected"] and set(row["expected_flags"]) <= set(row["flags"])
            report["exploits"].append(row)
            print(json.dumps(row), flush=True)
            save()
        report["exploits_as_expected"] = sum(r["as_expected"] for r in report["exploits"])
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
