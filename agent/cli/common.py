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
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from rich import box
from rich.console import Console
from rich.markup import escape as escape_markup
from rich.table import Table
from rich.text import Text

from harness.common.atomic_write import check_out
from harness.common.hostile_files import HostileFile, check_given
from harness.common.terminal import terminal_safe

__all__ = ["CliError", "HelpFormatter", "Parser", "check_out_path", "console", "err_console", "escape",
           "existing_file", "leave", "plain", "terminal_safe", "world_sizes"]


class CliError(Exception):
    """A user mistake: printed as one line, exit code 2 (without what a terminal would obey: a message may name
    a candidate's file)."""

    def __str__(self) -> str:
        return terminal_safe(super().__str__())


class CliConsole(Console):
    """A rich Console that, where its stream is not a terminal (a pipe, a file, a test), writes lines as they
    are: tables are laid out for 80 columns (or COLUMNS) and fold long cells, and every other line is
    written whole, never folded at 80 nor padded (a command to copy, a path, a source file)."""

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


class Parser(argparse.ArgumentParser):
    """`pkb`'s parsers (every subcommand's inherits this class): help lines with their defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


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
