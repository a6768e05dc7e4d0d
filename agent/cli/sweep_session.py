"""`pkb sweep` itself: the checks that need the suite and the model stack, the dry run, and the cells run one by
one through `pkb run`'s and `pkb search`'s own code, under one progress bar. agent.cli.sweep reads the file and
imports this module once it parses.

A run cell is the `pkb run` the cell's options describe (agent.sweep.spec gives them), parsed by `pkb run`'s
own parser, checked by its own checks (agent.cli.run.check_args) and run by its session
(agent.cli.run_session.run): created the first time, resumed (`--resume`, its options checked against the
stored run) after. So a cell resumes as `pkb run --resume` does and stops on Ctrl-C as `pkb run` does, with the
sweep's command printed to continue. A search cell is `pkb search`'s command (agent.cli.search.cmd_search).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from rich.progress import Progress
from rich.table import Table

from agent.budgets import Budget
from agent.cli import run as cli_run
from agent.cli import run_session
from agent.cli import search as cli_search
from agent.cli.common import CliError, console, plain
from agent.cli.run_config import config_from_args
from agent.cli.run_model import check_model
from agent.cli.source import check_shape, resolve_source, select_in
from agent.model_spec import ProviderError, parse_model_spec
from agent.model_table import ModelTableError, load_model_table
from agent.rundir import is_run_dir
from agent.runner import RunConfig
from agent.scripted import scripted_model
from agent.search.mutator import is_mutator
from agent.sweep import plan
from agent.sweep.layout import SweepDir, SweepLayoutError, write_header
from agent.sweep.spec import Cell, Sweep
from agent.usage import PriceTableError, load_price_table
from harness.emulation import layout
from harness.problems.problem import Problem

# Stop reasons of a search that `pkb search --resume` continues (agent.search.loop, agent.search.stopping).
RESUMABLE_SEARCH = ("model_fatal", "provider_unavailable", "interrupted", "internal_error")


class _Parser(argparse.ArgumentParser):
    """A command's parser whose mistakes are one CliError line (a cell's options come from the file)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(message)


def _parser(add: Any, prog: str) -> _Parser:
    parser = _Parser(prog=prog, add_help=False)
    add(parser)
    return parser


RUN_PARSER = _parser(cli_run.add_arguments, "pkb run")
SEARCH_PARSER = _parser(cli_search.add_arguments, "pkb search")


@dataclass
class Planned:
    """A cell with its command line, and for a run cell its config and how many samples it has."""

    cell: Cell
    argv: list[str]
    config: RunConfig | None = None
    samples: int = 0
    executor: tuple[str, ...] = ()  # the executor options, which a resumed search is given again


# -- checks -----------------------------------------------------------------------------------------
def problems_of(sweep: Sweep) -> tuple[list[Problem], list[str]]:
    """The sweep's problems that support its world size, and the names of those that do not."""
    spec = sweep.spec
    try:
        chosen = select_in(resolve_source(spec.source), spec.problems or None)
        usable = [p for p in chosen if p.supports(spec.world_size)]
        if not usable:
            raise CliError(f"no selected problem supports world size {spec.world_size}")
        for p in usable:
            check_shape(p, sweep.shape)
    except CliError as err:
        raise CliError(f"{sweep.path}: problems: {err}") from None
    return usable, [p.name for p in chosen if p not in usable]


def check_models(sweep: Sweep) -> None:
    """Every model must be one pkb can call: a script file that loads, or a model the model table or the price
    table lists (or any model on a server of the user's own, base_url). Clients are built (a missing key) when
    the sweep runs, not for a dry run."""
    for label in sweep.labels:
        entry = sweep.model(label)
        spec = parse_model_spec(entry.model_text(sweep.base))
        where = f"{sweep.path}: model {label} ({spec.text})"
        if spec.provider == "scripted":
            if is_mutator(spec.name):  # the search's own scripted model: it proposes, it runs no agent loop
                if sweep.conditions:
                    raise CliError(f"{where}: scripted:mutator writes search proposals only; give the sweep "
                                   "conditions.names = [] and a [search] table, or another model")
                continue
            try:
                scripted_model(spec.name)
            except ProviderError as err:
                raise CliError(f"{where}: {err}") from None
            continue
        try:
            table = load_model_table(str(sweep.base / entry.models) if entry.models else None)
            prices = load_price_table(str(sweep.base / entry.prices) if entry.prices else None)
        except (ModelTableError, PriceTableError) as err:
            raise CliError(f"{where}: {err}") from None
        if entry.base_url is None and table.info(spec.text) is None and prices.price(spec.text) is None:
            raise CliError(f"{where}: unknown model: neither the model table {table.source} nor the price table "
                           f"{prices.source} lists it; give base_url for a server of your own, or models = FILE "
                           "that lists it")


def plan_cells(sweep: Sweep, problems: Sequence[Problem], directory: SweepDir, args: argparse.Namespace
               ) -> list[Planned]:
    """Every cell's command line, each parsed and checked by its command's own parser and checks."""
    names = [p.name for p in problems]
    spec = sweep.spec
    common = ["--problems", *names, "--device", spec.device, "--world-size", str(spec.world_size), "--shape",
              sweep.shape, "--trials", str(spec.trials), *(["--no-timing"] if not spec.timing else []),
              *(["--no-guide"] if not spec.guide else []), *(["--source", spec.source] if spec.source else [])]
    executor = ["--executor", args.executor, "--ray-retries", str(args.ray_retries),
                *(["--ray-address", args.ray_address] if args.ray_address else [])]
    out = []
    for cell in sweep.cells():
        model = sweep.model(cell.model)
        if cell.kind == "run":
            argv = [*model.run_options(sweep.base), "--condition", cell.condition, "--samples", str(spec.samples),
                    "--seed", str(cell.seed), "--ranks-per-gpu", str(spec.ranks_per_gpu), "--concurrency",
                    str(spec.concurrency), *spec.budgets.run_options(), *common, *executor,
                    "--run-id", cell.id, "--runs-dir", str(directory.cells)]
            cell_args = _parse(RUN_PARSER, argv, cell)
            try:
                cli_run.check_args(cell_args)
                config = config_from_args(cell_args)
            except CliError as err:
                raise CliError(f"{sweep.path}: cell {cell.id}: {err}") from None
            out.append(Planned(cell, argv, config, len(names) * spec.samples))
        else:
            search = spec.search
            assert search is not None
            argv = [*_search_model_options(model.run_options(sweep.base)), "--proposer", cell.condition,
                    "--seed", str(cell.seed), "--ranks-per-gpu", str(spec.ranks_per_gpu), *search.search_options(),
                    *common, *executor, "--no-live", "--run-id", cell.id, "--runs-dir", str(directory.cells)]
            _parse(SEARCH_PARSER, argv, cell)
            out.append(Planned(cell, argv, executor=tuple(executor)))
    return out


def _search_model_options(run_options: list[str]) -> list[str]:
    """The model options `pkb search` shares with `pkb run` (the rest are the agent loop's own)."""
    shared = {"--model", "--base-url", "--api-key-env", "--prices", "--temperature", "--max-reply-tokens"}
    out = []
    for i in range(0, len(run_options)):
        if run_options[i] in shared and i + 1 < len(run_options):
            out += run_options[i:i + 2]
    return out


def _parse(parser: _Parser, argv: list[str], cell: Cell) -> argparse.Namespace:
    try:
        return parser.parse_args(argv)
    except CliError as err:
        raise CliError(f"cell {cell.id}: {err}") from None


# -- the dry run ------------------------------------------------------------------------------------
def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "unbounded"
    if unit == "$":
        return f"${value:,.2f}"
    if unit == "h":
        return f"{value / 3600:,.2f} h"
    return f"{value:,.0f}"


def ceiling(sweep: Sweep, planned: Sequence[Planned], problems: int) -> tuple[list[list[str]], plan.Ceiling]:
    """The budget ceiling per model (run cells) and for the searches, and the total."""
    rows: list[list[str]] = []
    total = plan.ZERO
    gpus = layout.gpus_needed(sweep.spec.world_size, sweep.spec.ranks_per_gpu)
    for label in sweep.labels:
        mine = [p for p in planned if p.cell.kind == "run" and p.cell.model == label]
        if not mine:
            continue
        config = mine[0].config
        assert config is not None
        price = None
        try:
            price = load_price_table(config.prices).price(parse_model_spec(config.model).text)
        except PriceTableError:
            pass
        part = plan.run_cells(Budget.from_dict(config.budgets), cells=len(mine), samples_per_cell=mine[0].samples,
                              price=price, device=sweep.spec.device, gpus_per_evaluation=gpus,
                              concurrency=sweep.spec.concurrency)
        rows.append(_ceiling_row(f"{label} (runs)", part))
        total = total + part
    searches = [p for p in planned if p.cell.kind == "search"]
    if searches:
        assert sweep.spec.search is not None
        part = plan.search_cells(sweep.spec.search.options, cells=len(searches), problems=problems,
                                 device=sweep.spec.device)
        rows.append(_ceiling_row("searches", part))
        total = total + part
    return rows, total


def _ceiling_row(name: str, c: plan.Ceiling) -> list[str]:
    return [name, str(c.cells), str(c.samples), _fmt(c.tokens, "n"), _fmt(c.cost_usd, "$"), _fmt(c.wall_s, "h"),
            "—" if c.gpu_s == 0 else _fmt(c.gpu_s, "h")]


def print_dry_run(sweep: Sweep, planned: Sequence[Planned], problems: Sequence[Problem], skipped: list[str]) -> None:
    matrix = Table(title=plain(f"sweep {sweep.name}: {len(planned)} cells, {len(problems)} problem(s): "
                               f"{', '.join(p.name for p in problems)}"))
    matrix.add_column("cell", no_wrap=True)  # a cell's id stays whole: it names the cell's folder
    for col in ("kind", "model", "condition / proposer", "seed", "samples"):
        matrix.add_column(col)
    for p in planned:
        matrix.add_row(plain(p.cell.id), p.cell.kind, plain(p.cell.model), plain(p.cell.condition), str(p.cell.seed),
                       str(p.samples) if p.cell.kind == "run" else "—")
    console.print(matrix)
    if skipped:
        console.print(plain(f"left out (no world size {sweep.spec.world_size}): {', '.join(skipped)}"))
    rows, total = ceiling(sweep, planned, len(problems))
    table = Table(title=plain("budget ceiling (the most the budgets allow; docs/sweep.md)"))
    for col in ("part", "cells", "samples / candidates", "tokens", "dollars", "wall (serial)", "GPU"):
        table.add_column(col)
    for row in rows:
        table.add_row(*map(plain, row))
    table.add_row(*map(plain, _ceiling_row("total", total)))
    console.print(table)
    for why in total.why:
        console.print(plain(f"unbounded {why}"))


# -- running ----------------------------------------------------------------------------------------
def _search_done(folder: Path) -> str | None:
    """What a search cell that ended for good found (its stop reason, and per problem the reported speedup);
    None while `--resume` would continue it."""
    from agent.search.archive import Archive  # sqlite: only for search cells
    from agent.search.layout import SearchDir, load_config
    from agent.search.loop import search_stop_reason
    from agent.search.summary import problem_rows

    search = SearchDir(folder)
    if not search.archive.is_file():
        return None
    config = load_config(search)
    with Archive(search.archive) as archive:
        events = search.events
        finished = events.is_file() and '"search_finished"' in events.read_text(errors="replace")
        reason = search_stop_reason(archive)
        rows = problem_rows(archive, config.problems, config.remeasure, config.device)
    if not finished or reason in RESUMABLE_SEARCH:
        return None
    found = "; ".join(f"{r.problem} {r.correct}/{r.evaluated} correct, reported "
                      + (f"{r.reported.speedup:.3g}x" if r.reported and r.reported.speedup is not None else "none")
                      for r in rows)
    return f"{reason}: {found}"


def run_cells(sweep: Sweep, planned: Sequence[Planned], directory: SweepDir, resume_hint: str
              ) -> tuple[list[tuple[Planned, str]], str | None]:
    """Every cell not done yet, in order, under one progress bar; returns (cell, outcome) and a fatal error."""
    done = directory.done()
    outcomes: list[tuple[Planned, str]] = []
    total = sum(p.samples for p in planned)
    searches = [p for p in planned if p.cell.kind == "search"]
    fatal = None
    with Progress(*run_session.PROGRESS_COLUMNS, console=console) as progress:
        task = progress.add_task(sweep.name, total=total, stats="")
        search_task = progress.add_task("searches", total=len(searches), stats="") if searches else None
        tally = run_session.Tally()
        within = run_session.Within(progress, task, tally, resume_hint)
        for index, p in enumerate(planned, start=1):
            label = f"{sweep.name} [{index}/{len(planned)}] {p.cell.id}"
            if p.cell.id in done:
                progress.update(task if p.cell.kind == "run" else search_task or task,
                                advance=p.samples if p.cell.kind == "run" else 1)
                facts = done[p.cell.id]
                said = (f"stopped: {facts.get('outcome')}" if p.cell.kind == "search"
                        else f"{facts.get('correct', '?')}/{facts.get('samples', '?')} correct")
                outcomes.append((p, f"{said} (done before)"))
                continue
            progress.update(task, description=label)
            if p.cell.kind == "run":
                outcome, fatal = _run_cell(p, directory, within)
            else:
                progress.stop()  # a search prints its own lines; the bar comes back after it
                outcome = _search_cell(p, directory)
                progress.start()
                assert search_task is not None
                progress.update(search_task, advance=1)
            outcomes.append((p, outcome))
            if fatal is not None:
                break
    return outcomes, fatal


def _run_cell(p: Planned, directory: SweepDir, within: run_session.Within) -> tuple[str, str | None]:
    folder = directory.cell(p.cell.id)
    argv = p.argv + (["--resume"] if is_run_dir(folder) else [])
    args = _parse(RUN_PARSER, argv, p.cell)
    cli_run.check_args(args)
    try:
        summary, _, _ = run_session.run(args, within)
    except CliError as err:
        raise CliError(f"cell {p.cell.id}: {err}") from None
    if summary.fatal:
        return "stopped", f"cell {p.cell.id}: {summary.fatal}"
    if summary.complete and summary.infra_errors:  # not done: running the sweep again judges them again
        return (f"incomplete: {summary.infra_errors} sample(s) in infra_error (running the sweep again judges them "
                "again)"), None
    if summary.complete:
        directory.mark_done(p.cell, samples=summary.total,
                            correct=sum(1 for r in summary.records if r.get("correct")))
        return f"{sum(1 for r in summary.records if r.get('correct'))}/{summary.total} correct", None
    return f"unfinished: {summary.total - len(summary.records)} of {summary.total} samples", None


def _search_cell(p: Planned, directory: SweepDir) -> str:
    folder = directory.cell(p.cell.id)
    if (folder / "search.json").is_file():
        reason = _search_done(folder)
        if reason is not None:
            directory.mark_done(p.cell, outcome=reason)
            return f"stopped: {reason}"
        argv = ["--run-id", p.cell.id, "--runs-dir", str(directory.cells), "--resume", "--no-live", *p.executor]
    else:
        argv = p.argv
    code = cli_search.cmd_search(_parse(SEARCH_PARSER, argv, p.cell))
    reason = _search_done(folder)
    if code == 0 and reason is not None:
        directory.mark_done(p.cell, outcome=reason)
        return f"stopped: {reason}"
    return "unfinished (running the sweep again continues it)"


def print_outcomes(sweep: Sweep, outcomes: Sequence[tuple[Planned, str]], directory: SweepDir) -> None:
    ended = sum(1 for _, o in outcomes if not o.startswith(("unfinished", "incomplete")))
    table = Table(title=plain(f"sweep {sweep.name}: {ended} of {len(outcomes)} cells ended"))
    table.add_column("cell", no_wrap=True)  # whole: it names the cell's folder
    table.add_column("outcome")
    for p, outcome in outcomes:
        table.add_row(plain(p.cell.id), plain(outcome))
    console.print(table)
    console.print(plain(f"results: {directory.path}   report: pkb report {directory.path}"))


def execute(sweep: Sweep, args: argparse.Namespace) -> int:
    """`pkb sweep` once its file has parsed."""
    problems, skipped = problems_of(sweep)
    check_models(sweep)
    directory = SweepDir(Path(args.runs_dir) / sweep.name)
    planned = plan_cells(sweep, problems, directory, args)
    if args.dry_run:
        print_dry_run(sweep, planned, problems, skipped)
        return 0
    for label in sweep.labels:  # builds each client: a missing key or a bad setting is one line, before any work
        config = next((p.config for p in planned if p.cell.model == label and p.config is not None), None)
        if config is not None:
            check_model(config)
    if skipped:
        print(f"pkb: skipping problem(s) without world size {sweep.spec.world_size}: {', '.join(skipped)}",
              file=sys.stderr)
    for other in ("run.json", "search.json"):
        if (directory.path / other).exists():
            raise CliError(f"{directory.path} holds a run ({other}), not a sweep: give the sweep another name")
    try:
        new = write_header(directory, sweep, [p.name for p in problems])
    except SweepLayoutError as err:
        raise CliError(f"{err}: is {directory.path} another sweep's folder? give the file another name") from None
    done = directory.done()
    console.print(plain(f"sweep {sweep.name}: {len(planned)} cells ({sum(p.cell.id in done for p in planned)} done "
                        f"before, {len(new)} new) under {directory.path}"))
    hint = f"pkb sweep {sweep.path} --runs-dir {args.runs_dir}"
    outcomes, fatal = run_cells(sweep, planned, directory, hint)
    print_outcomes(sweep, outcomes, directory)
    if fatal is not None:
        raise CliError(f"{fatal}; continue with: {hint}")
    if any(o.startswith(("unfinished", "incomplete")) for _, o in outcomes) or len(outcomes) < len(planned):
        console.print(plain(f"continue with: {hint}"))
        return 1
    return 0
