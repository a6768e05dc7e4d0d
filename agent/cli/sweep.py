"""`pkb sweep SWEEP.toml`: a matrix of models x conditions x seeds (and searches), run and resumed as one thing.

    pkb sweep ablation.toml --dry-run      # the matrix and its budget ceiling; nothing runs
    pkb sweep ablation.toml                # runs every cell under runs/<name>/; run it again to resume
    pkb report runs/<name>                 # every pair of conditions, paired statistics, the compact table

The file's schema is docs/sweep.md (agent.sweep.spec). Every cell is a run of `pkb run` (a search cell one of
`pkb search`), made by that command's own code. A file naming an unknown tool, model or problem is refused
with one line (exit 2) before anything runs; exit 1 when a cell ended unfinished (provider outages, internal
errors: running the sweep again continues it).
"""

from __future__ import annotations

import argparse

from agent.cli.common import CliError
from agent.cli.options import add_executor_arguments


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sweep", help="run a matrix of models x conditions x seeds from a TOML file (resumable)",
                       description="Run every cell of a sweep file (docs/sweep.md) under runs/<name>/; run it "
                                   "again to resume.")
    p.add_argument("file", metavar="SWEEP.toml", help="the sweep file (docs/sweep.md)")
    p.add_argument("--dry-run", action="store_true", help="print the matrix and its budget ceiling; run nothing")
    p.add_argument("--runs-dir", default="runs", help="where the sweep's folder goes (default ./runs)")
    add_executor_arguments(p)
    p.set_defaults(handler=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    # Deferred: the file's checks read the tool registry and pydantic; the session imports the model stack.
    from agent.sweep.spec import SweepError, load

    try:
        sweep = load(args.file)
    except SweepError as err:
        raise CliError(str(err)) from None
    from agent.cli import sweep_session  # the suite, the model stack and the run session: once the file parses

    return sweep_session.execute(sweep, args)
