"""Files a user points the CLI at are opened as a candidate's artifacts are (issue 45, class 3).

A FIFO inside a replay folder made `pkb run` wait forever; a sweep file that is a FIFO blocked `pkb sweep`;
a link in a replay folder to a file outside it was read as a candidate; as root, `--out /dev/null` replaced
/dev/null with a regular file. Each refusal is one line naming the file; nothing blocks.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli.common import CliError, check_out_path, existing_file
from agent.replay import ReplayError, load_replay
from agent.rundir import write_out_text
from harness.common.hostile_files import GIVEN_LIMIT
from harness.common.paths import REPO_ROOT
from harness.problems.parallelkernelbench.solutions import solution_signature
from harness.problems.registry import get, load_suite

GOOD = "def solution(x):\n    return x\n"


@pytest.fixture(scope="module")
def suite():
    return load_suite()


def test_a_fifo_in_a_replay_folder_is_refused_by_name(tmp_path: Path, suite):
    (tmp_path / "all_reduce").mkdir()
    (tmp_path / "all_reduce" / "a.py").write_text(GOOD)
    os.mkfifo(tmp_path / "all_reduce" / "b.py")
    with pytest.raises(ReplayError, match=r"all_reduce/b\.py is a FIFO, not a plain file"):
        load_replay(tmp_path, [get(suite, "all_reduce")])
    os.unlink(tmp_path / "all_reduce" / "b.py")
    os.mkfifo(tmp_path / "all_gather.py")
    with pytest.raises(ReplayError, match=r"all_gather\.py is a FIFO"):
        load_replay(tmp_path, [get(suite, "all_reduce"), get(suite, "all_gather")])


def test_a_link_out_of_a_replay_folder_is_refused_one_inside_is_read(tmp_path: Path, suite):
    outside = tmp_path / "outside.py"
    outside.write_text(GOOD)
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "all_reduce.py").symlink_to(outside)
    with pytest.raises(ReplayError, match="a link out of"):
        load_replay(folder, [get(suite, "all_reduce")])
    (folder / "all_reduce.py").unlink()
    (folder / "_kept").mkdir()  # a helper folder: not a problem of its own
    (folder / "_kept" / "real.py").write_text(GOOD)
    (folder / "all_reduce.py").symlink_to(folder / "_kept" / "real.py")
    problems = [get(suite, "all_reduce")]
    assert load_replay(folder, problems).solutions("all_reduce") == [folder / "all_reduce.py"]
    (folder / "all_gather").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ReplayError, match="all_gather is a link out of the folder"):
        load_replay(folder, [*problems, get(suite, "all_gather")])


def test_a_too_large_solution_is_refused_before_it_is_read(tmp_path: Path, suite):
    big = tmp_path / "all_reduce.py"
    with open(big, "wb") as f:
        f.truncate(GIVEN_LIMIT + 1)  # sparse: costs nothing to make
    with pytest.raises(ReplayError, match="more than the"):
        load_replay(tmp_path, [get(suite, "all_reduce")])
    with pytest.raises(CliError, match="solution file .* more than the"):
        existing_file(str(big), "solution file")


def test_a_pkb_set_file_that_links_out_is_never_read(tmp_path: Path):
    secret = tmp_path / "secret.py"
    secret.write_text(GOOD)
    folder = tmp_path / "solutions_cuda_bf16_h100_x_y"
    folder.mkdir()
    (folder / "1_all_reduce_cuda.py").symlink_to(secret)
    assert "refused" in str(solution_signature(folder / "1_all_reduce_cuda.py"))
    os.mkfifo(folder / "2_all_gather_cuda.py")
    assert "is a FIFO" in str(solution_signature(folder / "2_all_gather_cuda.py"))


def test_a_sweep_file_that_is_a_fifo_is_refused_without_waiting(tmp_path: Path):
    fifo = tmp_path / "sweep.toml"
    os.mkfifo(fifo)
    code = ("from agent.sweep.spec import SweepError, load\ntry:\n    load(__import__('sys').argv[1])\n"
            "except SweepError as err:\n    print(err)\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=120,
                              cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail("loading a sweep file that is a FIFO waited for a writer")
    assert proc.stdout.strip() == f"sweep file {fifo} is a FIFO, not a plain file: refused", proc.stdout + proc.stderr


def test_out_to_a_null_device_writes_through_and_another_device_is_refused_up_front(tmp_path: Path):
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers, in a folder of our own
        os.mknod(tmp_path / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a device node needs root")
    check_out_path(str(node))
    write_out_text(node, '{"verdict": "correct"}')  # what pkb eval --out, report and export write with
    assert stat.S_ISCHR(os.lstat(node).st_mode) and os.lstat(node).st_rdev == os.makedev(1, 3)
    with pytest.raises(CliError, match="zero is a character device; --out writes a regular file"):
        check_out_path(str(tmp_path / "zero"))


def test_out_through_a_link_writes_the_target(tmp_path: Path):
    target = tmp_path / "result.json"
    target.write_text("{}")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    write_out_text(link, '{"new": 1}')
    assert link.is_symlink() and target.read_text() == '{"new": 1}'


@pytest.mark.skipif(os.geteuid() != 0, reason="making a character device needs root")
@pytest.mark.parametrize("command", ["report", "export"])
def test_report_and_export_out_write_through_a_null_device_and_a_link(tmp_path: Path, command: str):
    """`pkb report --out` and `pkb export --out` as root: a character device with /dev/null's numbers stays that
    device (it once became a regular file), and an --out that is a link writes its target, keeping the link."""
    from agent.cli import main
    from tests.report_support import make_run

    run = make_run(tmp_path)
    device = tmp_path / "null"
    os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert main([command, str(run), "--out", str(device)]) == 0
    assert stat.S_ISCHR(os.lstat(device).st_mode)
    target = tmp_path / "target.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    assert main([command, str(run), "--out", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() != "old" and target.read_text().strip()
