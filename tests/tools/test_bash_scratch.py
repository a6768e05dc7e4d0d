"""tools.bash.prepare: the bash condition's scratch folder, which the model's shell writes between the
harness's visits. What the shell left there is hostile: a link is never followed, a name it took is left
alone, and the folder is never writable by every user of the machine."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harness.config import EvalConfig
from harness.launch.sandbox import probe
from harness.launch.sandbox.policy import SANDBOX_UID
from harness.problems.registry import get, load_suite
from tools import bash
from tools.base import ToolContext, ToolSettings

REFERENCE = "reference.py"


def context(workdir: Path) -> ToolContext:
    return ToolContext(problem=get(load_suite(), "all_reduce"), settings=ToolSettings(2, "cpu", "small"),
                       config=EvalConfig(trials=2), workdir=workdir)


def test_the_reference_is_written_once_and_the_folder_is_not_everyones(tmp_path: Path) -> None:
    folder = bash.prepare(context(tmp_path), {REFERENCE: "def reference(x):\n    return x\n"})
    assert (folder / REFERENCE).read_text().startswith("def reference")
    assert (folder / "tmp").is_dir()
    assert stat.S_IMODE(folder.stat().st_mode) & 0o022 == 0  # was 0777: any user of the machine wrote there
    (folder / REFERENCE).write_text("the model's own notes\n")
    bash.prepare(context(tmp_path), {REFERENCE: "def reference(x):\n    return x\n"})
    assert (folder / REFERENCE).read_text() == "the model's own notes\n"  # its file, not overwritten


def test_a_link_the_shell_left_is_never_followed(tmp_path: Path) -> None:
    """A resumed sample: the shell replaced the reference by a dangling link into a folder of the host's,
    and `tmp` by a link to another. The harness (root on a GPU node) used to write the reference through
    the link, creating a file where the link pointed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    work = tmp_path / "sample"
    folder = bash.prepare(context(work), {})
    (folder / REFERENCE).symlink_to(outside / "written-by-the-harness.py")
    os.rmdir(folder / "tmp")
    (folder / "tmp").symlink_to(outside)
    (folder / "sub").symlink_to(outside)
    bash.prepare(context(work), {REFERENCE: "x = 1\n", "sub/nested.py": "y = 2\n"})
    assert sorted(p.name for p in outside.iterdir()) == []
    assert (folder / REFERENCE).is_symlink() and (folder / "tmp").is_symlink()


@pytest.mark.skipif(not probe().host_uid_switch, reason="the shell runs as the sandbox's uid on the host only when "
                                                        "the harness is root and bubblewrap can switch uids")
def test_the_sandbox_user_owns_the_folder_where_it_runs_as_that_uid(tmp_path: Path) -> None:
    folder = bash.prepare(context(tmp_path), {REFERENCE: "x = 1\n"})
    for path in (folder, folder / REFERENCE, folder / "tmp"):
        assert path.stat().st_uid == SANDBOX_UID, path
