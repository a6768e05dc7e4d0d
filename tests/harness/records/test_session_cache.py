"""The test session never touches the user's cache (tests/conftest.py): it has a PKB_CACHE_DIR of its own, which
every process a test starts inherits, and a write into ~/.cache/pkb-agent by the test process fails at once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.common.paths import REPO_ROOT
from harness.records.cache_dir import cache_root
from tests import conftest

REPO = REPO_ROOT


def test_the_session_has_a_cache_of_its_own_that_subprocesses_inherit() -> None:
    assert cache_root() == conftest.SESSION_CACHE != conftest.USER_CACHE
    out = subprocess.run([sys.executable, "-c",
                          "from harness.records.cache_dir import cache_root; print(cache_root())"],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    assert out == str(conftest.SESSION_CACHE)


def test_a_write_into_the_users_cache_fails_the_test_that_made_it() -> None:
    target = conftest.USER_CACHE / f"pkb-test-guard-{os.getpid()}.json"
    before = len(conftest._violations)
    with pytest.raises(RuntimeError, match="a test wrote into the user's cache"):
        target.write_text("{}")
    with pytest.raises(RuntimeError, match="user's cache"):
        os.replace(conftest.SESSION_CACHE / "missing", target)
    assert not target.exists()
    assert len(conftest._violations) == before + 2  # the session would fail at its end too ...
    del conftest._violations[before:]  # ... but these two were this test's doing, on purpose
