"""`pkb rescore RUN [--concurrency N]`: every distinct candidate of a run, scored by the final scorer.

The report (`pkb report RUN`) then draws pass and best speedup by turn, tokens and dollars as the final scorer
sees them, beside the tools' own evidence (agent.rescore, agent.report.trajectories).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.cli.common import CliError, console, plain


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rescore", help="score every distinct candidate of a run with the final scorer "
                                       "(for the report's trajectories)")
    p.add_argument("run", metavar="RUN", help="a run directory (runs/<run_id>)")
    p.add_argument("--concurrency", type=int, default=1, help="samples rescored at once (default 1)")
    p.set_defaults(handler=cmd_rescore)


def cmd_rescore(args: argparse.Namespace) -> int:
    if args.concurrency < 1:
        raise CliError(f"--concurrency must be at least 1, got {args.concurrency}")
    # Deferred: the runner and the harness import torch and the model stack.
    from agent.cli.source import resolve_source
    from agent.rescore import rescore_run
    from agent.rundir import RunDir
    from agent.runner import RunError, load_run_config

    run = RunDir(Path(args.run))
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
