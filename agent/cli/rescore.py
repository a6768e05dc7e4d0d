"""`pkb rescore RUN [--concurrency N] [--remeasure K]`: a run's kernels scored again, afresh.

A sample run (`pkb run`): every distinct candidate of every sample, scored by the final scorer; the report
(`pkb report RUN`) then draws pass and best speedup by turn, tokens and dollars as the final scorer sees them,
beside the tools' own evidence (agent.rescore, agent.report.trajectories).

A search run (`pkb search`): each problem's reported kernel re-measured K more times (default: the search's
--remeasure) on seeds of its own, by the function the search's own re-measurement calls; printed beside
the in-search figure and the search's re-measured one, with whether the two re-measurements agree
(agent.search.rescore).

Both go through agent.remeasure, one function for every figure measured after the fact.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.cli.common import CliError, console, plain


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rescore", help="score a run's kernels again, afresh: every distinct candidate of a sample "
                                       "run (for the report's trajectories), or each problem's reported kernel of "
                                       "a search run")
    p.add_argument("run", metavar="RUN", help="a run directory (runs/<run_id>) of pkb run or pkb search")
    p.add_argument("--concurrency", type=int, default=1, help="samples (or a search's problems) rescored at once "
                                                              "(default 1)")
    p.add_argument("--remeasure", type=int, metavar="K", help="a search run: fresh evaluations of each reported "
                                                              "kernel (default: the search's --remeasure)")
    # For tests of a search run's rescore: a module with evaluate() (harness.evaluate.evaluate's signature), as
    # `pkb search --evaluator`.
    p.add_argument("--evaluator", help=argparse.SUPPRESS)
    p.set_defaults(handler=cmd_rescore)


def cmd_rescore(args: argparse.Namespace) -> int:
    if args.concurrency < 1:
        raise CliError(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.remeasure is not None and args.remeasure < 1:
        raise CliError(f"--remeasure must be at least 1, got {args.remeasure}")
    from agent.search.layout import is_search_dir  # the search's folder: cheap, no torch

    if is_search_dir(Path(args.run)):
        return _rescore_search(args)
    if args.remeasure is not None or args.evaluator:
        raise CliError("--remeasure and --evaluator are for a search run; a sample run is scored once per candidate "
                       "on the final scoring's seed")
    # Deferred: the harness imports torch. Neither this nor the search's rescore loads the model stack (LangChain,
    # LangGraph): scoring files needs none of it (agent.final_scoring).
    from agent.cli.source import resolve_source
    from agent.rescore import rescore_run
    from agent.run_config import RunError, load_run_config
    from agent.rundir import RunLayout

    run = RunLayout(Path(args.run))
    try:
        config = load_run_config(run)
    except RunError as err:
        raise CliError(str(err)) from None
    problems = {p.name: p for p in resolve_source(config.source, config.precision)}
    summary = rescore_run(run, config, problems, concurrency=args.concurrency,
                          progress=lambda line: console.print(plain(line)))
    if summary.missing_problems:
        missing = ", ".join(sorted(set(summary.missing_problems)))
        console.print(plain(f"not rescored (problem not in the source): {missing}"))
    console.print(plain(f"{summary.samples} sample(s), {summary.candidates} candidate file(s): {summary.scored} "
                        f"scored, {summary.reused} already scored or the same source; pkb report {run.path} draws "
                        "them"))
    return 0


def _rescore_search(args: argparse.Namespace) -> int:
    # Deferred: the search's scoring, the harness and the executors import torch.
    from agent.cli.search import evaluator_from, scheduler_for
    from agent.cli.source import resolve_source
    from agent.executors.interface import as_evaluate
    from agent.executors.local import LocalExecutor
    from agent.search.layout import SearchDir, SearchError, load_config
    from agent.search.rescore import rescore_search
    from harness.common.flags import timing_note

    directory = SearchDir(Path(args.run))
    try:
        config = load_config(directory)
    except SearchError as err:
        raise CliError(str(err)) from None
    evaluate, _ = evaluator_from(args.evaluator)
    if evaluate is None:  # this node's devices, in the scheduler's leases (LocalExecutor holds nothing to close)
        evaluate = as_evaluate(LocalExecutor(scheduler_for(config.device, config.world_size, "local",
                                                           config.ranks_per_gpu)))
    problems = {p.name: p for p in resolve_source(config.source)}
    rows = rescore_search(directory, problems, evaluate, k=args.remeasure, concurrency=args.concurrency,
                          progress=lambda line: console.print(plain(line)))
    for row in rows:
        console.print(plain(row.line()), soft_wrap=True)
    note = timing_note(config.device)
    if note:
        console.print(plain(f"({note})"), soft_wrap=True)
    console.print(plain(f"written to {directory.rescored}"))
    return 0
