"""`pkb export RUN [RUN ...] --format jsonl [--out FILE]`: one line per sample with its run's manifest keys,
verdicts, metrics and usage (agent.report.export; schema in docs/run-layout.md), for notebooks and other
evaluation frameworks: `pandas.read_json(FILE, lines=True)`. A RUN may be a sweep's folder (every run cell)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.cli.common import CliError, check_out_path, console, plain


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="samples of runs as JSON lines (one per sample, manifest keys included)")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (runs/<run_id>) or sweep folders")
    p.add_argument("--format", choices=("jsonl",), default="jsonl", help="jsonl: one JSON object per line (default)")
    p.add_argument("--out", default=None, help="write here instead of stdout (default: stdout)")
    p.set_defaults(handler=cmd_export)


def records(paths: list[str]) -> Iterator[dict[str, Any]]:
    # Deferred (all three): the run reader (pydantic) and the sweep's layout are the command's alone.
    from agent.report.export import sample_records
    from agent.report.run_reader import RunFormatError, read_run
    from agent.sweep.report import SweepReportError, cell_runs, is_sweep

    for path in paths:
        folder = Path(path)
        try:
            if is_sweep(folder):
                for runs in cell_runs(folder).values():
                    for run in runs:
                        yield from sample_records(run, sweep=folder.name, cell=run.run_id)
            else:
                yield from sample_records(read_run(folder, transcripts=False))
        except (RunFormatError, SweepReportError) as err:
            raise CliError(str(err)) from None


def cmd_export(args: argparse.Namespace) -> int:
    # Deferred: what the command needs, loaded when it runs (`pkb --help` stays light).
    from agent.report.export import to_jsonl
    from agent.rundir import write_out_text

    if args.out is not None:
        check_out_path(args.out)  # a folder, a device, a FIFO nobody reads: said before any run is read
    lines = list(to_jsonl(records(args.runs)))  # every run read (and every error said) before anything is written
    if args.out is None:
        try:
            sys.stdout.writelines(lines)
            sys.stdout.flush()
        except BrokenPipeError:  # `pkb export RUN | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    try:
        write_out_text(Path(args.out), "".join(lines))
    except OSError as err:
        raise CliError(f"cannot write {args.out}: {err.strerror or err}") from None
    console.print(plain(f"wrote {args.out} ({len(lines)} samples)"), style=None)
    return 0
