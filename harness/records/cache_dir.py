"""Where the harness keeps what outlives an evaluation: reference timings and their signing key, extension
builds, roofline traces, the topology profile. One folder, `~/.cache/pkb-agent` unless PKB_CACHE_DIR says
otherwise; sandboxed candidates never see it (harness.launch.sandbox hides it). Standard library only."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "PKB_CACHE_DIR"


def cache_root() -> Path:
    return Path(os.environ.get(ENV_VAR, Path.home() / ".cache" / "pkb-agent"))


def keep_inductor_cache_here() -> None:
    """torch._dynamo makes its cache folder when it is imported: under TMPDIR unless TORCHINDUCTOR_CACHE_DIR
    names one. The harness's own cache folder instead (no sandbox sees it), set for good in this process, and
    before the first pool starts as well as before the first import: a trusted pool inherits this process's
    environment, and its fork server is keyed by that environment (harness.launch.zygote), so a variable that
    appeared during the first evaluation started a second server for the rest."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
