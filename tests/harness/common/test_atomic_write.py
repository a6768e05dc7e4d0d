"""harness.common.atomic_write: the one atomic writer, and the rule for a path a user named (`--out`).

As root, `pkb report --out /dev/null` once replaced /dev/null with a regular file, and an --out that was a
link had the link replaced. The device here is a node of our own with /dev/null's numbers (1, 3), made in
a temporary folder: the real /dev/null is never touched.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.common.atomic_write import OutRefused, check_out, remove_leftovers, replace_atomically, write_out

ROOT = os.geteuid() == 0


def _null_device(folder: Path) -> Path:
    node = folder / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return node


def test_a_regular_file_is_replaced_whole_and_keeps_its_mode(tmp_path: Path):
    out = tmp_path / "report.md"
    out.write_text("old")
    out.chmod(0o640)
    write_out(out, b"new")
    assert out.read_bytes() == b"new" and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]  # no temporary left


def test_a_new_path_is_created_with_its_folders(tmp_path: Path):
    write_out(tmp_path / "a" / "b" / "report.json", b"{}")
    assert (tmp_path / "a" / "b" / "report.json").read_bytes() == b"{}"


def test_a_link_is_followed_and_its_target_written_the_link_kept(tmp_path: Path):
    target = tmp_path / "real" / "report.md"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "latest.md"
    link.symlink_to(target)
    write_out(link, b"new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == b"new"
    dangling = tmp_path / "dangling.md"
    dangling.symlink_to(tmp_path / "made" / "by-link.md")
    write_out(dangling, b"made")
    assert dangling.is_symlink() and (tmp_path / "made" / "by-link.md").read_bytes() == b"made"


def test_the_null_device_is_written_through_and_stays_a_device(tmp_path: Path):
    node = _null_device(tmp_path)
    write_out(node, b"report")
    info = os.lstat(node)
    assert stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 3)
    link = tmp_path / "to-null"
    link.symlink_to(node)
    write_out(link, b"report")
    assert link.is_symlink() and stat.S_ISCHR(os.lstat(node).st_mode)


def test_another_device_is_refused_with_the_rule(tmp_path: Path):
    node = tmp_path / "zero"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("making a device node needs root")
    with pytest.raises(OutRefused) as err:
        write_out(node, b"x")
    said = err.value.strerror or ""
    assert "a character device" in said and "--out writes a regular file" in said
    assert stat.S_ISCHR(os.lstat(node).st_mode)


def test_nothing_is_created_or_replaced_under_dev(tmp_path: Path):
    with pytest.raises(OutRefused, match="nothing is created under"):
        check_out("/dev/pkb-test-never-made")
    assert not os.path.lexists("/dev/pkb-test-never-made")


def test_folders_and_fifos_nobody_reads_are_refused_without_waiting(tmp_path: Path):
    with pytest.raises(OutRefused, match="is a folder"):
        write_out(tmp_path, b"x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutRefused, match="FIFO nobody reads"):
        write_out(fifo, b"x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_with_a_reader_is_written_through(tmp_path: Path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # someone reads: the write goes into the pipe's buffer
    try:
        write_out(fifo, b"through")
        assert os.read(reader, 1 << 16) == b"through"
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dev_stdout_writes_this_process_stdout(tmp_path: Path):
    """`--out /dev/stdout` with stdout a file: written through fd 1 (the shell's file keeps its inode)."""
    log = tmp_path / "log"
    code = ("from harness.common.atomic_write import write_out\nprint('before', flush=True)\n"
            "write_out('/dev/stdout', b'report\\n')\n")
    with open(log, "wb") as stdout:
        inode = os.fstat(stdout.fileno()).st_ino
        subprocess.run([sys.executable, "-c", code], stdout=stdout, check=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert log.read_bytes() == b"before\nreport\n" and log.stat().st_ino == inode


def test_replace_atomically_replaces_a_planted_link_never_writing_through(tmp_path: Path):
    secret = tmp_path / "secret"
    secret.write_text("keep")
    path = tmp_path / "cache.json"
    path.symlink_to(secret)
    replace_atomically(path, b"{}", 0o600)
    assert not path.is_symlink() and path.read_bytes() == b"{}" and secret.read_text() == "keep"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_there_is_one_atomic_writer():
    """Issue 47: one definition. Anything else that renames a temporary over a file is a second writer."""
    root = Path(__file__).resolve().parents[3]
    hits = []
    for folder in ("harness", "agent", "tools", "prompts"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text()
            if "os.replace(" in text or "mkstemp(" in text:
                hits.append(str(path.relative_to(root)))
    # compile.py renames whole build folders into the cache (not a file write); reference_cache.py creates its
    # key once, exclusively (a link, not a rename).
    assert sorted(hits) == ["harness/common/atomic_write.py", "harness/compiling/compile.py",
                            "harness/records/reference_cache.py"], hits


@pytest.mark.skipif(not ROOT, reason="the owner is kept only where the writer may set it (root)")
def test_as_root_a_users_file_keeps_its_owner(tmp_path: Path):
    out = tmp_path / "owned"
    out.write_text("old")
    os.chown(out, 65534, 65534)
    write_out(out, b"new")
    assert (out.stat().st_uid, out.stat().st_gid) == (65534, 65534) and out.read_bytes() == b"new"


def test_remove_leftovers_takes_only_a_killed_writers_temporaries(tmp_path: Path):
    folder = tmp_path / "sample"
    (folder / "candidates").mkdir(parents=True)
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(folder / "candidates" / "000.py")],
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9, killed.stderr
    left = [p.name for p in (folder / "candidates").iterdir()]
    assert len(left) == 1 and left[0].startswith(".000.py.") and left[0].endswith(".tmp")  # what a kill leaves
    kept = [folder / "sample.json", folder / ".hidden", folder / "notes.tmp", folder / ".x.notahexname.tmp",
            folder / ".y.0123456789ab.tmp.bak"]
    for path in kept:
        path.write_text("mine")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / ".z.0123456789ab.tmp").write_text("not the sample's")
    (folder / "linked").symlink_to(outside)  # a link to a folder is not followed
    (folder / ".w.0123456789ab.tmp").symlink_to(outside / ".z.0123456789ab.tmp")  # nor is a file's link removed
    removed = remove_leftovers(folder)
    assert [p.name for p in removed] == left
    assert not any((folder / "candidates").iterdir())
    assert all(p.exists() for p in kept) and (outside / ".z.0123456789ab.tmp").exists()
    assert (folder / ".w.0123456789ab.tmp").is_symlink()


# replace_atomically, with the process killed (SIGKILL) after its write and before its rename.
KILLED_MID_WRITE = """
import os, signal, sys
from pathlib import Path
from harness.common import atomic_write
os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
atomic_write.replace_atomically(Path(sys.argv[1]), b"half a candidate")
"""
