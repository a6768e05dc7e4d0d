"""What this machine's GPUs measurably do: peer copy, HBM copy and the bf16 matrix rate in this process,
and the NCCL all-reduce curve in one process per GPU (`python -m harness.measure.calibrate_worker`, timed by
the ranks' own per-call protocol, harness.rank.timed). `pkb topology --calibrate` keeps the result in the
cached profile (harness.measure.topology). Parent-side only (pydantic).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from harness.common import hostile_files
from harness.common.paths import REPO_ROOT
from harness.common.safe_env import SAFE_ENV
from harness.config import TimingConfig
from harness.launch.pool import worker_env
from harness.measure.discovery import TopologyError, now
from harness.records.results import TimingStats

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
ALL_REDUCE_SIZES = tuple(64 * KiB * 4**k for k in range(8))  # 64 KiB, 256 KiB, ..., 1 GiB


class PeerCopy(BaseModel):
    src: int
    dst: int
    median_ms: float
    bytes_per_s: float = Field(description="one direction")


class AllReducePoint(BaseModel):
    bytes: int
    median_us: float
    p10_us: float
    p90_us: float
    cv: float
    host_median_us: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float = Field(description="algbw * 2(W-1)/W, as nccl-tests reports it")


class Calibration(BaseModel):
    measured_at: str
    world_size: int
    copy_bytes: int
    peer_copy: list[PeerCopy] = Field(description="one direction at a time, copy engine, CUDA events")
    peer_copy_bidir: list[PeerCopy] = Field(description="each direction's rate while both run, host clock")
    hbm_copy_bytes_per_s: list[float] = Field(description="per GPU, device-to-device copy, read + write counted")
    matmul_n: int
    matmul_bf16_flops_per_s: list[float] = Field(description="per GPU, n^3 bf16 matmul on random data")
    all_reduce_dtype: str = "bfloat16"
    all_reduce: list[AllReducePoint]
    protocol: dict[str, Any] = Field(default_factory=dict)

    @property
    def link_bytes_per_s(self) -> float | None:
        return max((p.bytes_per_s for p in self.peer_copy), default=None)


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth: the bytes each rank must move, 2(W-1)/W of the buffer, over the time."""
    return nbytes * 2 * (world_size - 1) / world_size / seconds


# -- calibration -----------------------------------------------------------------------------------


def _sync(devices: Sequence[int]) -> None:
    for d in devices:
        torch.cuda.synchronize(d)


def _event_times_ms(fn: Callable[[], object], device: int, devices: Sequence[int], warmup: int,
                    iters: int) -> list[float]:
    """Each call bracketed by CUDA events on `device`'s current stream (where fn's work is queued)."""
    stream = torch.cuda.current_stream(device)
    for _ in range(warmup):
        fn()
    _sync(devices)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record(stream)
        fn()
        end.record(stream)
    _sync(devices)
    return [start.elapsed_time(end) for start, end in events]


def _random_bytes(nbytes: int, device: int) -> torch.Tensor:
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=f"cuda:{device}")


def peer_copy(src: int, dst: int, nbytes: int = GiB, warmup: int = 3, iters: int = 10) -> PeerCopy:
    """One direction: `dst_tensor.copy_(src_tensor)`, which torch queues on the source GPU's current stream
    as a peer cudaMemcpyAsync (a copy engine)."""
    a = _random_bytes(nbytes, src)
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
    times = _event_times_ms(lambda: b.copy_(a), src, (src, dst), warmup, iters)
    if not torch.equal(a[:4096].cpu(), b[:4096].cpu()):
        raise TopologyError(f"peer copy {src}->{dst} produced wrong bytes")
    median = statistics.median(times)
    return PeerCopy(src=src, dst=dst, median_ms=median, bytes_per_s=nbytes / (median / 1e3))


def peer_copy_bidir(i: int, j: int, nbytes: int = GiB, warmup: int = 3, iters: int = 10) -> list[PeerCopy]:
    """Both directions at once on four private streams (torch's cross-device copy joins the source and
    destination current streams, so sharing them would serialise the two copies). Host clock around
    each synchronised pair of copies; each direction moves `nbytes` in that time."""
    x_i, x_j = _random_bytes(nbytes, i), _random_bytes(nbytes, j)
    y_i = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}")
    y_j = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{j}")
    s_ij_src, s_ij_dst = torch.cuda.Stream(i), torch.cuda.Stream(j)
    s_ji_src, s_ji_dst = torch.cuda.Stream(j), torch.cuda.Stream(i)
    _sync((i, j))

    def both() -> None:
        with torch.cuda.stream(s_ij_src), torch.cuda.stream(s_ij_dst):
            y_j.copy_(x_i)
        with torch.cuda.stream(s_ji_src), torch.cuda.stream(s_ji_dst):
            y_i.copy_(x_j)

    for _ in range(warmup):
        both()
    _sync((i, j))
    times = []
    for _ in range(iters):
        started = time.perf_counter()
        both()
        _sync((i, j))
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    return [PeerCopy(src=s, dst=d, median_ms=median * 1e3, bytes_per_s=nbytes / median) for s, d in ((i, j), (j, i))]


def hbm_copy(device: int, nbytes: int = GiB, warmup: int = 3, iters: int = 10) -> float:
    """Bytes per second through HBM for a device-to-device copy, counting the read and the write."""
    a = _random_bytes(nbytes, device)
    b = torch.empty_like(a)
    times = _event_times_ms(lambda: b.copy_(a), device, (device,), warmup, iters)
    return 2 * nbytes / (statistics.median(times) / 1e3)


def matmul_rate(device: int, n: int = 8192, warmup: int = 10, iters: int = 20) -> float:
    """Dense bf16 FLOP/s of an n x n x n matmul on random data (2 n^3 FLOPs per call), median call."""
    gen = torch.Generator(device=f"cuda:{device}")
    gen.manual_seed(device)
    a = torch.randn(n, n, dtype=torch.bfloat16, device=f"cuda:{device}", generator=gen)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=f"cuda:{device}", generator=gen)
    c = torch.empty_like(a)
    times = _event_times_ms(lambda: torch.mm(a, b, out=c), device, (device,), warmup, iters)
    return 2 * n**3 / (statistics.median(times) / 1e3)


def all_reduce_curve(world_size: int, sizes: Sequence[int] = ALL_REDUCE_SIZES, *,
                     timing: TimingConfig | None = None, timeout_s: float = 600.0,
                     device: Literal["cuda", "cpu"] = "cuda") -> list[AllReducePoint]:
    """NCCL all-reduce (bf16, sum) over `sizes` bytes, one process per GPU, timed with the ranks'
    protocol (L2 flush, device spin, device barrier, events); per iteration the slowest rank counts.
    `device="cpu"` runs the same plumbing under gloo with host clocks (tests only: no measurement)."""
    config = (timing or TimingConfig()).model_dump()
    sizes_list = list(sizes)
    with tempfile.TemporaryDirectory(prefix="pkb-calibrate-") as tmp:
        folder = Path(tmp)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(world_size):
                with open(folder / f"rank{rank}.log", "wb") as log:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "harness.measure.calibrate_worker", "--rank", str(rank), "--world-size",
                         str(world_size), "--init-file", str(folder / "rendezvous"), "--out", str(folder),
                         "--sizes", ",".join(map(str, sizes)), "--config", json.dumps(config), "--device", device],
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=worker_env(device),
                        cwd=str(REPO_ROOT), start_new_session=True))
            _wait_all(procs, folder, timeout_s)
        finally:
            _kill_groups(procs)
        try:  # every rank exited 0 (_wait_all) and wrote its results, strictly parsed: nothing less counts
            ranks = [hostile_files.read_json(folder / f"rank{r}.json", 64 << 20)["sizes"] for r in range(world_size)]
            if any(not isinstance(sizes, list) or len(sizes) != len(sizes_list) for sizes in ranks):
                raise ValueError("a rank's results do not cover every size")
        except (OSError, ValueError, KeyError, TypeError, hostile_files.HostileFile) as err:
            raise TopologyError(f"all-reduce calibration wrote no usable results ({err})\n"
                                f"{_log_tail(folder, 0)}") from None
    points = []
    for k, nbytes in enumerate(sizes):
        stats = TimingStats.from_rank_loops([ranks[r][k] for r in range(world_size)],
                                       "cuda_events" if device == "cuda" else "host")
        seconds = stats.median_ms / 1e3
        points.append(AllReducePoint(
            bytes=nbytes, median_us=stats.median_ms * 1e3, p10_us=stats.p10_ms * 1e3, p90_us=stats.p90_ms * 1e3,
            cv=stats.cv, host_median_us=stats.host_median_ms * 1e3, algbw_bytes_per_s=nbytes / seconds,
            busbw_bytes_per_s=bus_bandwidth(nbytes, seconds, world_size)))
    return points


def _log_tail(folder: Path, rank: int, limit: int = 2000) -> str:
    try:
        return hostile_files.read_tail(folder / f"rank{rank}.log", limit).decode(errors="replace")
    except (OSError, hostile_files.HostileFile):
        return ""


def _wait_all(procs: list[subprocess.Popen[bytes]], folder: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            r = failed[0]
            raise TopologyError(f"all-reduce calibration: rank {r} exited with code {codes[r]}\n"
                                f"{_log_tail(folder, r)}")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            waiting = [r for r, code in enumerate(codes) if code is None]
            raise TopologyError(f"all-reduce calibration: ranks {waiting} did not finish within {timeout_s:.0f} s\n"
                                f"{_log_tail(folder, waiting[0])}")
        time.sleep(0.2)


def _kill_groups(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def calibrate(world_size: int | None = None, *, copy_bytes: int = GiB, matmul_n: int = 8192,
              all_reduce_sizes: Sequence[int] = ALL_REDUCE_SIZES, timing: TimingConfig | None = None,
              timeout_s: float = 600.0) -> Calibration:
    """Measure this machine's ceilings on GPUs 0..world_size-1 (default: every visible GPU). About a
    minute on two H200s. Raises TopologyError where fewer than two GPUs are visible."""
    os.environ.update(SAFE_ENV)  # this process and the ranks it starts keep NVLink multicast off
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        raise TopologyError(f"calibration needs at least 2 CUDA GPUs; this machine has {count}")
    world_size = count if world_size is None else world_size
    if not 2 <= world_size <= count:
        raise TopologyError(f"calibration world size must be between 2 and {count} (the visible GPUs), "
                            f"got {world_size}")
    devices = range(world_size)
    peer = [peer_copy(s, d, copy_bytes) for s in devices for d in devices if s != d]
    bidir = [p for i, j in itertools.combinations(devices, 2) for p in peer_copy_bidir(i, j, copy_bytes)]
    hbm = [hbm_copy(d, copy_bytes) for d in devices]
    mm = [matmul_rate(d, matmul_n) for d in devices]
    torch.cuda.empty_cache()
    timing = timing or TimingConfig()
    curve = all_reduce_curve(world_size, all_reduce_sizes, timing=timing, timeout_s=timeout_s)
    return Calibration(
        measured_at=now(), world_size=world_size, copy_bytes=copy_bytes, peer_copy=peer, peer_copy_bidir=bidir,
        hbm_copy_bytes_per_s=hbm, matmul_n=matmul_n, matmul_bf16_flops_per_s=mm, all_reduce=curve,
        protocol={
            "peer_copy": "dst.copy_(src) across GPUs (copy engine), CUDA events on the source stream, "
                         "3 warm-up, median of 10",
            "peer_copy_bidir": "both directions on private streams at once, host clock per synchronised pair, "
                               "3 warm-up, median of 10",
            "hbm_copy": "same-GPU dst.copy_(src), 2 x bytes per call, CUDA events, 3 warm-up, median of 10",
            "matmul": f"torch.mm bf16 {matmul_n}^3 on randn, CUDA events, 10 warm-up, median of 20",
            "all_reduce": "harness.rank.timed per-call protocol, one process per GPU (NCCL, device_id), "
                          "max over ranks per iteration, median",
            "timing_config": timing.model_dump(),
        },
    )
