"""`pkb run` itself, once agent.cli.run's checks have passed. Its data flows one way: the options are read once
into the run's request (agent.cli.run_config); the problems (agent.cli.run_problems), this node's devices
(agent.cli.run_devices) and the model (agent.cli.run_model) are checked against it; the run goes with its
progress line (agent.cli.run_progress) and ends with its summary (agent.cli.run_print)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from agent.cli.common import CliError, err_console, leave, plain, terminal_safe
from agent.cli.options import executor_from_args
from agent.cli.run_config import request_from_args
from agent.cli.run_devices import check_device as check_device  # re-exported: the tests know it here
from agent.cli.run_model import check_model
from agent.cli.run_print import print_outcome
from agent.cli.run_problems import select_problems
from agent.cli.run_progress import PROGRESS_COLUMNS as PROGRESS_COLUMNS  # re-exported: `pkb sweep` shows cells so
from agent.cli.run_progress import Tally as Tally
from agent.cli.run_progress import Within as Within
from agent.cli.run_progress import resume_command, run_with_progress
from agent.executors.ray_cluster import RayExecutor
from agent.replay import ReplaySet
from agent.rundir import RunDir, write_json_atomic
from agent.runner import RunConfig, RunError, RunInterrupted, Runner, RunSummary, create_run


def execute(args: argparse.Namespace) -> int:
    """`pkb run` once its options have passed agent.cli.run's checks."""
    summary, run_dir, config = run(args)
    print_outcome(summary, run_dir, config)
    if summary.fatal:
        raise CliError(f"{summary.fatal} (run {run_dir.path.name}: {len(summary.records)} of {summary.total} "
                       "samples finished; --resume continues it)")
    return 0 if summary.complete and not summary.infra_errors else 1


def run(args: argparse.Namespace, within: Within | None = None) -> tuple[RunSummary, RunDir, RunConfig]:
    """Check, create or resume, and run the run that `pkb run`'s options describe; `within`: as part of a sweep,
    whose progress bar it advances (and whose command an interrupt prints)."""
    request = request_from_args(args)
    run_dir = request.run_dir
    selection = select_problems(request)
    config = request.config.model_copy(update={"problems": [p.name for p in selection.problems]})
    scheduler = check_device(config, request.executor, request.evaluations_per_gpu)
    prices = check_model(config, request.spec)
    # Last of the checks (it may start or join a cluster); an unreachable cluster is one line, nothing written.
    executor = executor_from_args(args, device=config.device, world_size=config.world_size, scheduler=scheduler)
    interrupted: KeyboardInterrupt | None = None
    try:
        if selection.skipped:  # said once every check has passed, so that bad input stays one line
            print(f"pkb: skipping problem(s) without world size {config.world_size}: {', '.join(selection.skipped)}",
                  file=sys.stderr)
        if not request.resuming:
            try:
                create_run(run_dir, config, prices, problems=selection.problems, executor=executor.name)
            except RunError as err:
                raise CliError(str(err)) from None
        if selection.replay is not None and selection.replay.matches:
            _account_for_replay(selection.replay, run_dir)
        runner = Runner(run_dir, config, selection.problems, concurrency=request.concurrency, prices=prices,
                        replay=selection.replay, scheduler=scheduler, executor=executor,
                        retry_infra_only=request.retry_infra)
        if isinstance(executor, RayExecutor):
            print(f"pkb: evaluations go to the Ray cluster ({len(executor.nodes)} node(s), room for "
                  f"{executor.capacity(config.world_size, config.device)} at once)", file=sys.stderr)
        try:
            summary = run_with_progress(runner, request.resuming, within)
        # RunInterrupted, or Ctrl-C before the first sample began (a Cancelled of a wait in the main thread
        # arrives as KeyboardInterrupt too: agent.interrupts.terminate_as_interrupt)
        except KeyboardInterrupt as err:
            interrupted = err
    finally:
        executor.close()  # also after Ctrl-C: a Ray instance started for this run is shut down
    if interrupted is not None:
        exit_interrupted(interrupted, within.resume_hint if within is not None else resume_command(run_dir))
    return summary, run_dir, config


def _account_for_replay(replay: ReplaySet, run_dir: RunDir) -> None:
    """Say which files of a PKB solution set were not paired with a problem (and which were paired by name
    although their solution() differs from the reference's), and keep the whole accounting in the run."""
    write_json_atomic(run_dir.replay_matches, replay.matches_record())
    unmatched = replay.unmatched
    odd = [m for m in replay.matches if m.matched and m.signature.startswith("differs")]
    if unmatched:
        print(f"pkb: {len(unmatched)} of {len(replay.matches)} file(s) in {replay.directory} match no problem "
              "and are not scored:", file=sys.stderr)
        for m in unmatched:
            print(f"  {terminal_safe(m.line())}", file=sys.stderr)
    for m in odd:
        print(terminal_safe(f"pkb: note: {m.line()}; {m.signature}"), file=sys.stderr)
    print(f"pkb: how each file was matched: {run_dir.replay_matches}", file=sys.stderr)


def exit_interrupted(err: KeyboardInterrupt, resume: str) -> NoReturn:
    """After Ctrl-C stopped a run: what finished (RunInterrupted knows) and how to continue; exit code 130."""
    if isinstance(err, RunInterrupted):
        done = f"{len(err.summary.records)} of {err.summary.total} samples finished"
        err_console.print(plain(f"pkb: run {err.summary.run_id} stopped: {done}; continue with: {resume}"))
    else:
        err_console.print(plain(f"pkb: interrupted before any sample began; continue with: {resume}"))
    leave()
