"""Cross-checks of `pkb topology --calibrate` on a GPU node: the same measurements under several warm-ups
and orders, and clocks before and after, to tell a real machine figure from a measurement artefact.

    python benchmarks/gpu_calibration_check.py --out OUTDIR

Writes OUTDIR/calibration-check.json and prints one line per measurement.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.measure import calibration  # noqa: E402

GiB = 1 << 30


def smi(query: str) -> list[str]:
    try:
        text = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], text=True,
                              capture_output=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"nvidia-smi failed: {exc}"]
    return [line.strip() for line in text.splitlines() if line.strip()]


CLOCKS = "index,clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,pstate,clocks_throttle_reasons.active"


def busy(device: int, seconds: float) -> None:
    """Keep one GPU busy with matmuls for `seconds` (clocks ramp on load)."""
    a = torch.randn(4096, 4096, dtype=torch.bfloat16, device=f"cuda:{device}")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize(device)


def matmul_variants(device: int, log: dict) -> None:
    n = 8192
    log[f"mm{device}_as_calibrate"] = calibration.matmul_rate(device, n) / 1e12
    busy(device, 1.0)
    log[f"mm{device}_after_1s_busy"] = calibration.matmul_rate(device, n) / 1e12
    a = torch.randn(n, n, dtype=torch.bfloat16, device=f"cuda:{device}")
    b = torch.randn(n, n, dtype=torch.bfloat16, device=f"cuda:{device}")
    torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(50):
        a @ b
    torch.cuda.synchronize(device)
    log[f"mm{device}_host_clock_50_back_to_back"] = 50 * 2 * n**3 / (time.perf_counter() - started) / 1e12
    try:
        import triton.testing

        with torch.cuda.device(device):
            ms = triton.testing.do_bench(lambda: a @ b, warmup=200, rep=500, return_mode="median")
        log[f"mm{device}_do_bench_median"] = 2 * n**3 / (ms / 1e3) / 1e12
    except Exception as exc:  # noqa: BLE001 - a cross-check only
        log[f"mm{device}_do_bench_error"] = repr(exc)[:200]


def copy_variants(log: dict) -> None:
    for order in ((0, 1), (1, 0), (0, 1), (1, 0)):
        p = calibration.peer_copy(*order, nbytes=GiB)
        log.setdefault(f"peer_{order[0]}to{order[1]}_GBps", []).append(p.bytes_per_s / 1e9)
    # the same copies timed by the host clock around ten of them (no events at all)
    for src, dst in ((0, 1), (1, 0)):
        a = calibration._random_bytes(GiB, src)
        b = torch.empty(GiB, dtype=torch.uint8, device=f"cuda:{dst}")
        b.copy_(a)
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        started = time.perf_counter()
        for _ in range(10):
            b.copy_(a)
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        log[f"peer_{src}to{dst}_host_clock_GBps"] = 10 * GiB / (time.perf_counter() - started) / 1e9
        del a, b
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log: dict = {"clocks_idle": smi(CLOCKS)}
    for d in range(torch.cuda.device_count()):
        matmul_variants(d, log)
    log["clocks_after_matmul"] = smi(CLOCKS)
    if torch.cuda.device_count() >= 2:
        copy_variants(log)
    log["clocks_end"] = smi(CLOCKS)
    for key, value in log.items():
        print(f"{key}: {value}", flush=True)
    (args.out / "calibration-check.json").write_text(json.dumps(log, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
