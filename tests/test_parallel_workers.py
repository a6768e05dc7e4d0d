"""The suite under pytest-xdist (tests/conftest.py): every worker uses the one session cache its controller made,
which is gone when the run ends, and a test marked `serial` runs while no other test does. A small run of its own:
a nested pytest with two workers over a generated test file, with the project's conftest loaded as a plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.common.paths import REPO_ROOT

# Ordinary tests each hold a file of their own while they run, and linger long enough that the other worker's
# serial test, without the lock, would overlap one of them; the serial test records what it saw running.
PROBE = '''
import os
import time
from pathlib import Path

import pytest

OUT = Path(os.environ["PKB_TEST_PROBE_OUT"])


def _record(name: str) -> None:
    (OUT / f"cache-{os.environ['PYTEST_XDIST_WORKER']}-{name}").write_text(os.environ["PKB_CACHE_DIR"])


@pytest.mark.parametrize("i", range(12))
def test_ordinary(i: int) -> None:
    _record(f"ordinary{i}")
    running = OUT / f"running-{i}"
    running.write_text("")
    assert not (OUT / "serial-running").exists()
    time.sleep(0.3)
    assert not (OUT / "serial-running").exists()
    running.unlink()


@pytest.mark.serial
@pytest.mark.parametrize("j", range(2))
def test_serial(j: int) -> None:
    _record(f"serial{j}")
    (OUT / "serial-running").write_text("")
    seen = set()
    for _ in range(10):
        seen |= {p.name for p in OUT.glob("running-*")}
        time.sleep(0.1)
    (OUT / "serial-running").unlink()
    assert not seen, seen
'''


def test_two_workers_share_one_cache_and_a_serial_test_runs_alone(tmp_path: Path) -> None:
    pytest.importorskip("xdist", reason="needs pytest-xdist (the dev extra)")
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(PROBE))
    out = tmp_path / "out"
    out.mkdir()
    # A clean start: not this session's cache, nor its worker's identity (this test may itself run on a worker).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST") and k not in (
        "PKB_CACHE_DIR", "PKB_TEST_SESSION_CACHE")}
    env.update(PKB_TEST_PROBE_OUT=str(out), PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "tests.conftest",
                           "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", os.devnull,
                           str(tmp_path / "test_probe.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = {p.name: p.read_text() for p in out.glob("cache-*")}
    assert len(records) == 14
    assert {name.split("-")[1] for name in records} == {"gw0", "gw1"}  # both workers ran tests
    caches = set(records.values())
    assert len(caches) == 1, caches  # one cache for the run, not one per worker
    assert not Path(caches.pop()).exists()  # and the process that made it removed it at the end

