"""The `pkb` command line. Each area registers its own subcommands; this file only dispatches.

Bad input (unknown problem, missing file, unsupported world size, ...) is one line on stderr and exit
code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from agent.cli_common import CliError

COMMAND_NAMES = ("problems", "eval", "run", "search", "report", "topology", "roofline", "profile")
OUR_PACKAGES = ("agent", "harness", "tools", "problems", "prompts")


class MissingCommand:
    """A command whose third-party dependencies are not installed here (a GPU node often has torch and
    the harness's needs but not the agent's model stack). The other commands keep working; this one
    answers with one line naming what is missing."""

    def __init__(self, name: str, error: ModuleNotFoundError) -> None:
        self.name, self.error = name, error

    def register(self, sub: Any) -> None:
        # Listed in --help; main() answers for it before parsing its options (which are unknown here).
        sub.add_parser(self.name, help=f"(unavailable here: needs {self.error.name})")

    def message(self) -> str:
        return (f"pkb {self.name} needs the Python package {self.error.name!r}, which is not installed "
                "here: pip install -e . (problems, eval, topology, roofline and profile work without it)")


def _is_ours(error: ModuleNotFoundError) -> bool:
    return (error.name or "").split(".")[0] in OUR_PACKAGES


def load_command(name: str) -> ModuleType | MissingCommand:
    try:
        return importlib.import_module(f"agent.cli_{name}")
    except ModuleNotFoundError as err:
        if _is_ours(err):  # a broken import of our own code is a bug, not a missing dependency
            raise
        return MissingCommand(name, err)


COMMAND_MODULES = tuple(load_command(name) for name in COMMAND_NAMES)


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors that are the user's to fix (bad input, configuration): one line, exit 2."""
    errors: list[type[BaseException]] = [CliError]
    for module, name in (("agent.providers", "ProviderError"), ("agent.usage", "PriceTableError")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except ModuleNotFoundError as err:
            if _is_ours(err):
                raise
    return tuple(errors)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pkb",
        description="pkb-agent: language models writing multi-GPU kernels, scored by a strict harness.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    missing = {m.name: m for m in COMMAND_MODULES if isinstance(m, MissingCommand)}
    if words and words[0] in missing:
        print(f"pkb: error: {missing[words[0]].message()}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except user_errors() as err:
        print(f"pkb: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pkb: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
