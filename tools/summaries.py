"""The harness's records as the short text a model reads: a roofline, a profile, Nsight Compute metrics.

The harness returns data (harness.measure.roofline.Roofline, harness.measure.profiling.ProfileReport,
harness.measure.ncu.NcuReport);
what the model sees of it is decided here, in priority order and within a token budget (tools.render).
`pkb roofline --text` and `pkb profile --text` print the same text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.common.kernel_names import short_name
from harness.measure.ncu import DURATION, STALL_PREFIX, STALL_REASONS
from tools.render import fit_lines

if TYPE_CHECKING:
    from harness.measure.ncu import KernelSummary, NcuReport
    from harness.measure.nsys import NsysReport
    from harness.measure.profiling import ProfileReport
    from harness.measure.roofline import Achieved, Roofline

# Short names of the Nsight Compute metrics the harness collects (harness.measure.ncu.METRIC_SETS).
NCU_LABELS = {
    "gpu__time_duration.sum": "GPU time",
    "nvltx__bytes.sum": "NVLink sent",
    "nvlrx__bytes.sum": "NVLink received",
    "dram__bytes_read.sum": "DRAM read",
    "dram__bytes_write.sum": "DRAM written",
    "launch__registers_per_thread": "registers/thread",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM throughput %",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory throughput %",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": "local-memory loads",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": "local-memory stores",
}


# -- units --------------------------------------------------------------------------------------------
def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_time(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e9:.0f} ns"


def fmt_flops(n: float) -> str:
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} FLOP"


# -- roofline -----------------------------------------------------------------------------------------
def _side_line(name: str, a: Achieved | None) -> str | None:
    if a is None:
        return None
    tail = "  IMPOSSIBLE: faster than the hardware allows" if a.impossible else ""
    return f"{name}: median {fmt_time(a.median_ms / 1e3)} ({a.clock}) = {a.fraction:.1%} of the bound{tail}"


def roofline_text(r: Roofline, max_tokens: int = 600) -> str:
    c = r.ceilings
    declared = f"; declared by the problem: {', '.join(r.declared)}" if r.declared else ""
    lines = [
        f"roofline {r.problem} shape={r.shape} W={r.world_size} ({r.traffic_source}{declared})",
        f"bound {fmt_time(r.bound_s)}, {r.binding}-bound (rank {r.bound_rank}): link {fmt_time(r.link_s)}, "
        f"HBM {fmt_time(r.hbm_s)}, compute {fmt_time(r.compute_s)}",
        f"per rank {r.bound_rank}: send {fmt_bytes(r.send_bytes)}, recv {fmt_bytes(r.recv_bytes)}, "
        f"HBM {fmt_bytes(r.hbm_bytes)}, {fmt_flops(r.flops)}",
    ]
    lines += [x for x in (_side_line("reference", r.reference), _side_line("candidate", r.candidate)) if x]
    lines.append(f"ceilings: link {c.link_bytes_per_s / 1e9:.0f} GB/s ({c.link_source}), HBM "
                 f"{c.hbm_bytes_per_s / 1e12:.2f} TB/s ({c.hbm_source}), matrix {c.matmul_flops_per_s / 1e12:.0f} "
                 f"TFLOP/s ({c.matmul_source})")
    if r.collectives:
        lines.append("collectives (bound rank): " + "; ".join(
            f"{k.kind} x{k.count} {fmt_bytes(k.bytes)} (W={k.group_size})" for k in r.collectives[:8]))
    if r.flags:
        lines.append("flags: " + ", ".join(r.flags))
    if len({(b.send_bytes, b.recv_bytes, b.hbm_bytes, b.flops) for b in r.ranks}) > 1:
        lines.append("ranks differ: " + "; ".join(
            f"r{b.rank} {fmt_time(b.bound_s)} {b.binding}" for b in r.ranks[:8]))
    lines += [f"note: {n}" for n in r.notes]
    return fit_lines(lines, max_tokens)


# -- profile ------------------------------------------------------------------------------------------
def _us(value: float) -> str:
    return f"{value / 1e3:.2f}ms" if value >= 1e4 else f"{value:.1f}us"


def profile_text(report: ProfileReport, max_tokens: int = 600) -> str:
    clock = "device time" if report.device == "cuda" else "host time (CPU: plumbing only)"
    lines = [f"profile {report.target} on {report.problem} shape={report.shape} W={report.world_size} "
             f"({report.device}): {report.iterations} iterations after {report.warmup} warm-up; "
             f"per-iteration means, {clock}",
             "rank call comm compute overlap idle gaps(>=1us) largest-gap"]
    for r in report.ranks:
        lines.append(f"r{r.rank} {_us(r.call_us)} {_us(r.comm_us)} {_us(r.compute_us)} {_us(r.overlap_us)} "
                     f"{_us(r.idle_us)} {r.gaps_per_iter:.1f} {_us(r.largest_gap_us)}")
    lines.append(f"slowest rank {report.slowest_rank}; skew {report.skew:.1%} ((max-min)/max of median call time)")
    slow = report.ranks[report.slowest_rank] if report.ranks else None
    if report.ncu is not None:
        lines.extend(nsight_lines(report))
    if report.nsys is not None:
        lines.append(nsys_line(report.nsys))
    if slow is not None and slow.kernels:
        lines.append(f"kernels on rank {slow.rank} ({slow.kernel_count} distinct, {slow.lanes} streams/threads):")
        lines.extend(f"  {k.name} [{k.kind}] {_us(k.us_per_iter)} x{k.launches_per_iter:g}" for k in slow.kernels)
    lines.extend(f"note: {n}" for n in report.notes)
    return fit_lines(lines, max_tokens)


# -- Nsight: per kernel, against the ceilings (the profile tool) ------------------------------------------------
def _rate(bytes_per_s: float | None) -> str:
    if bytes_per_s is None:
        return "n/a"
    return f"{bytes_per_s / 1e12:.2f} TB/s" if bytes_per_s >= 1e12 else f"{bytes_per_s / 1e9:.1f} GB/s"


def _pct(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{fraction:.0%}"


def kernel_line(k: KernelSummary, explain_stalls: bool) -> str:
    parts = [f"{k.us_per_call:.1f}us/call" if k.us_per_call is not None else "time n/a"]
    if k.share_of_call is not None:
        parts[0] += f" ({k.share_of_call:.0%} of the call)"
    if k.launches_per_call != 1:
        parts[0] += f" x{k.launches_per_call:g}"
    parts.append(f"DRAM {_rate(k.dram_bytes_per_s)} = {_pct(k.dram_fraction)} of HBM")
    if k.nvlink_tx_bytes_per_s is not None or k.nvlink_rx_bytes_per_s is not None:
        parts.append(f"NVLink out {_rate(k.nvlink_tx_bytes_per_s)} in {_rate(k.nvlink_rx_bytes_per_s)} = "
                     f"{_pct(k.nvlink_fraction)} of the link")
    if k.sm_pct is not None:
        parts.append(f"SM {k.sm_pct:.0f}%")
    if k.stalls:
        shown = [f"{r} {v:.2g}" + (f" ({STALL_REASONS[r]})" if explain_stalls and i == 0 else "")
                 for i, (r, v) in enumerate(k.stalls)]
        parts.append("stalls " + ", ".join(shown))
    return f"  {short_name(k.name, 70)}: " + "; ".join(parts)


def nsight_lines(report: ProfileReport) -> list[str]:
    """Nsight Compute as the model reads it: the top kernels against the ceilings, or one line saying why
    there are no counters (the timeline above stands alone then)."""
    ncu = report.ncu
    if not report.kernel_summary:
        # The kernels' time is the reason to say: counters this GPU cannot count (NVLink's on one GPU) are
        # missing too, but they are not why nothing came back (on 2026-12-02 the line blamed them for runs
        # whose replayed passes never finished).
        why = (ncu.missing.get(DURATION) or next(iter(ncu.missing.values()), None)
               or (ncu.runs[0].message if ncu.runs else "no kernel was profiled"))
        return [f"Nsight Compute: no counters read ({str(why)[:200]}); the timeline above is what there is"]
    c = report.ceilings or {}
    lines = [f"Nsight Compute, rank {ncu.rank}, per call ({ncu.replay} replay over {ncu.calls} calls); ceilings: HBM "
             f"{_rate(c.get('hbm_bytes_per_s'))} ({c.get('hbm_source')}), NVLink {_rate(c.get('link_bytes_per_s'))} "
             f"per direction ({c.get('link_source')}); stalls are warps stalled per issue cycle:"]
    lines += [kernel_line(k, explain_stalls=True) for k in report.kernel_summary]
    # One line per reason: the NVLink counters one GPU lacks, a replay that never finished.
    reasons = missing_by_reason(ncu.missing, lambda m: "stall reasons" if m.startswith(STALL_PREFIX) else
                                NCU_LABELS.get(m, m))
    for why, names in list(reasons.items())[:3]:
        more = f" and {len(names) - 6} more" if len(names) > 6 else ""
        lines.append(f"  not read: {', '.join(names[:6])}{more}: {why[:160]}")
    lines += [f"  note: {n[:200]}" for n in ncu.notes]
    return lines


def nsys_line(nsys: NsysReport) -> str:
    if nsys.status != "collected":
        return f"Nsight Systems: {nsys.message or nsys.status}"
    per = max(nsys.calls, 1)
    top = "; ".join(f"{short_name(k.name, 50)} {k.total_ns / per / 1e3:.1f}us x{k.instances / per:g}"
                    for k in nsys.kernels[:4])
    return f"Nsight Systems, rank {nsys.rank}, per call: {top}"


# -- Nsight Compute -----------------------------------------------------------------------------------
def _value(metric: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if "bytes" in metric:
        return fmt_bytes(value)
    if "time_duration" in metric:
        return f"{value / 1e3:.1f}us"
    if "pct" in metric:
        return f"{value:.0f}%"
    return f"{value:g}"


def ncu_lines(report: NcuReport) -> list[str]:
    runs = ", ".join(f"{r.metric_set}: {r.status}" + (f" ({max(r.passes.values())} pass)" if r.passes else "")
                     for r in report.runs)
    lines = [f"ncu on rank {report.rank} ({report.replay} replay, {report.calls} calls; runs: {runs or 'none'}): "
             f"{report.status}"]
    if report.per_call:
        lines.append("ncu per call: " + "; ".join(f"{NCU_LABELS.get(m, m)} {_value(m, v)}"
                                                  for m, v in report.per_call.items()))
    for k in report.kernels[:4]:
        shown = "; ".join(f"{NCU_LABELS.get(m, m)} {_value(m, v)}" for m, v in k.metrics.items() if v is not None)
        lines.append(f"ncu kernel {k.name[:60]} x{k.launches}: {shown}")
    reasons = missing_by_reason(report.missing, lambda m: NCU_LABELS.get(m, m))
    lines.extend(f"ncu not collected: {', '.join(names)}: {why}" for why, names in reasons.items())
    return lines


def missing_by_reason(missing: dict[str, str], label: Callable[[str], str]) -> dict[str, list[str]]:
    """Metrics not collected, grouped by why: reason -> their labels (each once, in the report's order)."""
    reasons: dict[str, list[str]] = {}
    for metric, why in missing.items():
        names = reasons.setdefault(why, [])
        if label(metric) not in names:
            names.append(label(metric))
    return reasons
