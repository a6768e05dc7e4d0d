"""harness.launch.priority: a build's processes and their sessions are made nicer, and a session that took
its share back is set again."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.launch.priority import keep_sessions_nice, niced, session_niceness, set_session_niceness

AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled")
needs_autogroups = pytest.mark.skipif(not AUTOGROUPS.is_file() or AUTOGROUPS.read_text().strip() != "1",
                                      reason="this kernel does not group sessions for scheduling")


def test_nice_prefixes_the_command_only_when_asked():
    assert niced(["true"], 0) == ["true"]
    command = niced(["true"], 7)
    assert command[1:] == ["-n", "7", "true"] and Path(command[0]).name == "nice"
    assert subprocess.run(command, check=False).returncode == 0


@needs_autogroups
def test_a_session_set_back_is_set_again_and_one_already_nice_is_left():
    leaders = [subprocess.Popen(["sleep", "30"], start_new_session=True) for _ in range(2)]
    try:
        assert [session_niceness(p.pid) for p in leaders] == [0, 0]
        assert set_session_niceness(leaders[0].pid, 12)
        assert keep_sessions_nice([p.pid for p in leaders], 10) == 1  # only the one below 10
        assert [session_niceness(p.pid) for p in leaders] == [12, 10]
        assert keep_sessions_nice([p.pid for p in leaders], 10) == 0
    finally:
        for p in leaders:
            p.kill()
            p.wait()
    assert session_niceness(leaders[0].pid) is None and not set_session_niceness(leaders[0].pid, 10)  # gone
