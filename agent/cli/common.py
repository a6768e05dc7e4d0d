"""What every CLI command shares: the one-line error, the consoles, and checks of plain arguments.

Light on purpose (the standard library and rich): `pkb --help` imports it. Problem selection, which loads
the suite (torch), is agent.cli.source's.

Printing: text that comes from the user, a problem file or a result (names, summaries, messages, paths)
goes through `plain()` or `escape()`, never into rich markup as it is, so `[tokens, hidden]` prints as
written; both also remove what a terminal would obey (a candidate's message chooses its own bytes:
harness.common.terminal). Where stdout is not a terminal (a pipe, a file, a test), tables are 80 columns
wide (COLUMNS sets another width) and fold long cells, and other lines are written whole: never padded,
never folded.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from rich import box
from rich.console import Console
from rich.markup import escape as escape_markup
from rich.table import Table
from rich.text import Text

from harness.common.atomic_write import check_out
from harness.common.hostile_files import HostileFile, check_given, read_given
from harness.common.terminal import terminal_safe

__all__ = ["RANGES", "CliError", "HelpFormatter", "Parser", "Range", "candidate_file", "check_out_path", "console",
           "err_console", "escape", "existing_file", "leave", "plain", "terminal_safe", "world_sizes"]


class CliError(Exception):
    """A user mistake: printed as one line, exit code 2 (without what a terminal would obey: a message may name
    a candidate's file)."""

    def __str__(self) -> str:
        return terminal_safe(super().__str__())


class CliConsole(Console):
    """A rich Console that, where its stream is not a terminal (a pipe, a file, a test), writes lines as they
    are: tables are laid out for 80 columns (or COLUMNS) and fold long cells, and every other line is
    written whole, never folded at 80 nor padded (a command to copy, a path, a source file)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if kwargs.get("width") is None:
            # rich fixes COLUMNS as it was when the console was made; these are made at import, so, as they find
            # their stream, they read the width when they print (rich's size: the terminal's, else COLUMNS, else 80).
            self._width = None

    def print(self, *objects: Any, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        piped = not self.is_terminal
        for table in objects:
            if isinstance(table, Table):
                _fold(table, piped)
        if soft_wrap is None and piped:
            soft_wrap = True
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)


# Tables in a pipe: a rule under the header, no other lines (rich's SIMPLE, in ASCII): the columns keep room.
PIPE_BOX = box.Box("    \n    \n -- \n    \n    \n -- \n    \n    \n", ascii=True)


def _fold(table: Table, piped: bool) -> None:
    """A long cell folds onto more lines instead of being cut short (a header between its words); in a pipe
    the only border is an ASCII rule under the header, so that a line is as many bytes as characters (awk,
    cut and friends count bytes) and the columns keep the room."""
    for column in table.columns:
        if column.overflow == "ellipsis":
            column.overflow = "fold"
        if isinstance(column.header, str) and column.header.split():  # a header folds between words only
            column.min_width = max(column.min_width or 0, *(len(word) for word in column.header.split()))
    if piped and table.box is not None:
        table.box = PIPE_BOX
        table.show_edge = False


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help line ends with its default, where it has one its help does not state already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        shown = (action.option_strings and default is not None and default is not False
                 and default is not argparse.SUPPRESS and default != [])
        if shown and "default" not in text:
            text += " (default: %(default)s)"
        return text


@dataclass(frozen=True)
class Range:
    """The values a numeric option takes: at least `minimum` (above it, where `above`), at most `maximum`; `why`
    says why, where the bound is not plain."""

    minimum: float
    above: bool = False
    maximum: float | None = None
    why: str = ""

    def check(self, value: float) -> str | None:
        """None where `value` is in range, else what to say ("must be at least 2, got 1 (why)")."""
        low_ok = value > self.minimum or (value == self.minimum and not self.above)
        if low_ok and (self.maximum is None or value <= self.maximum):
            return None
        bound = f"above {self.minimum:g}" if self.above else f"at least {self.minimum:g}"
        if self.maximum is not None:
            bound += f" and at most {self.maximum:g}"
        return f"must be {bound}, got {value:g}" + (f" ({self.why})" if self.why else "")


COUNT = Range(1)
SOME = Range(0)
POSITIVE = Range(0, above=True)
BUDGET = Range(0, why="0 is no limit")
# The range of every numeric option, by name, whatever command has it: checked as the option is parsed, so a bad
# value is said at once, before a missing argument and before anything heavy is imported. An option in a
# command's own row (COMMAND_RANGES) takes that range there instead. The deeper checks stay where they are.
RANGES: dict[str, Range] = {
    "--trials": Range(2, why="a stale answer only shows on the second call"), "--world-size": COUNT,
    "--ranks-per-gpu": COUNT, "--samples": COUNT, "--concurrency": COUNT, "--evaluations-per-gpu": COUNT,
    "--model-retries": COUNT, "--k": COUNT, "--iters": COUNT, "--warmup": SOME, "--ncu-rank": SOME,
    "--context-window": COUNT, "--context-share": Range(0, above=True, maximum=1),
    "--thinking-budget": Range(1024, why="Anthropic's least budget_tokens"), "--max-reply-tokens": COUNT,
    "--check-timeout": POSITIVE, "--shell-timeout": POSITIVE, "--ncu-budget": POSITIVE, "--phase-timeout": POSITIVE,
    "--timing-iters": Range(2), "--window": COUNT, "--islands": COUNT, "--rescore-seeds": COUNT,
    "--rescore-candidates": COUNT, "--proposer-turns": COUNT, "--top-k": COUNT, "--explore": Range(0, maximum=1),
    "--inspirations": Range(0, maximum=3), "--migration-interval": COUNT, "--patience": COUNT,
    "--target-fraction": POSITIVE, "--target-speedup": POSITIVE, "--min-gain": SOME,
    "--budget-turns": BUDGET, "--budget-tokens": BUDGET, "--budget-input-tokens": BUDGET,
    "--budget-output-tokens": BUDGET, "--budget-cost": BUDGET, "--budget-wall": BUDGET, "--budget-gpu": BUDGET,
    "--budget-candidates": BUDGET, "--budget-gpu-hours": BUDGET, "--budget-hours": BUDGET,
    "--problem-candidates": BUDGET, "--problem-gpu-hours": BUDGET, "--problem-cost": BUDGET,
    "--problem-tokens": BUDGET, "--problem-hours": BUDGET,
}
COMMAND_RANGES: dict[str, dict[str, Range]] = {
    "pkb problems validate": {"--trials": COUNT},  # the reference against its oracle: one draw is a check
}


class _Ranged:
    """An option's type (int or float) that also refuses a value out of the option's Range."""

    def __init__(self, number: Callable[[str], Any], limits: Range) -> None:
        self.number, self.limits = number, limits
        self.__name__ = getattr(number, "__name__", "number")  # argparse names the type in "invalid int value"

    def __call__(self, text: str) -> Any:
        value = self.number(text)  # a ValueError is argparse's "invalid int value: 'x'"
        problem = self.limits.check(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value


def _chosen(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command's parser that the parsed arguments chose (`pkb run`, `pkb problems show`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(namespace, action.dest, None)
            if isinstance(name, str) and name in action.choices:
                return _chosen(action.choices[name], namespace)
    return parser


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _unrecognized(extras: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """What to say of arguments the command does not take, with the nearest option it does take."""
    options = [e.partition("=")[0] for e in extras if e.startswith("-")]
    if not options:
        return f"unrecognized arguments: {' '.join(extras)}"
    known = [o for action in parser._actions for o in action.option_strings]
    return (f"unrecognized option {options[0]}{_suggest(options[0], known)} "
            f"({parser.prog} --help lists its options)")


RANGE_MESSAGE = re.compile(r"^(--[\w-]+): (must be )")
INVALID_CHOICE = re.compile(r"invalid choice: '(?P<word>[^']*)' \(choose from (?P<choices>.*)\)$")


class Parser(argparse.ArgumentParser):
    """`pkb`'s parsers (every subcommand's inherits this class): help lines with their defaults; an error is one
    line (no usage block) that names the option and, for a typo, the nearest option or choice; numeric options
    are checked against RANGES as they are parsed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        ranges = {**RANGES, **COMMAND_RANGES.get(self.prog, {})}
        for action in self._actions:
            option = next((o for o in action.option_strings if o in ranges), None)
            if option is not None and action.type in (int, float):
                action.type = _Ranged(action.type, ranges[option])
        return super().parse_known_args(args, namespace)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            chosen = _chosen(self, parsed)
            chosen.error(_unrecognized(extras, chosen))
        return parsed

    def error(self, message: str) -> NoReturn:
        message = RANGE_MESSAGE.sub(r"\1 \2", message.removeprefix("argument "))  # "--k must be at least 1, ..."
        invalid = INVALID_CHOICE.search(message)
        if invalid:
            message += _suggest(invalid["word"], re.findall(r"'([^']*)'", invalid["choices"]))
        self.exit(2, f"{self.prog.split()[0]}: error: {message}\n")  # "pkb: error: ...", as every usage error


# Each finds its stream (sys.stdout, sys.stderr) when it prints: output goes where the stream is now.
console = CliConsole()
err_console = CliConsole(stderr=True)


def leave(code: int = 130) -> NoReturn:
    """The end of a command that Ctrl-C stopped, once its work is stopped and the line saying how to resume is
    printed: at once (os._exit). Everything on disk is consistent; a worker thread still inside a model call
    would keep a normal exit waiting, and the interpreter's teardown of torch and the model stack took seconds
    on a loaded machine (measured: 5-7 s at a load of 11 on 2 cores)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def plain(text: object) -> Text:
    """`text` as rich prints it literally (no markup, no highlighting): for table cells and whole lines. What a
    terminal would obey (escape sequences, controls, bidi overrides: harness.common.terminal) is removed."""
    return Text(terminal_safe(str(text)))


def escape(text: str) -> str:
    """`text` for a place inside rich markup: its own markup escaped, what a terminal would obey removed."""
    return escape_markup(terminal_safe(text))


def world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise CliError(f"--world-size takes integers separated by commas, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise CliError(f"--world-size must be positive integers, got {text!r}")
    return sizes


def candidate_file(path: str) -> str:
    """`--solution`'s type: a file that exists and holds something (an empty file defines no `solution`), said
    while the arguments are parsed, before anything heavy is imported."""
    p = Path(path)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{path} does not exist")
    try:  # opened as a candidate's artifact: a FIFO or a device would block or never end
        head = read_given(p)
    except HostileFile as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    except OSError as err:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {err.strerror or err}") from None
    if not head.strip():
        raise argparse.ArgumentTypeError(f"{path} is empty: a candidate is a Python file that defines "
                                         "solution(*inputs)")
    return path


def existing_file(path: str, what: str) -> Path:
    """A file the user named, opened as a candidate's artifact is (harness.common.hostile_files.check_given):
    a regular file (never a FIFO, device or folder), opened without blocking, within GIVEN_LIMIT bytes."""
    p = Path(path)
    if not p.exists():
        raise CliError(f"{what} {path} does not exist")
    try:
        check_given(p)
    except HostileFile as err:
        raise CliError(f"{what} {err}") from None
    return p


def check_out_path(path: str) -> None:
    """A bad --out said before the command's work (harness.common.atomic_write's rule)."""
    try:
        check_out(path)
    except OSError as err:
        raise CliError(f"cannot write {path}: {err.strerror or err}") from None
