"""harness.rank.launcher: the limits every process of a sandbox inherits, set before any worker starts."""

from __future__ import annotations

import json
import subprocess
import sys

from harness.common.paths import REPO_ROOT

PROBE = """
import json, resource, sys
from harness.rank.launcher import set_limits
set_limits(json.loads(sys.argv[1]))
print(json.dumps({name: resource.getrlimit(getattr(resource, name)) for name in
                  ("RLIMIT_CORE", "RLIMIT_NOFILE", "RLIMIT_FSIZE")}))
"""


def limits_after(limits: dict[str, int]) -> dict[str, list[int]]:
    # In a process of its own: lowered hard limits cannot be raised again.
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(limits)], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=60, check=True)
    return dict(json.loads(done.stdout))


def test_the_limits_are_set_soft_and_hard_and_no_core_is_dumped():
    got = limits_after({"nofile": 64, "fsize": 1 << 20})
    assert got["RLIMIT_CORE"] == [0, 0]
    assert got["RLIMIT_NOFILE"] == [64, 64] and got["RLIMIT_FSIZE"] == [1 << 20, 1 << 20]


def test_without_limits_only_core_dumps_are_off():
    got = limits_after({})
    assert got["RLIMIT_CORE"] == [0, 0] and got["RLIMIT_NOFILE"][0] > 64
