"""`pkb problems list | show | validate`: the suite (or a ParallelKernelBench checkout's problems)."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table

from agent.cli.common import CliError, console, escape, plain, world_sizes
from agent.cli.options import add_source_argument
from harness.common.hostile_files import HostileFile, read_given

if TYPE_CHECKING:
    from harness.problems.problem import Problem
    from harness.validate import Validation


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    problems = sub.add_parser("problems", help="list, show and validate the problem suite")
    psub = problems.add_subparsers(dest="problems_command", metavar="ACTION", required=True)

    p = psub.add_parser("list", help="name, category, source and world sizes of each problem")
    p.add_argument("selection", nargs="*", help="names, globs (all_*), categories")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_source_argument(p)
    p.set_defaults(handler=cmd_list)

    p = psub.add_parser("show", help="a problem's spec, shapes and reference source")
    p.add_argument("name", help="the problem's name (or PKB id with --source pkb:PATH)")
    add_source_argument(p)
    p.set_defaults(handler=cmd_show)

    p = psub.add_parser("validate", help="distributed reference vs single-process oracle under gloo")
    p.add_argument("selection", nargs="*", help="names, globs (all_*), categories; default: all")
    p.add_argument("--world-size", default="2,4", help="comma-separated world sizes (default 2,4)")
    p.add_argument("--trials", type=int, default=3, help="trials (input draws) per problem and world size")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs")
    p.add_argument("--shape", default="small", help="shape name")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_source_argument(p)
    p.set_defaults(handler=cmd_validate)


def _row(problem: Problem) -> dict[str, Any]:
    return {
        "name": problem.name,
        "category": problem.category,
        "source": problem.source,
        "world_sizes": list(problem.world_sizes),
        "dtype": str(problem.dtype).replace("torch.", ""),
        "shapes": problem.shapes,
        "summary": problem.summary,
    }


def cmd_list(args: argparse.Namespace) -> int:
    from agent.cli.source import resolve_source, select_in  # loads the problems: torch, when the command runs

    problems = select_in(resolve_source(args.source), args.selection)
    if args.json:
        print(json.dumps([_row(p) for p in problems], indent=2))
        return 0
    table = Table(title=f"{len(problems)} problems", show_lines=False)
    for col in ("name", "category", "source", "world sizes"):
        table.add_column(col)
    for p in problems:
        src = f"{p.source['codebase']}: {p.source['path']} :: {p.source['symbol']}"
        table.add_row(plain(p.name), plain(p.category), plain(src), ",".join(map(str, p.world_sizes)))
    console.print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from agent.cli.source import one_in, resolve_source  # loads the problems: torch, when the command runs

    p = one_in(resolve_source(args.source), args.name)
    console.print(f"[bold]{escape(p.name)}[/bold]  ({escape(p.category)})")
    console.print(plain(f"source: {p.source['codebase']} — {p.source['path']} :: {p.source['symbol']}"))
    console.print(f"dtype: {str(p.dtype).replace('torch.', '')}   world sizes: {', '.join(map(str, p.world_sizes))}"
                  f"   tolerance: atol={p.atol:g} rtol={p.rtol:g}")
    console.print(plain(p.summary), "\n")
    shapes = Table(title="shapes")
    shapes.add_column("name")
    shapes.add_column("dimensions")
    for name, dims in p.shapes.items():
        shapes.add_row(plain(name), plain(", ".join(f"{k}={v}" for k, v in dims.items())))
    for name in p.held_out:  # scored at the end only; listed for people, never shown to a model
        shapes.add_row(plain(f"held-out:{name}"), plain(", ".join(f"{k}={v}" for k, v in p.held_out[name].items())))
    console.print(shapes)
    try:  # a checkout's file is the user's to point at: a plain file, opened without blocking, bounded
        source = read_given(p.path).decode(errors="replace")
    except HostileFile as err:
        raise CliError(str(err)) from None
    if console.is_terminal:  # word_wrap: a line longer than the terminal folds instead of being cut off at its edge
        console.print(Syntax(source, "python", line_numbers=False, word_wrap=True))
    else:  # a pipe or a file gets the file as it is (Syntax pads every line to the console's width)
        console.print(plain(source.rstrip("\n")))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    # Deferred: the problems and the rank pools import torch, which the parser does not need.
    from agent.cli.source import resolve_source, select_in
    from harness.validate import shapes_to_check, validate_problems

    problems = select_in(resolve_source(args.source), args.selection)
    sizes = world_sizes(args.world_size)
    jobs = sum(len(shapes_to_check(p, args.shape)) for w in sizes for p in problems if p.supports(w))
    results: list[Validation] = []
    started = time.perf_counter()
    with Progress(TextColumn("[bold]validate"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=args.json) as progress:
        task = progress.add_task("", total=jobs)

        def on_result(v: Validation) -> None:
            results.append(v)
            progress.update(task, advance=1, description=escape(f"W={v.world_size} {v.problem} {v.shape}"))
            if not v.ok and not args.json:
                failed = f"W={v.world_size} {v.problem} (shape {v.shape}): {v.verdict}: {v.message}"
                progress.console.print(f"[red]FAIL[/red] {escape(failed)}")

        validate_problems(problems, sizes, shape=args.shape, trials=args.trials, seed=args.seed,
                          on_result=on_result)
    elapsed = time.perf_counter() - started
    failed = [v for v in results if not v.ok]
    if args.json:
        print(json.dumps({"seconds": elapsed, "results": [v.__dict__ for v in results]}, indent=2))
    else:
        table = Table(title=f"validation: {len(results) - len(failed)} passed, {len(failed)} failed, {elapsed:.1f} s "
                            f"(shape {args.shape} and its held-out shape)")
        table.add_column("problem")
        table.add_column("category")
        for w in sizes:
            table.add_column(f"W={w}")
        by_key: dict[tuple[str, int], list[Validation]] = {}
        for v in results:
            by_key.setdefault((v.problem, v.world_size), []).append(v)
        for p in problems:
            cells = []
            for w in sizes:
                rows = by_key.get((p.name, w), [])
                bad = [v for v in rows if not v.ok]
                cells.append("—" if not rows else "[green]pass[/green]" if not bad else
                             "[red]" + escape(", ".join(f"{v.verdict} ({v.shape})" for v in bad)) + "[/red]")
            table.add_row(plain(p.name), plain(p.category), *cells)
        console.print(table)
        console.print(f"{len(results) - len(failed)} passed, {len(failed)} failed in {elapsed:.1f} s")
    return 1 if failed else 0
