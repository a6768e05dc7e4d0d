"""What every CLI command shares: the one-line error, the consoles, and checks of plain arguments.

Light on purpose (the standard library and rich): `pkb --help` imports it. Problem selection, which loads
the suite (torch), is agent.cli.source's.

Printing: text that comes from the user, a problem file or a result (names, summaries, messages, paths)
goes through `plain()` or `escape()`, never into rich markup as it is, so `[tokens, hidden]` prints as
written. Where stdout is not a terminal (a pipe, a file, a test), the console is as wide as the longest
line, so tables keep whole cells and long lines are not folded (COLUMNS still sets a width).
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.text import Text

__all__ = ["CliError", "console", "err_console", "escape", "existing_file", "plain", "world_sizes"]

# Width of a console that does not write to a terminal: wider than any line the commands print.
UNBOUNDED_WIDTH = 100_000


class CliError(Exception):
    """A user mistake: printed as one line, exit code 2."""


class CliConsole(Console):
    """A rich Console that, where its stream is not a terminal and COLUMNS is unset, is as wide as any line
    (rich would take 80 columns and fold or crop to them)."""

    @property
    def size(self) -> ConsoleDimensions:
        measured = super().size
        if self.is_terminal or os.environ.get("COLUMNS") or self.width_given:
            return measured
        return ConsoleDimensions(UNBOUNDED_WIDTH, measured.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        width, height = new_size
        self.width_given = True
        Console.size.fset(self, (width, height))  # type: ignore[attr-defined]

    def __init__(self, *, stderr: bool = False, width: int | None = None) -> None:
        self.width_given = width is not None
        super().__init__(stderr=stderr, width=width)


# Each finds its stream (sys.stdout, sys.stderr) when it prints: output goes where the stream is now.
console = CliConsole()
err_console = CliConsole(stderr=True)


def plain(text: object) -> Text:
    """`text` as rich prints it literally (no markup, no highlighting): for table cells and whole lines."""
    return Text(str(text))


def world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise CliError(f"--world-size takes integers separated by commas, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise CliError(f"--world-size must be positive integers, got {text!r}")
    return sizes


def existing_file(path: str, what: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise CliError(f"{what} {path} does not exist")
    if not p.is_file():
        raise CliError(f"{what} {path} is not a file")
    return p
