"""Where the harness keeps what outlives an evaluation: reference timings and their signing key, extension
builds, roofline traces, the topology profile. One folder, `~/.cache/pkb-agent` unless PKB_CACHE_DIR says
otherwise; sandboxed candidates never see it (harness.launch.sandbox hides it). Standard library only."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "PKB_CACHE_DIR"


def cache_root() -> Path:
    return Path(os.environ.get(ENV_VAR, Path.home() / ".cache" / "pkb-agent"))
