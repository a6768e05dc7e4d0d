from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

CANDIDATES = Path(__file__).parent / "candidates"


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Reference timings and builds go to a throwaway cache, never the user's.
    os.environ["PKB_CACHE_DIR"] = str(tmp_path_factory.mktemp("pkb-cache"))


@pytest.fixture(autouse=True, scope="session")
def _no_sandbox_where_none_works() -> None:
    # `pkb run` and `pkb search` refuse to run candidates without a working sandbox unless told so. On a
    # machine without bubblewrap the suite tells them so, as `--no-sandbox` would (the fallback is what such
    # a machine runs anyway, and every result records it); where bubblewrap works nothing changes.
    from harness.sandbox import probe  # deferred: the session fixture, not every import of conftest

    if "PKB_SANDBOX" not in os.environ and probe().backend == "none":
        os.environ["PKB_SANDBOX"] = "off"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `@pytest.mark.gpu` needs two GPUs; `@pytest.mark.gpu(count=1)` one (ranks sharing a device).
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        needed = int(marker.kwargs.get("count", 2))
        if visible < needed:
            item.add_marker(pytest.mark.skip(reason=f"needs at least {needed} CUDA GPU{'s' if needed > 1 else ''}"))


def live_children() -> list[int]:
    """PIDs of this process's children that are still running (zombies excluded)."""
    me = os.getpid()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == me and state != "Z":
            pids.append(int(entry.name))
    return pids


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def processes_mentioning(text: str, wait_s: float = 5.0) -> list[int]:
    """PIDs other than this one whose command line mentions `text`, once killed processes had time to die."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and int(entry.name) != os.getpid() and pid_alive(int(entry.name)) \
                        and text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)
