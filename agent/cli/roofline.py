"""`pkb roofline`: a problem's lower-bound time on this machine, and how close the reference (and a
candidate) comes to it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from agent.cli.common import CliError, console, escape, existing_file, plain, terminal_safe
from agent.cli.options import add_target_arguments
from tools.summaries import fmt_bytes, fmt_flops, fmt_time, roofline_text

if TYPE_CHECKING:
    from harness.measure.roofline import Roofline
    from harness.records.results import EvalResult


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("roofline", help="lower-bound time of a problem (interconnect, HBM, FLOPs) and the "
                                        "fraction of it the reference and a candidate reach")
    add_target_arguments(p, "candidate file: evaluate it and show its fraction too")
    p.add_argument("--no-timing", action="store_true", help="the bound only: time neither side")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the roofline record as JSON")
    out.add_argument("--text", action="store_true", help="print the short text a model gets (<= 600 tokens)")
    p.set_defaults(handler=cmd_roofline)


def cmd_roofline(args: argparse.Namespace) -> int:
    solution = existing_file(args.solution, "solution file") if args.solution else None
    # Deferred: the harness imports torch, which the parser does not need.
    from agent.cli.source import check_target, one_problem
    from harness.config import EvalConfig, TimingConfig
    from harness.evaluate import evaluate
    from harness.launch.pool import PoolError, RankPool
    from harness.measure.roofline import RooflineError, resolve_ceilings, roofline, time_reference, trace_reference

    problem = one_problem(args.problem)
    shape = check_target(problem, args.shape, args.world_size, args.device)
    quiet = args.json or args.text
    result: EvalResult | None = None
    try:
        ceilings = resolve_ceilings(device=args.device)
        if solution is not None:
            if not quiet:
                console.print(plain(f"evaluating {solution} on {problem.name} (shape {shape}, W={args.world_size}, "
                                    f"{args.device})"))
            config = EvalConfig(seed=args.seed, skip_timing=args.no_timing,
                                timing=TimingConfig.for_device(args.device))
            result = evaluate(problem, Path(solution), world_size=args.world_size, device=args.device, shape=shape,
                              config=config)
            r = roofline(problem, shape, args.world_size, args.device, ceilings, candidate_result=result,
                         seed=args.seed)
        else:
            with RankPool(args.world_size, args.device) as pool:
                traced = trace_reference(problem, shape, args.world_size, args.device, pool=pool, seed=args.seed)
                ref = None if args.no_timing else time_reference(pool, problem, shape, args.device, seed=args.seed)
            r = roofline(problem, shape, args.world_size, args.device, ceilings, reference_result=ref,
                         traced=traced)
    except (RooflineError, PoolError) as err:
        raise CliError(f"roofline of {problem.name}: {str(err).splitlines()[0]}") from None
    if args.json:
        print(json.dumps(json.loads(r.model_dump_json()), indent=2))  # beyond ASCII as \uXXXX: nothing a terminal obeys
    elif args.text:
        print(terminal_safe(roofline_text(r)))
    else:
        if result is not None and not result.correct:
            console.print(f"[red]{escape(result.summary_line())}[/red] (the candidate has no fraction)")
        render(r)
    return 0 if result is None or result.correct else 1


def render(r: Roofline) -> None:
    c = r.ceilings
    title = f"roofline {r.problem} shape={r.shape} W={r.world_size} ({r.device}; {r.traffic_source})"
    table = Table(title=plain(title))
    for col in ("rank", "send", "recv", "HBM", "FLOPs", "link", "HBM time", "compute", "bound", "binds"):
        table.add_column(col, justify="right" if col not in ("binds",) else "left")
    for b in r.ranks:
        mark = "*" if b.rank == r.bound_rank else ""
        table.add_row(f"{b.rank}{mark}", fmt_bytes(b.send_bytes), fmt_bytes(b.recv_bytes), fmt_bytes(b.hbm_bytes),
                      fmt_flops(b.flops), fmt_time(b.link_s), fmt_time(b.hbm_s), fmt_time(b.compute_s),
                      fmt_time(b.bound_s), b.binding)
    console.print(table)
    if r.declared:
        console.print(plain(f"declared by the problem's traffic(): {', '.join(r.declared)}; the rest traced"))
    console.print(plain(f"ceilings: link {c.link_bytes_per_s / 1e9:.0f} GB/s ({c.link_source}), HBM "
                        f"{c.hbm_bytes_per_s / 1e12:.2f} TB/s ({c.hbm_source}), matrix "
                        f"{c.matmul_flops_per_s / 1e12:.0f} TFLOP/s ({c.matmul_source})"))
    console.print(f"bound: [bold]{fmt_time(r.bound_s)}[/bold], {r.binding}-bound (rank {r.bound_rank})")
    if r.collectives:
        kinds = Table(title=f"traced collectives of rank {r.bound_rank}")
        for col in ("kind", "calls", "payload", "sent", "received", "group"):
            kinds.add_column(col, justify="left" if col == "kind" else "right")
        for k in r.collectives:
            kinds.add_row(k.kind, str(k.count), fmt_bytes(k.bytes), fmt_bytes(k.send_bytes), fmt_bytes(k.recv_bytes),
                          str(k.group_size))
        console.print(kinds)
    sides = [(name, a) for name, a in (("reference", r.reference), ("candidate", r.candidate)) if a is not None]
    if sides:
        timed = Table(title="measured (median, max over ranks per iteration)")
        for col in ("side", "median", "clock", "fraction of bound", ""):
            timed.add_column(col)
        for name, a in sides:
            timed.add_row(name, fmt_time(a.median_ms / 1e3), a.clock, f"{a.fraction:.1%}",
                          "[red]IMPOSSIBLE[/red]" if a.impossible else "")
        console.print(timed)
    for flag in r.flags:
        console.print(f"[red]flag: {escape(flag)}[/red]")
    for note in r.notes:
        console.print(plain(f"note: {note}"))
