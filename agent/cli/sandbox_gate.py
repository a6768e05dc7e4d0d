"""`--no-sandbox`, and the check that `pkb run` and `pkb search` make before they run any candidate.

Candidate code (a model's, or a replayed solution set's) is hostile: without a working sandbox it runs as
this user, able to read this user's files and signal the harness (tests/exploits/README.md). So these
commands refuse to start without one, in one line that says how to get it, unless told otherwise:
`--no-sandbox` (or PKB_SANDBOX=off, the same choice made in the environment) runs the candidates
unsandboxed, and every result records it (integrity.sandbox: backend "none" and the reason). `pkb eval`
scores one file a person chose, and keeps the fallback with a warning (agent.cli.eval).
"""

from __future__ import annotations

import argparse
import os

from agent.cli.common import CliError

INSTALL = "apt-get install bubblewrap"
OFF_BY = "--no-sandbox"


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-sandbox", action="store_true",
                   help="run candidates without the sandbox (bubblewrap) where none works; recorded in every result")


def require(args: argparse.Namespace, command: str) -> None:
    """Refuse to go on without a sandbox unless --no-sandbox or PKB_SANDBOX=off chose that."""
    # Deferred: harness.launch.sandbox is light, but this module is imported for `pkb --help`.
    from harness.launch.sandbox import OFF_REASON_VAR, SandboxUnavailable, probe

    if getattr(args, "no_sandbox", False):
        os.environ["PKB_SANDBOX"] = "off"  # this process's evaluations, and the pools they start
        os.environ[OFF_REASON_VAR] = OFF_BY
        return
    try:
        info = probe()
    except SandboxUnavailable as err:  # PKB_SANDBOX=require
        raise CliError(f"{command}: {err}") from None
    if info.backend != "none" or os.environ.get("PKB_SANDBOX", "").lower() in ("off", "none", "0"):
        return
    raise CliError(f"{command} runs candidate code only in a sandbox, and none works here ({info.reason}); "
                   f"install bubblewrap ({INSTALL}) with user namespaces enabled, or pass {OFF_BY} to run "
                   "candidates unsandboxed")
