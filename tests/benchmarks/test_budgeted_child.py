"""A long benchmark's child ends however the benchmark ends, and the benchmark still gets to write its results:
done, stopped at its budget, or stopped by its own caller (SIGTERM, as `timeout` sends)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks import budgeted_child
from benchmarks.budgeted_child import Segments, run_for

REPO = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie counts as gone: its parent (the child's shell) was killed and init reaps it.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _grandchild_command(pid_file: Path, trap_term: bool = False) -> list[str]:
    """A shell that starts a long sleep in the background (a grandchild, as `pkb run`'s rank pools are) and
    waits for it; with trap_term, the shell ignores SIGTERM."""
    trap = "trap '' TERM; " if trap_term else ""
    return ["bash", "-c", f"{trap}sleep 300 & echo $! > {pid_file}; wait"]


def _read_pid(pid_file: Path) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if pid_file.exists() and pid_file.read_text().strip():
            return int(pid_file.read_text())
        time.sleep(0.05)
    raise AssertionError("the child never wrote its grandchild's pid")


def test_a_child_that_ends_is_done_with_its_exit_code_and_output_appended(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("earlier segment\n")
    run = run_for(["bash", "-c", "echo hello; exit 3"], cwd=tmp_path, log=log, budget_s=30, env=os.environ)
    assert (run.ended, run.returncode) == ("done", 3)
    assert log.read_text() == "earlier segment\nhello\n"


def test_the_budget_ends_the_childs_whole_session(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    run = run_for(_grandchild_command(pid_file), cwd=tmp_path, log=tmp_path / "log", budget_s=1.0, env=os.environ)
    assert run.ended == "budget"
    assert run.returncode is not None
    assert _wait_gone(_read_pid(pid_file))


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budgeted_child, "GRACE_S", 0.5)
    pid_file = tmp_path / "pid"
    # The sleep itself does not ignore TERM, so trap it in a subshell around it too: nothing in the group
    # ends on SIGTERM.
    command = ["bash", "-c", f"trap '' TERM; bash -c \"trap '' TERM; sleep 300\" & echo $! > {pid_file}; wait"]
    run = run_for(command, cwd=tmp_path, log=tmp_path / "log", budget_s=1.0, env=os.environ)
    assert run.ended == "budget"
    assert run.returncode == -signal.SIGKILL
    assert _wait_gone(_read_pid(pid_file))


def test_a_stopped_benchmark_ends_its_child_and_still_writes_its_results(tmp_path: Path) -> None:
    """The benchmark process itself gets SIGTERM (its caller's limit): run_for returns 'stopped' after ending
    the child's session, and the code after it (where a benchmark writes its summary) runs."""
    pid_file, result = tmp_path / "pid", tmp_path / "result"
    driver = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from benchmarks.budgeted_child import Segments, run_for
        run = run_for({_grandchild_command(pid_file)!r}, cwd=Path({str(tmp_path)!r}),
                      log=Path({str(tmp_path / "log")!r}), budget_s=300, env=os.environ)
        Path({str(result)!r}).write_text(run.ended)
    """)
    proc = subprocess.Popen([sys.executable, "-c", driver])
    try:
        grandchild = _read_pid(pid_file)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert result.read_text() == "stopped"
    assert _wait_gone(grandchild)


def test_segments_add_up_across_machines_and_a_lost_one_keeps_its_wall_to_the_last_copy(tmp_path: Path) -> None:
    path = tmp_path / "segments.json"
    first = Segments(path, resume=False)
    first.update(120.04)
    carried = path.read_text()  # the copy that travels on, taken while the first segment ran
    first.update(540.0, "stopped")
    path.write_text(carried)  # ...and its machine went back before it ended: the next starts from that copy
    second = Segments(path, resume=True)
    assert [(x["wall_s"], x["ended"]) for x in second.segments] == [(120.0, "lost"), (0.0, "running")]
    second.update(300.0, "done", sm_busy=0.5, sm_samples=600)
    assert json.loads(path.read_text())[-1] == {**second.segments[-1], "sm_busy": 0.5}
    assert second.wall_s == 420.0
    assert not list(tmp_path.glob("*.part"))
    fresh = Segments(path, resume=False)
    assert [x["ended"] for x in fresh.segments] == ["running"]


def test_the_open_segment_is_written_as_the_child_runs(tmp_path: Path) -> None:
    ticks: list[float] = []
    run = run_for(["sleep", "1.2"], cwd=tmp_path, log=tmp_path / "log", budget_s=30, env=os.environ,
                  on_tick=ticks.append, tick_s=0.25)
    assert run.ended == "done"
    assert len(ticks) >= 2 and ticks == sorted(ticks)


def test_a_failure_of_our_own_while_waiting_ends_the_child_too(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    def full_disk(wall_s: float) -> None:
        if pid_file.exists():
            raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space left"):
        run_for(_grandchild_command(pid_file), cwd=tmp_path, log=tmp_path / "log", budget_s=60, env=os.environ,
                on_tick=full_disk, tick_s=0.2)
    assert _wait_gone(_read_pid(pid_file))
