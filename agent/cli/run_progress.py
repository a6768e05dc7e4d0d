"""`pkb run`'s progress line: the bar its samples advance (its own, or a sweep's), the tally beside it, and what a
resumed run says is left before it goes on."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from agent import interrupts
from agent.cli.common import console, err_console, plain
from agent.cli.run_print import fast
from agent.rundir import RunDir
from agent.runner import Runner, RunSummary, is_infra


@dataclass
class Within:
    """A run that is one part of something larger (a cell of `pkb sweep`): the progress bar its samples advance,
    the tally beside it, and the command that continues the whole after an interrupt."""

    progress: Progress
    task: TaskID
    tally: Tally
    resume_hint: str


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
            self.fast += fast(record)
            usage = record.get("usage") or {}
            self.tokens += int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
            self.cost += float(usage.get("cost_usd") or 0.0)
            self.cost_known = self.cost_known and usage.get("cost_known", True) is not False
            cost = f"${self.cost:.2f}" if self.cost_known else "$ n/a"
            return f"correct {self.correct}  fast {self.fast}  tokens {self.tokens:,}  {cost}"


PROGRESS_COLUMNS = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[stats]}"), TimeElapsedColumn())


def resume_command(run_dir: RunDir) -> str:
    return f"pkb run --run-id {run_dir.path.name} --resume --runs-dir {run_dir.path.parent}"


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


def run_with_progress(runner: Runner, resuming: bool, within: Within | None = None) -> RunSummary:
    """The run with a progress line (its own, or a sweep's: `within`), after, with `resuming`, what is left.
    Ctrl-C or SIGTERM: says so at once, the runner stops the running samples and raises RunInterrupted (a
    KeyboardInterrupt: agent.cli.run_session.exit_interrupted then says how to resume)."""
    hint = resume_command(runner.run_dir)  # what an interrupt of a run of its own prints
    with ExitStack() as stack:
        stack.enter_context(interrupts.terminate_as_interrupt())
        if resuming:
            say_what_is_left(runner)
        if within is None:
            progress = stack.enter_context(Progress(*PROGRESS_COLUMNS, console=console))
            task = progress.add_task(runner.run_dir.path.name, total=len(runner.plan()), stats="")
            within = Within(progress, task, Tally(), hint)
        bar = within

        def on_sample(record: dict[str, Any], skipped: bool) -> None:
            bar.progress.update(bar.task, advance=1, stats=bar.tally.add(record))

        def on_interrupt(running: int) -> None:
            bar.progress.stop()
            err_console.print(plain(f"pkb: interrupted; stopping {running} running sample(s), finished samples are "
                                    "kept (Ctrl-C again ends at once)"))

        runner.on_sample = on_sample
        runner.on_interrupt = on_interrupt
        return runner.run()
