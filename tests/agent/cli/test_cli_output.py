"""What the CLI writes where a newcomer reads it: a pipe (no padding, tables that fit), `--help` (every option
with a help line and its default), and `pkb eval` (which sandbox the candidate ran in)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agent.cli import build_parser, main
from harness.common.paths import REPO_ROOT
from tests.conftest import CANDIDATES

REPO = REPO_ROOT


def piped(*argv: str) -> bytes:
    """`pkb ARGV | cat`: stdout is a pipe, and no COLUMNS says how wide a terminal would be."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "agent.cli", *argv], capture_output=True, timeout=300, cwd=REPO,
                          env=env)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return proc.stdout


def test_problems_show_in_a_pipe_is_the_file_not_padding() -> None:
    out = piped("problems", "show", "all_reduce")
    assert len(out) < 20_000  # was 5.1 MB: every source line padded to 100,000 columns
    text = out.decode()
    source = (REPO / "problems" / "collective" / "all_reduce.py").read_text()
    assert source.strip() in text  # the reference source, as written
    assert max(len(line) - len(line.rstrip()) for line in text.splitlines()) <= 80  # no line padded past 80


def test_problems_list_in_a_pipe_fits_and_cuts_nothing_short() -> None:
    out = piped("problems", "list")
    widths = [len(line) for line in out.split(b"\n")]  # bytes, as awk counts them
    assert max(widths) <= 120, max(widths)  # was 255 characters wide
    text = out.decode()
    assert "…" not in text  # a long cell folds, it is never cut short
    words = set(text.replace("|", " ").split())
    for piece in ("Megatron-LM:", "_gather_along_first_dim", "all_reduce", "2,4,8"):
        assert piece in words or any(piece in w for w in words), piece


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...]
             ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*path, name))
        elif not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS:
            yield path, parser, action


def test_the_consoles_read_the_width_when_they_print_not_when_they_are_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich reads COLUMNS once, when a console is made; the CLI's consoles are made at import, under whatever COLUMNS
    the importing process had (pytest-xdist's workers: 80). A table printed later follows COLUMNS as it is then."""
    from io import StringIO

    from rich.table import Table

    from agent.cli.common import CliConsole

    monkeypatch.setenv("COLUMNS", "80")
    out = StringIO()
    console = CliConsole(file=out)
    monkeypatch.setenv("COLUMNS", "200")
    table = Table("problem", "interval")
    table.add_row("all_reduce", "0.348-0.361x (75%, k=3) " * 4)
    console.print(table)
    assert max(len(line) for line in out.getvalue().splitlines()) > 80  # one row, not folded at 80
    assert len(out.getvalue().splitlines()) == 3  # header, rule, the row


def test_every_option_has_a_help_line_with_its_default() -> None:
    missing = []
    for path, parser, action in _options(build_parser(), ("pkb",)):
        text = parser._get_formatter()._expand_help(action) if action.help else ""
        name = f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
        if not text:
            missing.append(f"{name}: no help")
        elif action.option_strings and action.nargs != 0 and "default" not in text and "required" not in text:
            missing.append(f"{name}: no default in {text!r}")
    assert missing == []


def test_eval_help_says_what_world_size_trials_seed_and_device_are() -> None:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = commands.choices["eval"].format_help()
    for option, default in (("--world-size", "2"), ("--trials", "5"), ("--seed", "0"), ("--device", "cpu")):
        block = text[text.index(f"\n  {option} "):]  # its line under "options:", not the usage line
        entry = " ".join(block.split("\n  --")[1].split())
        assert entry.endswith(f"(default: {default})"), entry


@pytest.mark.parametrize("setting,expected", [
    ("off", "sandbox: none: the ranks ran as your user (turned off by PKB_SANDBOX=off)"),
    ("auto", "sandbox: "),
])
def test_eval_states_the_sandbox_it_used(setting: str, expected: str, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from harness.launch.sandbox import probe

    monkeypatch.setenv("PKB_SANDBOX", setting)
    assert main(["eval", "--problem", "all_reduce", "--solution", str(CANDIDATES / "correct_all_gather_sum.py"),
                 "--no-timing", "--trials", "2"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sandbox: ")]
    assert len(lines) == 1 and lines[0].startswith(expected)
    if setting == "auto":  # what probe() found here, said as such
        backend = probe().backend
        assert ("bubblewrap" in lines[0]) == (backend == "bwrap") and ("none" in lines[0]) == (backend == "none")
