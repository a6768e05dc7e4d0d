"""The `pkb` command line: one module per command, agent/cli/<command>.py; this file only dispatches.

Every command module imports only light things at its top (argparse, rich, the CLI's own helpers): the
harness (torch), the model stack (langchain, langgraph, the provider SDKs) and matplotlib are imported by
the command's handler when it runs. So `pkb --help`, `pkb run --help` and every mistake the arguments
alone reveal answer at once, and the commands that need only the harness run where the model stack is
not installed (tests/agent/cli/test_cli_startup.py checks both).

Adding a command `pkb NAME`:
  1. write agent/cli/NAME.py with `register(sub)`, which adds its parser to `sub` (sub.add_parser(NAME,
     help=...)) and sets `handler` (p.set_defaults(handler=...)): a function of the parsed arguments that
     returns the exit code; heavy imports go inside the handler, with a comment saying so;
  2. add NAME to COMMANDS below, in the order `pkb --help` lists the commands.

Bad input (unknown problem, missing file, unsupported world size, ...) is one line on stderr and exit
code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from agent.cli.common import CliError, Parser

# The registration point: agent/cli/<name>.py for each name, listed by `pkb --help` in this order.
COMMANDS = ("problems", "eval", "run", "sweep", "search", "report", "rescore", "export", "topology", "roofline",
            "profile")
OUR_PACKAGES = ("agent", "harness", "tools", "problems", "prompts")
# Errors of the layers below that are the user's to fix; looked up only where their module was imported
# (an error of a module never imported cannot have been raised).
USER_ERRORS = (("agent.providers", "ProviderError"), ("agent.usage", "PriceTableError"))
# What works where the model stack is not installed (a GPU node often has torch and the harness's needs only).
HARNESS_ONLY = "problems, eval, topology, roofline and profile"



def command_module(name: str) -> ModuleType:
    return importlib.import_module(f"agent.cli.{name}")


def all_command_modules() -> tuple[ModuleType, ...]:
    return tuple(command_module(command) for command in COMMANDS)


def __getattr__(name: str) -> tuple[ModuleType, ...]:
    """`COMMAND_MODULES`: every command's module, imported when first asked for (`pkb run ...` imports run's
    alone: the others' imports would only slow its answer)."""
    if name == "COMMAND_MODULES":
        return all_command_modules()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _is_ours(error: ModuleNotFoundError) -> bool:
    return (error.name or "").split(".")[0] in OUR_PACKAGES


def missing_package(command: str, error: ModuleNotFoundError) -> str:
    return (f"pkb {command} needs the Python package {error.name!r}, which is not installed here: pip install -e . "
            f"({HARNESS_ONLY} work without it)")


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors that are the user's to fix (bad input, configuration): one line, exit 2."""
    errors: list[type[BaseException]] = [CliError]
    for module, name in USER_ERRORS:
        if module in sys.modules:
            errors.append(getattr(sys.modules[module], name))
    return tuple(errors)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """`pkb`'s parser: with `argv` that names a command first, that command's alone (the common case: its
    module's imports are all a mistake in its arguments waits for); with `argv` that names none (nothing, or a
    mistyped command), the commands' names alone, which is all its error says; else (`--help`, no `argv`)
    every command's."""
    parser = Parser(
        prog="pkb",
        description="pkb-agent: language models writing multi-GPU kernels, scored by a strict harness.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    named = argv[0] if argv else None
    if argv is not None and named not in COMMANDS and not {"-h", "--help"} & set(argv):
        for name in COMMANDS:  # no command, or a mistyped one: the names are all its error needs
            sub.add_parser(name)
        return parser
    modules = (command_module(named),) if named in COMMANDS else all_command_modules()
    for module in modules:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as done:  # --help (0), or a mistake the parser said in one line (2): an exit code like any
        return done.code if isinstance(done.code, int) else 2
    try:
        return int(args.handler(args) or 0)
    except ModuleNotFoundError as err:
        if _is_ours(err):  # a broken import of our own code is a bug, not a missing dependency
            raise
        print(f"pkb: error: {missing_package(args.command, err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pkb: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if isinstance(err, user_errors()):
            print(f"pkb: error: {err}", file=sys.stderr)
            return 2
        raise
