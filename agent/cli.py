"""The `pkb` command line. Each area registers its own subcommands; this file only dispatches.

Bad input (unknown problem, missing file, unsupported world size, ...) is one line on stderr and exit
code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agent import cli_eval, cli_problems, cli_profile, cli_report, cli_roofline, cli_run, cli_topology
from agent.cli_common import CliError

COMMAND_MODULES = (cli_problems, cli_eval, cli_run, cli_report, cli_topology, cli_roofline, cli_profile)


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors that are the user's to fix (bad input, configuration): one line, exit 2."""
    from agent.providers import ProviderError
    from agent.usage import PriceTableError

    return (CliError, ProviderError, PriceTableError)


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
