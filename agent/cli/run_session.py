"""`pkb run` itself: checks that need the suite, the devices and the model, then the run with a progress line
and its summary. agent.cli.run parses the options and imports this module once they pass its checks."""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent import interrupts
from agent.cli import emulation
from agent.cli.common import CliError, console, err_console, escape, leave, plain, terminal_safe
from agent.cli.options import executor_from_args
from agent.cli.run_config import check_resume_args, config_from_args, default_run_id
from agent.cli.source import check_shape, resolve_source, select_in
from agent.executors.ray_cluster import RayExecutor
from agent.model_spec import parse_model_spec
from agent.model_table import ModelTableError
from agent.providers import ProviderError, make_chat_model
from agent.replay import ReplayError, ReplaySet, load_replay
from agent.report import accounting, metrics
from agent.report.leases import last_pass_summary
from agent.report.summary import run_summary
from agent.rundir import RunDir, read_json, write_json_atomic
from agent.runner import (
    RunConfig,
    RunError,
    RunInterrupted,
    Runner,
    RunSummary,
    create_run,
    is_infra,
    load_run_config,
)
from agent.scheduler import DeviceScheduler, SchedulerError
from agent.usage import PriceTable, PriceTableError, load_price_table
from harness.common import failures
from harness.common.flags import is_emulated
from harness.emulation import layout
from harness.problems.problem import Problem


def _select_problems(config: RunConfig, selection: Sequence[str] | None, replay_dir: Path | None,
                     ) -> tuple[list[Problem], list[str], ReplaySet | None]:
    """The problems to run, the names of selected ones left out (no such world size), and the replay set."""
    source = resolve_source(config.source, config.precision)
    replay = None
    if replay_dir is not None:
        try:
            replay = load_replay(replay_dir, source)
        except ReplayError as err:
            raise CliError(str(err)) from None
    if config.problems:  # a resumed run: exactly the problems it started with
        chosen = select_in(source, config.problems)
    elif selection:
        chosen = select_in(source, selection)
    elif replay is not None:
        chosen = [p for p in source if p.name in set(replay.problems)]
    else:
        chosen = list(source)
    usable = [p for p in chosen if p.supports(config.world_size)]
    if not usable:
        raise CliError(f"no selected problem supports world size {config.world_size}")
    for p in usable:
        check_shape(p, config.shape)
    return usable, [p.name for p in chosen if p not in usable], replay


def check_device(config: RunConfig, executor: str = "local", evaluations_per_gpu: int = 1) -> DeviceScheduler | None:
    """This node's scheduler; None for a Ray run, whose driver needs no devices (the cluster is checked when the
    executor is built). `evaluations_per_gpu` > 1: untimed evaluations may share the GPUs (the stored run's
    --no-timing decides, so a resumed run is checked as well)."""
    if config.world_size < 1:
        raise CliError(f"--world-size must be at least 1, got {config.world_size}")
    emulation.check(config.device, config.world_size, config.ranks_per_gpu)
    if evaluations_per_gpu > 1:
        if not config.skip_timing:
            raise CliError("--evaluations-per-gpu needs --no-timing: a timing never shares its GPUs")
        if config.device != "cuda":
            raise CliError("--evaluations-per-gpu needs --device cuda (on CPU the rank slots are the concurrency)")
        if executor != "local":
            raise CliError("--evaluations-per-gpu shares this machine's GPUs: leave --executor at local")
    if executor != "local":
        if layout.is_emulated(config.ranks_per_gpu):
            raise CliError("--ranks-per-gpu runs on this machine's GPUs: leave --executor at local")
        return None
    if config.device == "cuda":
        if not torch.cuda.is_available():
            raise CliError("--device cuda: no CUDA device is visible on this machine")
    try:
        return DeviceScheduler(config.device, config.world_size, ranks_per_gpu=config.ranks_per_gpu,
                               shared_evaluations=evaluations_per_gpu)
    except SchedulerError as err:
        raise CliError(str(err)) from None


def check_model(config: RunConfig) -> PriceTable:
    spec = parse_model_spec(config.model)
    try:
        prices = load_price_table(config.prices)
    except PriceTableError as err:
        raise CliError(str(err)) from None
    if spec.is_chat_model:
        try:  # builds the client: an unknown provider, a bad URL, a missing key or reasoning settings the model
            # refuses stop here, before any work
            models = config.model_table()
            make_chat_model(spec, base_url=config.base_url, api_key_env=config.api_key_env,
                            temperature=config.temperature, max_output_tokens=config.max_reply_tokens,
                            reasoning=config.reasoning, models=models)
        except (ProviderError, ModelTableError) as err:
            raise CliError(str(err)) from None
    if config.budget.max_cost_usd is not None and prices.price(spec.text) is None:
        raise CliError(f"--budget-cost: the price table {prices.source} has no price for {spec.text}; "
                       "pass --prices FILE with one")
    return prices


@dataclass
class Within:
    """A run that is one part of something larger (a cell of `pkb sweep`): the progress bar its samples advance,
    the tally beside it, and the command that continues the whole after an interrupt."""

    progress: Progress
    task: TaskID
    tally: Tally
    resume_hint: str


def execute(args: argparse.Namespace) -> int:
    """`pkb run` once its options have passed agent.cli.run's checks."""
    summary, run_dir, config = run(args)
    _print_summary(summary, run_dir, config.ranks_per_gpu)
    if config.device == "cuda":
        _print_device_use(run_dir)
    if summary.fatal:
        raise CliError(f"{summary.fatal} (run {run_dir.path.name}: {len(summary.records)} of {summary.total} "
                       "samples finished; --resume continues it)")
    return 0 if summary.complete and not summary.infra_errors else 1


def run(args: argparse.Namespace, within: Within | None = None) -> tuple[RunSummary, RunDir, RunConfig]:
    """Check, create or resume, and run the run that `pkb run`'s options describe; `within`: as part of a sweep,
    whose progress bar it advances (and whose command an interrupt prints)."""
    resuming = args.resume or args.retry_infra
    if resuming:
        run_dir = RunDir(Path(args.runs_dir) / args.run_id)
        try:
            config = load_run_config(run_dir)
        except RunError as err:
            raise CliError(str(err)) from None
        check_resume_args(args, config, run_dir)
    else:
        config = config_from_args(args)
        run_dir = RunDir(Path(args.runs_dir) / (args.run_id or default_run_id(config.model)))
        if run_dir.run_json.exists():
            raise CliError(f"run {run_dir.path} already exists; add --resume to continue it, or pick another --run-id")
    spec = parse_model_spec(config.model)
    replay_dir = Path(spec.name) if spec.provider == "replay" else None
    problems, skipped, replay = _select_problems(config, args.problems, replay_dir)
    config = config.model_copy(update={"problems": [p.name for p in problems]})
    scheduler = check_device(config, args.executor, args.evaluations_per_gpu)
    prices = check_model(config)
    # Last of the checks (it may start or join a cluster); an unreachable cluster is one line, nothing written.
    executor = executor_from_args(args, device=config.device, world_size=config.world_size, scheduler=scheduler)
    interrupted: KeyboardInterrupt | None = None
    try:
        if skipped:  # said once every check has passed, so that bad input stays one line
            print(f"pkb: skipping problem(s) without world size {config.world_size}: {', '.join(skipped)}",
                  file=sys.stderr)
        if not resuming:
            try:
                create_run(run_dir, config, prices, problems=problems, executor=executor.name)
            except RunError as err:
                raise CliError(str(err)) from None
        if replay is not None and replay.matches:
            _account_for_replay(replay, run_dir)
        runner = Runner(run_dir, config, problems, concurrency=args.concurrency, prices=prices, replay=replay,
                        scheduler=scheduler, executor=executor, retry_infra_only=args.retry_infra)
        if isinstance(executor, RayExecutor):
            print(f"pkb: evaluations go to the Ray cluster ({len(executor.nodes)} node(s), room for "
                  f"{executor.capacity(config.world_size, config.device)} at once)", file=sys.stderr)
        try:
            summary = _run_with_progress(runner, resuming, within)
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


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = self.correct = self.fast = self.tokens = 0
        self.cost = 0.0
        self.cost_known = True

    def add(self, record: dict[str, Any]) -> str:
        with self.lock:
            self.done += 1
            self.correct += bool(record.get("correct"))
            self.fast += _fast(record)
            usage = record.get("usage") or {}
            self.tokens += int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
            self.cost += float(usage.get("cost_usd") or 0.0)
            self.cost_known = self.cost_known and usage.get("cost_known", True) is not False
            cost = f"${self.cost:.2f}" if self.cost_known else "$ n/a"
            return f"correct {self.correct}  fast {self.fast}  tokens {self.tokens:,}  {cost}"


def _fast(record: metrics.SampleRecord) -> bool:
    """Correct, faster than the reference, and allowed to count as fast (no integrity flag against it, not
    emulated): agent.report.metrics' rule, the report's."""
    return metrics.is_fast(record, 1.0)


def not_fast(records: Sequence[dict[str, Any]]) -> str | None:
    """Why the correct samples that are not fast are not: the flags that keep a speedup from counting (by
    name, as the report counts them), no speedup over the reference, or no timing. None when all are fast."""
    correct = [r for r in metrics.finished(records) if r.get("correct")]
    left = [r for r in correct if not _fast(r)]
    if not left:
        return None
    uncounted = metrics.uncounted_speedups(records)
    untimed = sum(1 for r in left if r.get("speedup") is None)
    slow = sum(1 for r in left if r.get("speedup") is not None and metrics.counted_speedup(r) is not None)
    reasons = []
    if uncounted["samples"]:
        flags = ", ".join(f"{flag} ×{n}" for flag, n in uncounted["flags"].items()) or "not fast-eligible"
        reasons.append(f"{uncounted['samples']} flagged ({flags}): their speedup does not count")
    if slow:
        reasons.append(f"{slow} not faster than the reference")
    if untimed:
        reasons.append(f"{untimed} not timed")
    return f"{len(left)} of {len(correct)} correct sample(s) not fast: " + "; ".join(reasons)


PROGRESS_COLUMNS = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[stats]}"), TimeElapsedColumn())


def resume_command(run_dir: RunDir) -> str:
    return f"pkb run --run-id {run_dir.path.name} --resume --runs-dir {run_dir.path.parent}"


def retry_infra_command(run_id: str, runs_dir: Path) -> str:
    return f"pkb run --run-id {run_id} --retry-infra --runs-dir {runs_dir}"


def say_what_is_left(runner: Runner) -> None:
    """`--resume` (`--retry-infra`): how many samples are finished, how many are left and how many ended in
    infra_error (judged again), or that nothing is left."""
    specs = runner.plan()
    finished = [spec for spec in specs if runner.is_finished(spec)]
    done = len(finished)
    infra = sum(1 for s in finished if is_infra(runner.run_dir.sample(s.problem.name, s.condition.name, s.k).record()))
    name = runner.run_dir.path.name
    again = f", {infra} of them in infra_error: judged again" if infra else ""
    if runner.retry_infra_only:
        err_console.print(plain(f"pkb: run {name}: judging again {infra} sample(s) that ended in infra_error "
                                f"({done} of {len(specs)} finished; unfinished ones are left to --resume)"))
    elif done == len(specs) and not infra:
        err_console.print(plain(f"pkb: run {name}: all {len(specs)} samples are finished; nothing left to run"))
    else:
        err_console.print(plain(f"pkb: resuming run {name}: {done} of {len(specs)} samples finished{again}, "
                                f"{len(specs) - done} left"))


def _run_with_progress(runner: Runner, resuming: bool, within: Within | None = None) -> RunSummary:
    """The run with a progress line (its own, or a sweep's: `within`), after, with `resuming`, what is left."""
    if within is not None:
        return _run_in(runner, within, resuming)
    with Progress(*PROGRESS_COLUMNS, console=console) as progress:
        task = progress.add_task(runner.run_dir.path.name, total=len(runner.plan()), stats="")
        return _run_in(runner, Within(progress, task, Tally(), resume_command(runner.run_dir)), resuming)


def _run_in(runner: Runner, within: Within, resuming: bool) -> RunSummary:
    """Ctrl-C or SIGTERM: says so at once, the runner stops the running samples and raises RunInterrupted (a
    KeyboardInterrupt: exit_interrupted then says how to resume)."""
    def on_sample(record: dict[str, Any], skipped: bool) -> None:
        within.progress.update(within.task, advance=1, stats=within.tally.add(record))

    def on_interrupt(running: int) -> None:
        within.progress.stop()
        err_console.print(plain(f"pkb: interrupted; stopping {running} running sample(s), finished samples are "
                                "kept (Ctrl-C again ends at once)"))

    runner.on_sample = on_sample
    runner.on_interrupt = on_interrupt
    with interrupts.terminate_as_interrupt():
        if resuming:
            say_what_is_left(runner)
        return runner.run()


def exit_interrupted(err: KeyboardInterrupt, resume: str) -> NoReturn:
    """After Ctrl-C stopped a run: what finished (RunInterrupted knows) and how to continue; exit code 130."""
    if isinstance(err, RunInterrupted):
        done = f"{len(err.summary.records)} of {err.summary.total} samples finished"
        err_console.print(plain(f"pkb: run {err.summary.run_id} stopped: {done}; continue with: {resume}"))
    else:
        err_console.print(plain(f"pkb: interrupted before any sample began; continue with: {resume}"))
    leave()


def _print_device_use(run_dir: RunDir) -> None:
    """How this pass of the run held its GPUs (agent.report.leases over its part of events.jsonl)."""
    for line in last_pass_summary(run_dir.events):
        console.print(plain(f"GPUs: {line}"))


def _cost_cell(records: list[dict[str, Any]]) -> str:
    """Dollars, or n/a when any sample's model has no price (a sum of the priced ones would mislead)."""
    if any((r.get("usage") or {}).get("cost_known") is False for r in records):
        return "n/a"
    return f"{sum(float((r.get('usage') or {}).get('cost_usd') or 0.0) for r in records):.4f}"


def _print_incomplete(summary: RunSummary, run_dir: RunDir) -> None:
    """Samples still in infra_error after every judgement: the run is INCOMPLETE. Each one by name, with the cause
    of every judgement, and the command that judges them again."""
    records = summary.infra_records
    console.print(f"[red]INCOMPLETE:[/red] {len(records)} sample(s) still in infra_error (the harness's or the "
                  "machine's failure, not the model's): they count in no rate until judged")
    lasting = False
    for r in records:
        attempts = r.get("attempts") or []
        raw = [str(a.get("infra_cause") or "unknown") for a in attempts] or [str(r.get("infra_cause"))]
        lasting = lasting or raw[-1] in failures.LASTING_INFRA_CAUSES
        causes = ", ".join(f"{c} ({failures.INFRA_CAUSE_LABELS[c]})" if c in failures.INFRA_CAUSE_LABELS else c
                           for c in raw)
        message = next((str(a.get("message")) for a in reversed(attempts) if a.get("message")), "")
        where = f"{r.get('problem')}/{r.get('condition')}/{r.get('sample')}"
        line = f"  {where}: {len(attempts) or 1} judgement(s), cause(s): {causes}" + (f"; {message}" if message else "")
        console.print(plain(line))
    console.print(plain(f"retry them with: {retry_infra_command(summary.run_id, run_dir.path.parent)}"))
    if lasting:  # the same machine meets a lasting cause again: where it can go (docs/reading-numbers.md)
        console.print(plain("  a lasting cause (environment, sandbox, emulation) comes back on this machine: retry "
                            "where it is gone (a GPU machine with --device cuda, the missing package installed, "
                            "bubblewrap installed, one rank per GPU)"))


def _print_summary(summary: RunSummary, run_dir: RunDir, ranks_per_gpu: int = 1) -> None:
    emulated = layout.is_emulated(ranks_per_gpu)
    table = Table(title=plain(f"run {summary.run_id}: {len(summary.records)} of {summary.total} samples finished"))
    table.add_column("condition", no_wrap=True)  # a row's name stays whole; the numbers take less room
    for col in ("samples", "correct", "fast (>1x)", "no code", "infra error", "tokens", "cost $"):
        table.add_column(col)
    by_condition: dict[str, list[dict[str, Any]]] = {}
    for r in summary.records:
        by_condition.setdefault(r["condition"], []).append(r)
    config = dict((read_json(run_dir.run_json) or {}).get("config") or {})
    for condition, records in by_condition.items():
        tokens = sum(int(r["usage"]["input_tokens"]) + int(r["usage"]["output_tokens"]) for r in records)
        unmeasured = accounting.speed_not_measured(records, {**config, "ranks_per_gpu": ranks_per_gpu})
        table.add_row(plain(condition), str(len(records)), str(sum(r["correct"] for r in records)),
                      "—" if unmeasured else str(sum(_fast(r) for r in records)),
                      str(sum(r["verdict"] == "no_code" for r in records)),
                      str(sum(r["verdict"] == "infra_error" for r in records)), f"{tokens:,}",
                      _cost_cell(records))
    console.print(table)
    for line in run_summary(run_dir.path):  # what the report will say first: problems not judged, speed not measured
        console.print(plain(line))
    for condition, records in by_condition.items():
        if (why := not_fast(records)) is not None:
            console.print(plain(f"{condition}: {why}"))
    if emulated or any(is_emulated(r) for r in summary.records):
        console.print(f"[yellow]{escape(emulation.notice(ranks_per_gpu))}[/yellow]: no sample counts as fast")
    if summary.infra_errors:
        _print_incomplete(summary, run_dir)
    for line in summary.interrupted:
        console.print(f"[yellow]unfinished (provider error, not the model's):[/yellow] {escape(line)}")
    for line in summary.errors:
        console.print(f"[red]unfinished (internal error, see events.jsonl):[/red] {escape(line)}")
    if not summary.complete:
        console.print(plain(f"continue with: pkb run --run-id {summary.run_id} --resume --runs-dir "
                            f"{run_dir.path.parent}"))
    console.print(plain(f"results: {run_dir.path}   report: pkb report {run_dir.path}"))
