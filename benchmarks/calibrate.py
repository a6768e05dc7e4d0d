"""This machine's ceilings: peer copy per direction (and both at once), HBM copy, bf16 matmul and the NCCL
all-reduce bus-bandwidth curve. Writes the profile (topology + calibration) to OUTDIR/calibration.json
and to the cache the roofline reads, then prints a short table.

    python benchmarks/calibrate.py --out OUTDIR [--world-size 2] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.common.safe_env import SAFE_ENV  # noqa: E402

os.environ.update(SAFE_ENV)  # before torch touches a GPU: NVLink multicast stays off

from harness.config import TimingConfig  # noqa: E402
from harness.measure.calibration import MiB, calibrate  # noqa: E402
from harness.measure.discovery import discover  # noqa: E402
from harness.measure.topology import Profile, ceilings, save  # noqa: E402
from harness.records.environment import hardware_key  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--world-size", type=int, default=None, help="default: every visible GPU")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a measurement")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    topo = discover()
    if args.quick:
        cal = calibrate(args.world_size, copy_bytes=64 * MiB, matmul_n=2048, all_reduce_sizes=(64 * 1024, MiB),
                        timing=TimingConfig(warmup=3, iters=10, host_iters=2))
    else:
        cal = calibrate(args.world_size)
    profile = Profile(hardware_key=hardware_key(), topology=topo, calibration=cal)
    (args.out / "calibration.json").write_text(profile.model_dump_json(indent=1))
    cached = save(profile) if not args.quick else None
    c = ceilings(profile)

    gpus = ", ".join(sorted({g.name for g in topo.gpus}))
    print(f"\n{topo.gpu_count} x {gpus}; driver {topo.driver}, CUDA {topo.cuda}, NCCL {topo.nccl}, torch {topo.torch}")
    print(f"NVLink ({topo.nvlink_source}): " + "; ".join(
        f"GPU{g.index} {g.active_links} active, {(g.link_spec_bytes_per_s or 0) / 1e9:.1f} GB/s per direction"
        for g in topo.gpus))
    print(f"interconnect {topo.interconnect}; peer access {topo.peer_access}")
    print(f"multicast attribute {topo.multicast_supported}, disabled by policy {topo.multicast_disabled_by_policy}")
    print("\n| measurement | value |\n|---|---|")
    for p in cal.peer_copy:
        print(f"| peer copy {p.src}->{p.dst} ({cal.copy_bytes / 2**20:g} MiB) | {p.bytes_per_s / 1e9:.1f} GB/s |")
    for p in cal.peer_copy_bidir:
        print(f"| peer copy {p.src}->{p.dst}, both directions at once | {p.bytes_per_s / 1e9:.1f} GB/s |")
    for d, v in enumerate(cal.hbm_copy_bytes_per_s):
        print(f"| HBM copy GPU {d}, read + write | {v / 1e12:.2f} TB/s |")
    for d, v in enumerate(cal.matmul_bf16_flops_per_s):
        print(f"| bf16 matmul {cal.matmul_n}^3 GPU {d} | {v / 1e12:.0f} TFLOP/s |")
    print(f"\n| all-reduce W={cal.world_size} bytes | median µs | p10 | p90 | CV | algbw GB/s | busbw GB/s |")
    print("|---|---|---|---|---|---|---|")
    for pt in cal.all_reduce:
        print(f"| {pt.bytes} | {pt.median_us:.1f} | {pt.p10_us:.1f} | {pt.p90_us:.1f} | {pt.cv:.3f} | "
              f"{pt.algbw_bytes_per_s / 1e9:.1f} | {pt.busbw_bytes_per_s / 1e9:.1f} |")
    print(f"\nceilings ({c['source']}): link {c['link_bytes_per_s'] / 1e9:.1f} GB/s ({c['link_source']}; "
          f"spec {(c['link_spec_bytes_per_s'] or 0) / 1e9:.1f}), HBM {c['hbm_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"bf16 {c['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s")
    for note in topo.notes + c["notes"]:
        print(f"note: {note}")
    print(f"\nwrote {args.out / 'calibration.json'}" + (f" and {cached}" if cached else "")
          + f" in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
