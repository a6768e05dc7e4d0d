"""`pkb profile`: where a candidate's time goes, per rank (PyTorch profiler), plus Nsight Compute metrics
of one rank on GPUs. `--ranks-per-gpu` places the ranks as `pkb eval` does (agent.cli.emulation); ranks that
share a GPU are profiled the same way, and the output says what such a profile can and cannot tell."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from rich.table import Table

from agent.cli import emulation
from agent.cli.common import CliError, console, escape, existing_file, plain, terminal_safe
from agent.cli.options import add_target_arguments
from harness.measure import ncu as nsight  # the metric sets, for the options (the standard library only)
from tools.summaries import ncu_lines

if TYPE_CHECKING:
    from harness.measure.profiling import ProfileReport


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("profile", help="per-rank kernel timeline (communication, compute, overlap, idle, skew) "
                                       "and, on GPUs, Nsight Compute metrics of one rank")
    add_target_arguments(p, "candidate file (default: profile the reference)")
    emulation.add_argument(p)
    p.add_argument("--iters", type=int, default=5, help="profiled calls per rank")
    p.add_argument("--warmup", type=int, default=3, help="calls per rank before the profiled ones")
    p.add_argument("--ncu", action=argparse.BooleanOptionalAction, default=None,
                   help="Nsight Compute metrics of one rank (default: on with --device cuda)")
    p.add_argument("--ncu-rank", type=int, default=0, help="the rank run under ncu (the others run free)")
    p.add_argument("--ncu-budget", type=float, default=60.0, help="seconds for all ncu runs together")
    p.add_argument("--ncu-metrics", default=",".join(nsight.DEFAULT_SETS),
                   help=f"metric sets ({', '.join(nsight.METRIC_SETS)}) or metric names, comma-separated; "
                        "one ncu run per set")
    p.add_argument("--ncu-replay", choices=("kernel", "application"), default="kernel",
                   help="ncu's replay mode: each kernel on its own, or the whole application")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the profile as JSON")
    out.add_argument("--text", action="store_true", help="print the short text a model gets (<= 600 tokens)")
    p.set_defaults(handler=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> int:
    # What the arguments alone show is said before anything heavy is imported.
    solution = existing_file(args.solution, "solution file") if args.solution else None
    if args.iters < 1 or args.warmup < 0:
        raise CliError("--iters must be at least 1 and --warmup at least 0")
    use_ncu = args.device == "cuda" if args.ncu is None else args.ncu
    metrics = [m.strip() for m in args.ncu_metrics.split(",") if m.strip()]
    try:
        nsight.resolve_sets(metrics)
    except ValueError as err:
        raise CliError(str(err)) from None
    if use_ncu and not 0 <= args.ncu_rank < args.world_size:
        raise CliError(f"--ncu-rank {args.ncu_rank} is not a rank of W={args.world_size}")
    emulation.check(args.device, args.world_size, args.ranks_per_gpu)
    # Deferred: the profiler and the problems import torch.
    from agent.cli.source import check_target, one_problem
    from harness.measure.profiling import ProfileError, profile

    problem = one_problem(args.problem)
    shape = check_target(problem, args.shape, args.world_size, args.device, args.ranks_per_gpu)
    quiet = args.json or args.text
    if not quiet:
        where = f"{args.device}, {args.ranks_per_gpu} ranks per GPU, emulated" if args.ranks_per_gpu > 1 \
            else args.device
        console.print(plain(f"profiling {solution or 'the reference'} on {problem.name} (shape {shape}, "
                            f"W={args.world_size}, {where}{f', ncu on rank {args.ncu_rank}' if use_ncu else ''})"))
    try:
        report = profile(problem, solution, world_size=args.world_size, device=args.device, shape=shape,
                         seed=args.seed, warmup=args.warmup, iters=args.iters, ncu=use_ncu, ncu_rank=args.ncu_rank,
                         ncu_budget_s=args.ncu_budget, ncu_metrics=metrics, ncu_replay=args.ncu_replay,
                         ranks_per_gpu=args.ranks_per_gpu)
    except ProfileError as err:
        if args.json:
            print(json.dumps({"ok": False, "verdict": err.verdict, "message": str(err), "evidence": err.evidence}))
        else:
            console.print(f"[red]{escape(err.verdict)}[/red]: {escape(str(err))}")
            if err.evidence and not args.text:
                console.print(plain(err.evidence), highlight=False)
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif args.text:
        from tools.profile import answer_text  # what the model reads (deferred with the profiler it imports)

        print(terminal_safe(answer_text(report)))  # kernel names are the candidate's
    else:
        render(report)
    return 0


def _us(value: float) -> str:
    return f"{value:.1f}"


def render(report: ProfileReport) -> None:
    for line in report.emulation:  # what an emulated profile cannot tell, before its numbers
        console.print(f"[yellow]{escape(line)}[/yellow]", highlight=False)
    unit = "device µs" if report.device == "cuda" else "host µs (CPU: plumbing only)"
    if report.ranks_per_gpu > 1:
        unit += f", {report.ranks_per_gpu} ranks per GPU: not speedups"
    table = Table(title=plain(f"{report.target} on {report.problem} shape={report.shape} W={report.world_size}: "
                              f"{report.iterations} profiled calls, per-call means ({unit})"))
    for col in ("rank", "call", "median", "comm", "compute", "overlap", "idle", "gaps", "max gap", "kernels"):
        table.add_column(col, justify="right")
    for r in report.ranks:
        mark = "*" if r.rank == report.slowest_rank else ""
        table.add_row(f"{r.rank}{mark}", _us(r.call_us), _us(r.call_median_us), _us(r.comm_us), _us(r.compute_us),
                      _us(r.overlap_us), _us(r.idle_us), f"{r.gaps_per_iter:.1f}", _us(r.largest_gap_us),
                      str(r.kernel_count))
    console.print(table)
    console.print(f"* slowest rank; gaps: idle stretches of at least 1 µs per call; skew between ranks: "
                  f"{report.skew:.1%} ((max - min) / max of the median call)")
    slow = report.ranks[report.slowest_rank] if report.ranks else None
    if slow is not None and slow.kernels:
        kernels = Table(title=f"kernels of rank {slow.rank} (per call)")
        for col in ("kernel", "kind", "µs", "launches"):
            kernels.add_column(col, justify="left" if col in ("kernel", "kind") else "right")
        for k in slow.kernels:
            kernels.add_row(plain(k.name), plain(k.kind), _us(k.us_per_iter), f"{k.launches_per_iter:g}")
        console.print(kernels)
    if report.ncu is not None:
        for line in ncu_lines(report.ncu):
            console.print(plain(line), highlight=False)
    for note in report.notes:
        console.print(plain(f"note: {note}"))
    console.print(f"took {report.seconds:.1f} s")
