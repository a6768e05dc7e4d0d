"""Nsight Compute metrics of one rank while the other ranks run free. Parent-side.

Kernels that wait on a peer (NCCL, and every symmetric-memory kernel that spins on a signal) are hard
to profile: each pass of ncu's replay runs the kernel again, and a kernel whose wait needs a fresh
signal from a peer that has moved on hangs. So:
- only one rank runs under `ncu` (RankPool's rank_prefix); its peers run at full speed and answer its
  signals, however slowly it goes;
- `--replay-mode kernel` is the default. Measured on 2x H200 (docs/profiling.md): the `core` set needs
  3 passes there, application replay then has to relaunch the application, which the rank worker
  cannot survive (its pipes belong to the pool), and no report came within 60 s; kernel replay
  collected in 12 s, because kernels whose barriers count epochs that only grow find the peer's signal
  still there on a replayed pass. A kernel that resets its flags (NCCL's may) can still hang under
  replay; the time budget bounds that and the report says so. `replay="application"` remains for
  metric lists that fit one pass;
- `--cache-control none` (no cache flush between passes) and `--clock-control none`: clocks are never
  locked, and the GPU's settings are never touched;
- `--profile-from-start off`: only the profiled calls count (the worker brackets them with
  cudaProfilerStart/Stop), `--launch-count` bounds the kernels, and a time budget bounds the whole.
- the emulation's own barrier and signal kernels (harness.emulation.signals: they stand in for torch's
  when ranks share a GPU, are not the candidate's work, and wait on a peer in another context) are left
  out of the profile by name (`--kernel-name regex:` with a negative look-ahead); the timeline has them;
- ranks that all share one GPU (emulation) have no NVLink traffic: their peers' buffers are that GPU's own
  memory, so the NVLink counters are not asked for (NVLINK; each says why) and the peer traffic is in DRAM's;
- a run whose replayed passes never finish (a kernel of the candidate's own that waits on a peer:
  measured on one H200, 2026-12-02, docs/profiling.md) is run again with ONE_PASS, metrics that ncu
  collects in a single pass: nothing is replayed, so the kernel runs once, as it would unprofiled, and
  its time and DRAM traffic are still read; what only a replay gives (SM throughput, stall reasons) is
  then listed as not read, with why.
Each metric set is one ncu run (one pool launch); its report is exported and read back with
`ncu --import ... --csv --page raw`. Whatever could not be collected is listed with the reason.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.common import hostile_files
from harness.emulation import layout, signals

DURATION = "gpu__time_duration.sum"  # a kernel's time: in every set, and the one metric a summary cannot lack
# Small metric sets (duration, launch statistics and a few counters): few passes each under kernel replay.
METRIC_SETS: dict[str, tuple[str, ...]] = {
    "core": (
        DURATION,
        "nvltx__bytes.sum",  # NVLink bytes transmitted (Hopper's name; every link of this GPU)
        "nvlrx__bytes.sum",  # NVLink bytes received
        "dram__bytes_read.sum",
        "dram__bytes_write.sum",
        "launch__registers_per_thread",
        "launch__grid_size",
        "launch__block_size",
    ),
    "throughput": (
        DURATION,
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",  # local-memory loads: register spills (and local arrays)
        "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",  # local-memory stores
    ),
}
# Why warps could not issue, as ncu's WarpStateStats section names it: smsp__average_warps_issue_stalled_
# <reason>_per_issue_active.ratio (warps stalled for that reason per cycle with an issue). The meaning is what the
# model reads next to the reason's name.
STALL_REASONS: dict[str, str] = {
    "long_scoreboard": "waiting on global/local memory (L1TEX: loads, peer reads, spin-waits on flags)",
    "barrier": "waiting at __syncthreads / a block barrier",
    "membar": "waiting on a memory fence (__threadfence, release/acquire)",
    "short_scoreboard": "waiting on shared memory or special-function results (MIO)",
    "mio_throttle": "the shared-memory/MIO queue is full",
    "lg_throttle": "the local/global memory queue is full: too many outstanding loads/stores",
    "math_pipe_throttle": "the math pipe is busy (compute bound)",
    "wait": "fixed-latency dependency between instructions",
    "not_selected": "eligible but another warp issued (enough parallelism)",
    "selected": "issued (not a stall)",
    "dispatch_stall": "dispatch stall",
    "drain": "draining memory stores at exit",
    "imc_miss": "immediate-constant cache miss",
    "branch_resolving": "resolving a branch",
    "no_instruction": "instruction cache miss",
    "sleeping": "sleeping (__nanosleep)",
    "tex_throttle": "the texture queue is full",
    "misc": "other",
}
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"


def stall_metric(reason: str) -> str:
    return f"{STALL_PREFIX}{reason}{STALL_SUFFIX}"


METRIC_SETS["stalls"] = (DURATION, *(stall_metric(r) for r in STALL_REASONS))
# What the agent's profile tool asks for, in one ncu run (kernel replay takes the passes it needs): per
# kernel its duration, DRAM and NVLink bytes (throughput against the measured ceilings), SM throughput and
# the stall reasons.
METRIC_SETS["agent"] = (
    DURATION, "dram__bytes_read.sum", "dram__bytes_write.sum", "nvltx__bytes.sum", "nvlrx__bytes.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    *(stall_metric(r) for r in STALL_REASONS),
)
# Collected in one pass (no replay), for kernels whose replayed passes wait forever on a peer: the time, the
# DRAM traffic and the launch statistics (the last cost no pass at all).
ONE_PASS: tuple[str, ...] = (DURATION, "dram__bytes_read.sum", "dram__bytes_write.sum", "launch__registers_per_thread",
                             "launch__grid_size", "launch__block_size")
# NVLink's byte counters (Hopper's names): nothing to count where every rank shares one GPU.
NVLINK: tuple[str, ...] = ("nvltx__bytes.sum", "nvlrx__bytes.sum")
NO_NVLINK_ON_ONE_GPU = ("not collected: every rank shares one GPU (emulation), so no byte crosses NVLink; the peers' "
                        "loads and stores are this GPU's own memory traffic, counted in DRAM")
# Kernels never profiled: the emulation's barrier and signal kernels (by their PTX entry names).
NOT_PROFILED: tuple[str, ...] = (signals.BARRIER, signals.PUT_SIGNAL, signals.WAIT_SIGNAL)
# The share of the time left that a replayed set may take before the one-pass run replaces it (the one-shot
# all-reduce's whole replayed run took 24-30 s of its 120 s budget on one H200, docs/profiling.md).
REPLAY_SHARE = 0.55
DEFAULT_SETS = ("core", "throughput")
AGENT_SETS = ("agent",)
_TIME_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
_BYTES = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
          "kibyte": 1024.0, "mibyte": 1024.0**2, "gibyte": 1024.0**3}
_UNREADABLE = re.compile(r"Unable to access the following \d+ metrics?: ([^\n]*)")
_PASSES = re.compile(r'==PROF== Profiling "([^"]+)".*?(\d+)\s+pass', re.IGNORECASE)


@dataclass
class NcuKernel:
    name: str
    launches: int
    metrics: dict[str, float | None]  # summed over launches (time, bytes), time-weighted mean (%), max (launch)


@dataclass
class NcuRun:
    metric_set: str
    metrics: list[str]
    command: list[str]
    status: str  # collected, no_kernels, failed, timeout, skipped
    seconds: float = 0.0
    passes: dict[str, int] = field(default_factory=dict)
    message: str = ""
    unreadable: list[str] = field(default_factory=list)  # metrics ncu said it cannot access here


@dataclass
class NcuReport:
    rank: int
    replay: str
    calls: int
    status: str  # collected, partial, not_collected
    runs: list[NcuRun] = field(default_factory=list)
    kernels: list[NcuKernel] = field(default_factory=list)
    per_call: dict[str, float] = field(default_factory=dict)  # totals over kernels, divided by calls
    missing: dict[str, str] = field(default_factory=dict)  # metric -> why it was not collected
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


# -- pure pieces ----------------------------------------------------------------------------------------


def resolve_sets(selection: Sequence[str] | None) -> list[tuple[str, tuple[str, ...]]]:
    """Set names from METRIC_SETS, or metric names (containing '__') gathered into one custom set."""
    chosen = list(selection or DEFAULT_SETS)
    sets = [(name, METRIC_SETS[name]) for name in chosen if name in METRIC_SETS]
    custom = tuple(m for m in chosen if m not in METRIC_SETS)
    bad = [m for m in custom if "__" not in m]
    if bad:
        raise ValueError(f"unknown ncu metric set(s) {bad}; sets are {', '.join(METRIC_SETS)}, or give metric names")
    if custom:
        sets.append(("custom", custom))
    return sets


def ncu_command(ncu: str, report: Path, metrics: Sequence[str], *, replay: str = "kernel",
                launch_count: int = 64, skip: Sequence[str] = NOT_PROFILED) -> list[str]:
    command = [ncu, "--target-processes", "application-only", "--replay-mode", replay, "--cache-control", "none",
               "--clock-control", "none", "--profile-from-start", "off", "--launch-count", str(launch_count)]
    if skip:
        command += ["--kernel-name-base", "function", "--kernel-name", skip_filter(skip)]
    return command + ["--metrics", ",".join(metrics), "--export", str(report), "--force-overwrite"]


def skip_filter(names: Sequence[str]) -> str:
    """ncu's kernel filter that matches every kernel but the named ones (function names, matched whole)."""
    return "regex:^(?!(?:" + "|".join(re.escape(n) for n in names) + ")$)"


def _number(cell: str) -> float | None:
    text = cell.strip().replace(",", "") if re.fullmatch(r"[\d,]+(\.\d+)?", cell.strip()) else cell.strip()
    try:
        value = float(text)
    except ValueError:
        return None  # "n/a", "", or a string value
    return value


def _scaled(value: float | None, unit: str) -> float | None:
    """Times in nanoseconds, bytes in bytes; other units as printed."""
    if value is None:
        return None
    key = unit.strip().lower()
    if key in _TIME_NS:
        return value * _TIME_NS[key]
    if key in _BYTES:
        return value * _BYTES[key]
    return value


def parse_raw_csv(text: str, metrics: Sequence[str]) -> tuple[list[dict[str, Any]], set[str]]:
    """Rows of `ncu --import R --csv --page raw`: one dict per profiled kernel launch with the kernel's name
    and each requested metric's value (None for n/a), and the set of metrics the CSV had a column for."""
    lines = [line for line in text.splitlines() if line.startswith('"')]  # ncu's own chatter is unquoted
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header_at = next((i for i, row in enumerate(rows) if "Kernel Name" in row), None)
    if header_at is None:
        return [], set()
    header = rows[header_at]
    body = rows[header_at + 1:]
    units: list[str] = [""] * len(header)
    if body and (not body[0] or not body[0][0].strip()):  # the units row has no ID
        units = body[0] + [""] * (len(header) - len(body[0]))
        body = body[1:]
    name_col = header.index("Kernel Name")
    present = {m for m in metrics if m in header}
    out = []
    for row in body:
        if len(row) <= name_col:
            continue
        entry: dict[str, Any] = {"kernel": row[name_col]}
        for m in present:
            col = header.index(m)
            entry[m] = _scaled(_number(row[col]), units[col]) if col < len(row) else None
        out.append(entry)
    return out, present


def parse_passes(log: str) -> dict[str, int]:
    """Replay passes per profiled kernel, from ncu's "==PROF== Profiling ... - N passes" lines."""
    return {m.group(1): int(m.group(2)) for m in _PASSES.finditer(log)}


def unreadable_metrics(log: str, requested: Sequence[str]) -> list[str]:
    """The requested metrics ncu said it cannot access on this GPU and driver ("Unable to access the following
    8 metrics: nvlrx__bytes.avg, ..."; it names every rollup of a metric, so a match is by the part before the
    last dot). One such metric fails the whole run, so the caller runs again without them."""
    named = {m.strip().rstrip(".").rsplit(".", 1)[0] for found in _UNREADABLE.findall(log) for m in found.split(",")}
    return [m for m in requested if m.rsplit(".", 1)[0] in named]


def log_problems(log: str) -> list[str]:
    """What ncu itself said went wrong, in plain words where the cause is known."""
    found = []
    if "ERR_NVGPUCTRPERM" in log:
        found.append("no permission to read GPU performance counters (ERR_NVGPUCTRPERM): the driver restricts "
                     "them to admin users on this machine")
    if "No kernels were profiled" in log:
        found.append("ncu profiled no kernel inside the profiled range")
    for line in log.splitlines():
        if line.startswith("==ERROR==") and "ERR_NVGPUCTRPERM" not in line:
            found.append(line.removeprefix("==ERROR==").strip()[:300])
    return found[:6]


def _combine(metric: str) -> str:
    if metric.startswith("launch__"):
        return "max"
    if "pct" in metric or metric.endswith(".ratio"):  # rates and ratios: weighted by each launch's GPU time
        return "weighted"
    return "sum"


def aggregate(rows: list[dict[str, Any]], metrics: Sequence[str],
              calls: int) -> tuple[list[NcuKernel], dict[str, float]]:
    """Per kernel name over its launches, and per call over all kernels (sums / calls; percentages
    weighted by GPU time; launch statistics as the maximum)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_name.setdefault(row["kernel"], []).append(row)
    duration = DURATION

    def combined(group: list[dict[str, Any]], m: str) -> float | None:
        # (value, GPU time) of the launches that have the metric (parse_raw_csv leaves None where not)
        values: list[tuple[float, float]] = [(v, r.get(duration) or 0.0) for r in group if (v := r.get(m)) is not None]
        if not values:
            return None
        how = _combine(m)
        if how == "max":
            return max(v for v, _ in values)
        if how == "weighted":
            weight = sum(w for _, w in values)
            return sum(v * w for v, w in values) / weight if weight else sum(v for v, _ in values) / len(values)
        return sum(v for v, _ in values)

    kernels = [NcuKernel(name, len(group), {m: combined(group, m) for m in metrics})
               for name, group in by_name.items()]
    kernels.sort(key=lambda k: -(k.metrics.get(duration) or 0.0))
    per_call: dict[str, float] = {}
    for m in metrics:
        value = combined(rows, m)
        if value is not None:
            per_call[m] = value / max(calls, 1) if _combine(m) == "sum" else value
    return kernels, per_call


# -- what the model reads: per kernel, against the measured ceilings -----------------------------------------


@dataclass
class KernelSummary:
    """One kernel of the profiled rank, per call of `solution`: its GPU time and share of the call, DRAM and
    NVLink throughput against this machine's ceilings, SM throughput, and its top stall reasons."""

    name: str
    launches_per_call: float
    us_per_call: float | None
    share_of_call: float | None  # of the rank's call time (the timeline's), else of all kernels' GPU time
    share_basis: str
    dram_bytes_per_s: float | None
    dram_fraction: float | None  # of the HBM ceiling (read + write counted, as the ceiling is)
    nvlink_tx_bytes_per_s: float | None
    nvlink_rx_bytes_per_s: float | None
    nvlink_fraction: float | None  # the larger direction over the per-direction link ceiling
    sm_pct: float | None
    memory_pct: float | None
    stalls: list[tuple[str, float]]  # (reason, warps stalled per issue cycle), largest first


@dataclass
class Ceiling:
    bytes_per_s: float
    source: str  # measured / datasheet / reference machine


def _per_call(value: float | None, calls: int) -> float | None:
    return None if value is None else value / max(calls, 1)


def _rate(metrics: dict[str, float | None], seconds: float | None, calls: int, *names: str) -> float | None:
    """Bytes per second of the named byte counters (summed) over the kernel's GPU time, per call."""
    values = [metrics.get(n) for n in names]
    if not seconds or all(v is None for v in values):
        return None
    return sum(v or 0.0 for v in values) / max(calls, 1) / seconds


def summarize_kernels(report: NcuReport, *, hbm: Ceiling, link: Ceiling, call_us: float | None = None,
                      top: int = 4, stalls: int = 3) -> list[KernelSummary]:
    """The `top` kernels by GPU time (ncu's, per call of the profiled rank), each against the ceilings."""
    duration = DURATION
    total_ns = sum(k.metrics.get(duration) or 0.0 for k in report.kernels)
    out = []
    for k in report.kernels[:top]:
        m = k.metrics
        ns = _per_call(m.get(duration), report.calls)
        seconds = ns / 1e9 if ns else None

        dram = _rate(m, seconds, report.calls, "dram__bytes_read.sum", "dram__bytes_write.sum")
        tx = _rate(m, seconds, report.calls, "nvltx__bytes.sum")
        rx = _rate(m, seconds, report.calls, "nvlrx__bytes.sum")
        link_rate = max((r for r in (tx, rx) if r is not None), default=None)
        if call_us and ns is not None:
            share, basis = min(1.0, ns / 1e3 / call_us), "the rank's call time (timeline)"
        elif ns is not None and total_ns:
            share, basis = ns * max(report.calls, 1) / total_ns, "all profiled kernels' GPU time"
        else:
            share, basis = None, ""
        reasons = sorted(((r, v) for r in STALL_REASONS if r != "selected"
                          and (v := m.get(stall_metric(r))) is not None and v > 0), key=lambda rv: -rv[1])
        out.append(KernelSummary(
            name=k.name, launches_per_call=k.launches / max(report.calls, 1),
            us_per_call=None if ns is None else ns / 1e3,
            share_of_call=share, share_basis=basis, dram_bytes_per_s=dram,
            dram_fraction=None if dram is None else dram / hbm.bytes_per_s, nvlink_tx_bytes_per_s=tx,
            nvlink_rx_bytes_per_s=rx, nvlink_fraction=None if link_rate is None else link_rate / link.bytes_per_s,
            sm_pct=m.get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            memory_pct=m.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
            stalls=reasons[:stalls]))
    return out


# -- running ncu ------------------------------------------------------------------------------------------


def on_one_gpu(world_size: int, ranks_per_gpu: int, gpus: Sequence[int] | None = None) -> bool:
    """Every rank on the same GPU: the GPUs given (one per rank), else as many as harness.emulation's placement
    needs at `ranks_per_gpu` a GPU."""
    if gpus:
        return len(set(gpus)) == 1
    return layout.gpus_needed(world_size, ranks_per_gpu) == 1


def ncu_path() -> str | None:
    return shutil.which("ncu")


def _tail(path: Path, limit: int = 20000) -> str:
    try:  # the rank's log: what the unsandboxed candidate printed, read from its end only
        return hostile_files.read_tail(path, limit).decode(errors="replace")
    except (OSError, hostile_files.HostileFile):
        return ""


def _one_run(ncu: str, problem: Any, candidate: Path | None, metric_set: str, metrics: tuple[str, ...], *,
             world_size: int, shape: str, seed: int, rank: int, replay: str, calls: int, warmup: int,
             launch_count: int, deadline: float, workdir: Path, gpus: list[int] | None = None,
             ranks_per_gpu: int = 1) -> tuple[NcuRun, list[dict[str, Any]], set[str]]:
    # Deferred: the CLI reads this module's metric sets for its options; the rank pool and the builds are
    # needed only when ncu runs.
    from harness.compiling.compile import extensions_dir
    from harness.launch.pool import Hang, PoolError, RankPool

    report = workdir / f"{metric_set}.ncu-rep"
    logs = workdir / f"logs-{metric_set}"
    command = ncu_command(ncu, report, metrics, replay=replay, launch_count=launch_count)
    run = NcuRun(metric_set, list(metrics), command, "failed")
    started = time.monotonic()

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    base: dict[str, Any] = {"problem": problem.loader_spec, "shape": shape,
                            "candidate": str(Path(candidate).resolve()) if candidate else None}
    # Nsight Compute needs the GPU's performance counters, which the sandbox's user namespace cannot reach:
    # this pool runs the candidate unsandboxed (tests/exploits/README.md lists it). It decides nothing.
    pool = RankPool(world_size, "cuda", start_timeout=min(left(), 150.0), role="candidate", sandbox=False,
                    env={"TORCH_EXTENSIONS_DIR": str(extensions_dir())}, keep_logs=logs, rank_prefix={rank: command},
                    gpus=gpus, ranks_per_gpu=ranks_per_gpu)
    try:
        pool.start()
        if candidate is not None:
            from harness.rank.candidate import required_positional  # deferred with the pool (it imports torch)

            replies = pool.request({"op": "load_candidate", **base,
                                    "params": len(required_positional(problem.solution))}, timeout=left())
            if not all(r.get("ok") for r in replies):
                run.message = next(r.get("message", "") for r in replies if not r.get("ok"))
                return run, [], set()
        replies = pool.request({"op": "profile", **base, "seed": seed, "warmup": warmup, "iters": calls,
                                "mode": "ncu", "tag": uuid.uuid4().hex[:12]}, timeout=left())
        if not all(r.get("ok") for r in replies):
            run.message = next(r.get("message", "") for r in replies if not r.get("ok"))
            return run, [], set()
        pool.close(timeout=left())  # the ncu process writes its report once the worker exits
    except Hang as hang:
        run.status = "timeout"
        run.message = (f"ranks {hang.missing} did not finish within the budget: a profiled kernel may wait on a "
                       "peer that will not signal again (a replayed pass), or the launch under ncu is slow")
    except PoolError as err:
        run.message = f"the ranks did not start under ncu: {str(err)[:400]}"
    finally:
        pool.kill()
        run.seconds = time.monotonic() - started
    log = _tail(logs / f"rank{rank}.log")
    run.passes = parse_passes(log)
    run.unreadable = unreadable_metrics(log, metrics)
    said = log_problems(log)
    multi = {k: n for k, n in run.passes.items() if n > 1}
    if multi and replay == "application":
        said.append(f"{len(multi)} kernel(s) needed more than one pass ({max(multi.values())}): under application "
                    "replay that means relaunching the rank, which cannot work; use kernel replay")
    elif multi:
        said.append(f"{len(multi)} kernel(s) replayed in {max(multi.values())} passes (kernel replay): counters come "
                    "from different passes of the same launch")
    if run.status == "timeout" or not report.exists():
        run.message = "; ".join(x for x in [run.message, *said] if x) or "ncu wrote no report"
        return run, [], set()
    rows, present = _import(ncu, report, metrics, timeout=max(10.0, deadline - time.monotonic()),
                            keep=workdir / f"{metric_set}.csv")
    if rows is None:
        run.message = "; ".join(["ncu --import failed", *said])
        return run, [], set()
    run.status = "collected" if rows else "no_kernels"
    run.message = "; ".join(said) if said else ("" if rows else "no kernel ran inside the profiled range")
    return run, rows, present


def _import(ncu: str, report: Path, metrics: Sequence[str], timeout: float,
            keep: Path | None = None) -> tuple[list[dict[str, Any]] | None, set[str]]:
    """The report's raw page as rows (parse_raw_csv); `keep`: where the CSV ncu printed is saved as it is."""
    base = [ncu, "--import", str(report), "--csv", "--page", "raw"]
    for extra in (["--print-units", "base"], []):  # older ncu without --print-units: read the units row
        try:
            out = subprocess.run(base + extra, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return None, set()
        if out.returncode == 0:
            if keep is not None:
                keep.write_text(out.stdout)
            return parse_raw_csv(out.stdout, metrics)
    return None, set()


def collect(problem: Any, candidate: Path | None, *, world_size: int, device: str, shape: str, seed: int = 0,
            rank: int = 0, budget_s: float = 60.0, metrics: Sequence[str] | None = None,
            replay: str = "kernel", calls: int = 2, warmup: int = 2, launch_count: int = 64,
            gpus: list[int] | None = None, ranks_per_gpu: int = 1, keep_dir: Path | None = None,
            one_pass: bool = True) -> NcuReport:
    """Nsight Compute metrics of rank `rank`, one ncu run per metric set while the budget lasts. Never
    raises for what ncu cannot do: the report says what was not collected and why. `gpus`, `ranks_per_gpu`:
    where the ranks run (harness.emulation when ranks share a GPU); `keep_dir`: where each run's report
    (.ncu-rep) and its raw page (CSV, as `ncu --import --csv --page raw` printed it) are kept; `one_pass`: a
    set whose replayed passes never finish is counted again with ONE_PASS (module doc)."""
    started = time.monotonic()
    report = NcuReport(rank=rank, replay=replay, calls=calls, status="not_collected")
    sets = resolve_sets(metrics)
    wanted = [m for _, ms in sets for m in ms]
    ncu = ncu_path()
    reason = None
    if device != "cuda":
        reason = "Nsight Compute profiles GPUs: run with --device cuda"
    elif ncu is None:
        reason = "ncu is not on PATH"
    elif not 0 <= rank < world_size:
        reason = f"rank {rank} is not one of 0..{world_size - 1}"
    if reason is not None:
        report.missing = {m: reason for m in dict.fromkeys(wanted)}
        report.seconds = time.monotonic() - started
        return report
    assert ncu is not None
    deadline = started + budget_s
    per_run: list[list[dict[str, Any]]] = []
    collected: set[str] = set()
    unreadable: set[str] = set()
    why: dict[str, str] = {}
    if ranks_per_gpu > 1 and on_one_gpu(world_size, ranks_per_gpu, gpus):
        # Not asked for: they would read nothing here, and on a GPU without NVLink peers one such counter fails
        # the whole run (a wasted run of the budget before the set runs again without it).
        why.update({m: NO_NVLINK_ON_ONE_GPU for m in wanted if m in NVLINK})
        sets = [(name, rest) for name, ms in sets if (rest := tuple(m for m in ms if m not in NVLINK))]
    if NOT_PROFILED and ranks_per_gpu > 1:
        report.notes.append(f"not profiled: {', '.join(NOT_PROFILED)} (the emulation's barrier and signal kernels; "
                            "the timeline has their time)")
    with tempfile.TemporaryDirectory(prefix="pkb-ncu-") as tmp:
        for name, ms in sets:
            if deadline - time.monotonic() < 15.0:
                report.runs.append(NcuRun(name, list(ms), [], "skipped", message="the time budget ran out"))
                for m in ms:
                    why.setdefault(m, f"not collected: the {budget_s:.0f} s budget ran out before the '{name}' run")
                continue
            def attempt(metrics: tuple[str, ...], set_name: str = name,
                        until: float = deadline) -> tuple[NcuRun, list[dict[str, Any]], set[str]]:
                return _one_run(ncu, problem, candidate, set_name, metrics, world_size=world_size, shape=shape,
                                seed=seed, rank=rank, replay=replay, calls=calls, warmup=warmup,
                                launch_count=launch_count, deadline=until, workdir=Path(tmp), gpus=gpus,
                                ranks_per_gpu=ranks_per_gpu)

            # A set that needs a replay may hang on a kernel that waits on its peer: it gets a share of what is
            # left, so that the one-pass run after it still has time.
            replayed = one_pass and set(ms) - set(ONE_PASS)
            until = time.monotonic() + (deadline - time.monotonic()) * REPLAY_SHARE if replayed else deadline
            run, rows, present = attempt(ms, until=until)
            if run.status != "collected" and run.unreadable:
                # One metric this GPU cannot count (NVLink's on a machine without NVLink peers) fails the whole
                # run: record it, then run the set again without it.
                report.runs.append(run)
                for m in run.unreadable:
                    why.setdefault(m, "not readable here: ncu cannot access this counter on this GPU and driver")
                    unreadable.add(m)
                readable = tuple(m for m in ms if m not in run.unreadable)
                if not readable or deadline - time.monotonic() < 15.0:
                    continue
                run, rows, present = attempt(readable, until=until)
            kept_as = name
            if run.status == "timeout" and replayed and deadline - time.monotonic() >= 15.0:
                # The replayed passes never finished: count what one pass gives, with nothing replayed.
                report.runs.append(run)
                wait = ("not collected: ncu's replayed passes never finished (a kernel waits on a peer that does "
                        "not signal a replayed pass); counted in one pass instead: time, DRAM, launch")
                for m in ms:
                    if m not in ONE_PASS:
                        why.setdefault(m, wait)
                kept_as = f"{name}-one-pass"
                run, rows, present = attempt(tuple(m for m in ONE_PASS if m not in unreadable), kept_as)
                if run.status == "collected":
                    # Measured on one H200 (2026-12-02): the pull all-gather took 4.09 s per call under ncu
                    # against 2.5 ms in the timeline: the wait for a peer that ncu slows is in its time.
                    report.notes.append("counted in one pass (no replay): a kernel waits on its peer, and ncu's "
                                        "replayed passes of it never finished; its time under ncu includes that "
                                        "wait (the peer runs slower beside ncu): read its time in the timeline, "
                                        "and its rates here as lower bounds")
            report.runs.append(run)
            if keep_dir is not None:
                keep_dir.mkdir(parents=True, exist_ok=True)
                for kept in (Path(tmp) / f"{kept_as}.ncu-rep", Path(tmp) / f"{kept_as}.csv"):
                    if kept.is_file():
                        shutil.copy2(kept, keep_dir / kept.name)
            for m in dict.fromkeys((*ms, *(ONE_PASS if kept_as != name else ()))):
                if m in present and any(r.get(m) is not None for r in rows):
                    collected.add(m)
                elif run.status != "collected":
                    why.setdefault(m, f"not collected: '{name}' run {run.status}: {run.message}"[:400])
                elif m not in present:
                    why.setdefault(m, "ncu did not report it: not available on this GPU, driver or ncu version")
                else:
                    why.setdefault(m, "ncu reported n/a for every kernel")
            per_run.append(rows)
    report.missing = {m: w for m, w in why.items() if m not in collected}
    metric_names = list(dict.fromkeys(wanted))
    report.kernels, report.per_call = aggregate(merge_runs(per_run), metric_names, calls)
    report.status = "collected" if collected and not report.missing else ("partial" if collected else "not_collected")
    report.seconds = time.monotonic() - started
    return report


def merge_runs(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each run profiles the same calls, so the k-th launch of a kernel in one run is the k-th launch of
    that kernel in every other: their metrics join into one row (the first run's value wins a tie)."""
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for rows in runs:
        seen: dict[str, int] = {}
        for row in rows:
            k = seen.get(row["kernel"], 0)
            seen[row["kernel"]] = k + 1
            slot = merged.setdefault((row["kernel"], k), {"kernel": row["kernel"]})
            for key, value in row.items():
                if key != "kernel" and slot.get(key) is None:
                    slot[key] = value
    return list(merged.values())
