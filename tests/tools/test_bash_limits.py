"""The bash condition's shell under the sandbox's limits (harness.launch.sandbox.limits.ShellSettings): memory,
/tmp and /dev/shm sizes, scratch bytes, processes and the wall. Going over ends the command, its output names
the limit, and nothing is left behind. The hostile commands are tests/exploits/_shell_hog.py's."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from harness.config import EvalConfig
from harness.launch.sandbox import probe
from harness.launch.sandbox.limits import SandboxLimits, ShellSettings
from harness.launch.sandbox.memory import memory_cgroup_parent
from harness.problems.registry import get, load_suite
from tests.conftest import TESTS, live_children, processes_mentioning
from tools import bash
from tools.base import ToolContext, ToolSettings
from tools.langchain_tools import make_tool

_spec = importlib.util.spec_from_file_location("shell_hog", TESTS / "exploits" / "_shell_hog.py")
assert _spec is not None and _spec.loader is not None
HOG = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(HOG)

needs_sandbox = pytest.mark.skipif(probe().backend != "bwrap", reason="the shell runs only in the bubblewrap sandbox")
SMALL = {"PKB_SHELL_MEMORY_BYTES": 64 << 20, "PKB_SHELL_TMP_BYTES": 16 << 20, "PKB_SHELL_SHM_BYTES": 16 << 20,
         "PKB_SHELL_SCRATCH_BYTES": 32 << 20, "PKB_SHELL_PROCESSES": 40}


def context(workdir: Path) -> ToolContext:
    return ToolContext(problem=get(load_suite(), "all_reduce"), settings=ToolSettings(2, "cpu", "small"),
                       config=EvalConfig(trials=2), workdir=workdir, shell_timeout_s=60.0)


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SMALL.items():
        monkeypatch.setenv(name, str(value))


@needs_sandbox
@pytest.mark.usefixtures("small_limits")
@pytest.mark.parametrize("kind", sorted(HOG.COMMANDS))
def test_a_hostile_command_is_ended_and_its_limit_named(kind: str, tmp_path: Path) -> None:
    command, setting = HOG.COMMANDS[kind]
    outcome = bash.run({"command": command}, context(tmp_path), None)
    if setting:
        assert outcome.text.startswith("[stopped: "), outcome.text[:500]
        assert setting in outcome.text, outcome.text[:500]
        assert outcome.data["limit"] and not outcome.data["timed_out"]
    # Nothing left: no process (the PID namespace ended), no cgroup, no file outside the scratch.
    assert live_children() == []
    assert processes_mentioning(HOG.TOKEN) == []
    parent = memory_cgroup_parent()
    # This process's shells only (named after the harness's pid): a parallel worker's shell may be running now.
    assert parent is None or not list(parent.glob(f"pkb-{os.getpid()}-*-shell-*")), "the shell's cgroup was left behind"
    assert sorted(p.name for p in tmp_path.iterdir()) == [bash.SHELL_DIR]


@needs_sandbox
@pytest.mark.usefixtures("small_limits")
def test_an_honest_command_runs_under_the_limits(tmp_path: Path) -> None:
    outcome = bash.run({"command": "printf 'x = 1\\n' > sol.py && python3 -c 'import sol; print(sol.x)' && "
                                   "ls /tmp /dev/shm"}, context(tmp_path), None)
    assert outcome.text.startswith("[exit code 0"), outcome.text
    assert outcome.data["limit"] is None


@pytest.mark.usefixtures("small_limits")
def test_the_limits_are_in_the_tools_description(tmp_path: Path) -> None:
    description = make_tool("bash", context(tmp_path)).description
    limits = SandboxLimits.for_shell(wall_s=60.0)
    assert limits.summary() in description
    assert "0.06 GiB" in description and "40 processes" in description and "60 s" in description


def test_shell_settings_come_from_the_environment_and_refuse_nonsense() -> None:
    assert ShellSettings.from_environment({}) == ShellSettings()
    assert ShellSettings.from_environment({"PKB_SHELL_PROCESSES": "12"}).processes == 12
    with pytest.raises(ValueError):
        ShellSettings.from_environment({"PKB_SHELL_MEMORY_BYTES": "0"})
