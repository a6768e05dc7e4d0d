"""Nsight Systems on one rank, where it is installed: the profiled calls' kernels from `nsys stats`. Parent-side.

Nsight Systems is often installed without being on PATH (CUDA toolkits put it under /usr/local/cuda/bin or
/opt/nvidia/nsight-systems/<version>/bin): `find_nsys()` looks in those places too, and where there is none
the report says so in one line. Like harness.measure.ncu, one rank runs under the profiler while its peers run free:

    nsys profile --trace cuda,nvtx --capture-range cudaProfilerApi --capture-range-end stop
                 --sample none --cpuctxsw none --force-overwrite true --output R

The rank (op "profile", mode "nsys") brackets all its profiled calls with one cudaProfilerStart/Stop, so the
capture holds those calls only. The report is read back with
`nsys stats --report cuda_gpu_kern_sum --format csv --force-export true R.nsys-rep`: one row per kernel name
with its total GPU time and launch count (columns "Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", ...,
"Name"). Nsight Systems only traces (no replay), so kernels that wait on peers are recorded as they ran.
"""

from __future__ import annotations

import csv
import glob
import io
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Where nsys lives when it is not on PATH (newest version first where several are installed).
SEARCH = ("/usr/local/cuda/bin/nsys", "/usr/local/cuda-*/bin/nsys", "/opt/nvidia/nsight-systems/*/bin/nsys",
          "/opt/nvidia/nsight-systems-cli/*/bin/nsys", "/usr/lib/nsight-systems/bin/nsys",
          "/usr/local/cuda/nsight-systems-*/bin/nsys")
KERNEL_REPORT = "cuda_gpu_kern_sum"


@dataclass
class NsysKernel:
    name: str
    total_ns: float
    instances: int


@dataclass
class NsysReport:
    status: str  # collected, not_installed, not_collected
    rank: int
    calls: int
    nsys: str | None = None  # the executable used
    kernels: list[NsysKernel] = field(default_factory=list)  # by total time, largest first
    message: str = ""
    seconds: float = 0.0
    looked_in: list[str] = field(default_factory=list)


def find_nsys() -> str | None:
    """The nsys executable: on PATH, else in the usual install folders (the newest by name)."""
    found = shutil.which("nsys")
    if found:
        return found
    for pattern in SEARCH:
        hits = sorted((p for p in glob.glob(pattern) if os.access(p, os.X_OK)), reverse=True)
        if hits:
            return hits[0]
    return None


def nsys_command(nsys: str, output: Path) -> list[str]:
    return [nsys, "profile", "--trace", "cuda,nvtx", "--capture-range", "cudaProfilerApi", "--capture-range-end",
            "stop", "--sample", "none", "--cpuctxsw", "none", "--force-overwrite", "true", "--output", str(output)]


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


def parse_kernel_summary(text: str) -> list[NsysKernel]:
    """Rows of `nsys stats --report cuda_gpu_kern_sum --format csv`; nsys's own notices before the header
    are skipped. Kernels without a total time are left out."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "Total Time" in line and "Name" in line), None)
    if start is None:
        return []
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    total_key = next((k for k in reader.fieldnames or [] if k.startswith("Total Time")), None)
    if total_key is None:
        return []
    scale = 1e3 if "(us)" in total_key else 1e6 if "(ms)" in total_key else 1.0
    out = []
    for row in reader:
        total = _number(row.get(total_key) or "")
        name = (row.get("Name") or "").strip()
        if total is None or not name:
            continue
        instances = _number(row.get("Instances") or "") or 0
        out.append(NsysKernel(name, total * scale, int(instances)))
    return sorted(out, key=lambda k: -k.total_ns)


def collect(problem: Any, candidate: Path | None, *, world_size: int, shape: str, seed: int = 0, rank: int = 0,
            budget_s: float = 60.0, calls: int = 3, warmup: int = 2, gpus: list[int] | None = None,
            ranks_per_gpu: int = 1, keep_dir: Path | None = None) -> NsysReport:
    """Rank `rank` under Nsight Systems for `calls` calls. Never raises for what nsys cannot do."""
    started = time.monotonic()
    nsys = find_nsys()
    report = NsysReport("not_installed", rank, calls, nsys, looked_in=["PATH", *SEARCH])
    if nsys is None:
        report.message = "Nsight Systems (nsys) is not installed here (not on PATH nor in the CUDA/Nsight folders)"
        return report
    # Deferred: the pool and the builds are needed only when nsys runs (as in harness.measure.ncu).
    from harness.compiling.compile import extensions_dir
    from harness.launch.pool import Hang, PoolError, RankPool
    from harness.rank.candidate import required_positional

    report.status = "not_collected"
    with tempfile.TemporaryDirectory(prefix="pkb-nsys-") as tmp:
        output = Path(tmp) / "timeline"
        deadline = started + budget_s

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        base: dict[str, Any] = {"problem": problem.loader_spec, "shape": shape,
                                "candidate": str(candidate) if candidate else None}
        # Like ncu, the profiler needs the GPU's tracing interfaces, which the sandbox's user namespace hides:
        # this pool runs unsandboxed (tests/exploits/README.md); it decides nothing.
        pool = RankPool(world_size, "cuda", start_timeout=min(left(), 150.0), role="candidate", sandbox=False,
                        env={"TORCH_EXTENSIONS_DIR": str(extensions_dir())}, keep_logs=Path(tmp) / "logs",
                        rank_prefix={rank: nsys_command(nsys, output)}, gpus=gpus, ranks_per_gpu=ranks_per_gpu)
        try:
            pool.start()
            if candidate is not None:
                pool.request({"op": "load_candidate", **base, "params": len(required_positional(problem.solution))},
                             timeout=left())
            replies = pool.request({"op": "profile", **base, "seed": seed, "warmup": warmup, "iters": calls,
                                    "mode": "nsys", "tag": uuid.uuid4().hex[:12]}, timeout=left())
            if not all(r.get("ok") for r in replies):
                report.message = next(str(r.get("message", "")) for r in replies if not r.get("ok"))[:400]
            pool.close(timeout=left())  # nsys writes its report once the rank exits
        except Hang as hang:
            report.message = f"ranks {hang.missing} did not finish within the {budget_s:.0f} s budget under nsys"
        except PoolError as err:
            report.message = f"the ranks did not start under nsys: {str(err)[:400]}"
        finally:
            pool.kill()
        rep = output.with_suffix(".nsys-rep")
        if rep.is_file():
            try:
                out = subprocess.run([nsys, "stats", "--report", KERNEL_REPORT, "--format", "csv", "--force-export",
                                      "true", str(rep)], capture_output=True, text=True, timeout=max(10.0, left()))
                report.kernels = parse_kernel_summary(out.stdout)
                if keep_dir is not None:
                    keep_dir.mkdir(parents=True, exist_ok=True)
                    (keep_dir / f"{KERNEL_REPORT}.csv").write_text(out.stdout)
                    shutil.copy2(rep, keep_dir / rep.name)
            except (OSError, subprocess.TimeoutExpired) as err:
                report.message = report.message or f"nsys stats failed: {err}"
            report.status = "collected" if report.kernels else "not_collected"
            if not report.kernels and not report.message:
                report.message = "nsys recorded no kernel inside the profiled range"
        elif not report.message:
            report.message = "nsys wrote no report"
    report.seconds = time.monotonic() - started
    return report
