"""harness.common.terminal: candidate and model text loses what a terminal would obey (issue 45, class 4)."""

from __future__ import annotations

import io

import pytest

from harness.common.terminal import terminal_safe


@pytest.mark.parametrize("text, shown", [
    ("\x1b[2K\x1b[1A\rverdict: \x1b[32mcorrect\x1b[0m", "verdict: correct"),
    ("a\x1b]0;window title\x07b", "ab"),
    ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),
    ("a\x1bPq#0;2;0;0;0\x1b\\b", "ab"),
    ("a\x9b1Ab\x9d0;t\x9cc", "abc"),
    ("a\x1b7\x1b(Bb\x1bc", "ab"),
    ("left \u202eright\u202c \u2066iso\u2069 \u200f", "left right iso "),
    ("bell\x07 back\x08space del\x7f nul\x00", "bell backspace del nul"),
    ("keeps\ttabs\nand lines", "keeps\ttabs\nand lines"),
    ("unicode é 漢字 [bold]markup[/bold]", "unicode é 漢字 [bold]markup[/bold]"),
])
def test_what_a_terminal_obeys_is_removed(text: str, shown: str):
    assert terminal_safe(text) == shown


def test_cli_printing_removes_it_and_escapes_markup():
    from agent.cli.common import CliConsole, CliError, escape, plain

    console = CliConsole(record=True, force_terminal=True, width=120, file=io.StringIO())
    console.print(plain("\x1b[1Averdict: [green]correct[/green]\u202e"))
    console.print(f"message: {escape(chr(27) + '[2K[red]x[/red]')}")
    out = console.export_text(styles=False)
    assert out == "verdict: [green]correct[/green]\nmessage: [red]x[/red]\n", repr(out)
    assert str(CliError("bad \x1b[31mname\x1b[0m.py")) == "bad name.py"
