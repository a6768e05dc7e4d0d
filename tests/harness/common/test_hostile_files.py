"""harness.common.hostile_files: a link, a FIFO, a sparse file, a hard link or garbage where the trusted side reads
or writes is refused in one line, never followed, never blocking, never read whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.common import hostile_files
from harness.common.hostile_files import Folder, HostileFile, Missing, Planted, TooLarge, copy_tree_out, strict_json


@pytest.fixture
def scratch(tmp_path: Path):
    (tmp_path / "scratch").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("root-only\n")
    with Folder.open(tmp_path / "scratch") as folder:
        yield folder, tmp_path / "scratch", tmp_path / "outside"


def test_plain_files_are_read_whole_and_bounded(scratch):
    folder, path, _ = scratch
    (path / "out.bin").write_bytes(b"abc")
    assert folder.read_bytes("out.bin", 3) == b"abc"
    assert folder.read_bytes(path / "out.bin", 3) == b"abc"  # an absolute path under the folder
    with pytest.raises(TooLarge, match="holds 3 bytes, more than the 2 allowed"):
        folder.read_bytes("out.bin", 2)
    with pytest.raises(Missing, match="was not written"):
        folder.read_bytes("none.bin", 10)


def test_a_link_is_never_followed_last_or_on_the_way(scratch):
    folder, path, outside = scratch
    os.symlink(outside / "secret.txt", path / "out.bin")
    with pytest.raises(Planted, match="is a symbolic link"):
        folder.read_bytes("out.bin", 1 << 20)
    os.symlink(outside, path / "calls")
    with pytest.raises(Planted, match="calls is a symbolic link"):
        folder.read_bytes("calls/secret.txt", 1 << 20)
    with pytest.raises(Planted):
        folder.make_dir("calls")
    with pytest.raises(Planted):
        folder.write_new("calls/new.pt", b"x")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_a_fifo_never_blocks_and_a_hard_link_is_refused(scratch):
    folder, path, _ = scratch
    os.mkfifo(path / "out.bin")
    with pytest.raises(Planted, match="not a plain file"):
        folder.read_bytes("out.bin", 1 << 20)
    (path / "a").write_bytes(b"x")
    os.link(path / "a", path / "b")
    with pytest.raises(Planted, match="2 hard links"):
        folder.read_bytes("b", 10)


def test_a_huge_sparse_file_is_refused_from_fstat_and_its_tail_read_alone(scratch):
    folder, path, _ = scratch
    with open(path / "big.bin", "wb") as f:
        f.truncate(2 << 30)
        f.seek((2 << 30) - 3)
        f.write(b"end")
    with pytest.raises(TooLarge) as refused:
        folder.read_bytes("big.bin", 16 << 20)
    assert refused.value.size == (2 << 30) and refused.value.limit == 16 << 20
    assert folder.read_tail("big.bin", 5) == b"\0\0end"


def test_writes_make_only_new_names(scratch):
    folder, path, outside = scratch
    folder.make_dir("calls")
    folder.make_dir("calls")  # a real folder already there is fine
    folder.write_new("calls/c0-in.pt", b"inputs")
    assert (path / "calls" / "c0-in.pt").read_bytes() == b"inputs"
    source = outside / "secret.txt"
    for planted in ("link", "fifo", "file"):
        target = path / "calls" / f"{planted}.pt"
        if planted == "link":
            os.symlink(source, target)
        elif planted == "fifo":
            os.mkfifo(target)
        else:
            target.write_bytes(b"old")
        with pytest.raises(Planted, match="exists already where the harness writes"):
            folder.copy_new(target, source)
    assert source.read_text() == "root-only\n"
    folder.unlink("calls/link.pt")  # the link goes, its target stays
    assert not (path / "calls" / "link.pt").is_symlink() and source.exists()
    (path / "sets").write_bytes(b"not a folder")
    with pytest.raises(Planted, match="sets is a plain file"):
        folder.make_dir("sets")


def test_names_outside_the_folder_are_refused(scratch):
    folder, path, _ = scratch
    for name in ("../outside/secret.txt", path.parent / "outside" / "secret.txt", ""):
        with pytest.raises(HostileFile):
            folder.read_bytes(name, 100)


def test_strict_json():
    assert strict_json(b'{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    for bad, why in ((b'{"a": 1} x', "Extra data"), (b'{"a": 1, "a": 2}', "appears twice"), (b"[NaN]", "NaN"),
                     (b"[Infinity]", "Infinity"), (b"\xff", "not UTF-8"), (b"[" * 100_000 + b"]" * 100_000, "deep")):
        with pytest.raises(HostileFile, match=why):
            strict_json(bad)


def test_a_tree_is_copied_out_file_by_file_or_refused_whole(tmp_path, scratch):
    folder, path, outside = scratch
    (path / "ext" / "sub").mkdir(parents=True)
    (path / "ext" / "sub" / "m.so").write_bytes(b"\x7fELF")
    (path / "ext" / "lock").write_bytes(b"")
    with folder.sub("ext") as ext:
        assert copy_tree_out(ext, tmp_path / "copy", max_bytes=100, max_files=10, skip=lambda n: n == "lock") == 4
    assert (tmp_path / "copy" / "sub" / "m.so").read_bytes() == b"\x7fELF" and not (tmp_path / "copy" / "lock").exists()
    os.symlink(outside, path / "ext" / "sub" / "escape")
    with folder.sub("ext") as ext, pytest.raises(Planted, match="escape"):
        copy_tree_out(ext, tmp_path / "copy2", max_bytes=100, max_files=10)
    os.unlink(path / "ext" / "sub" / "escape")
    with open(path / "ext" / "huge", "wb") as f:
        f.truncate(1 << 31)
    with folder.sub("ext") as ext, pytest.raises(TooLarge):
        copy_tree_out(ext, tmp_path / "copy3", max_bytes=1 << 20, max_files=10)


def test_a_copied_tree_keeps_its_files_times(tmp_path, scratch):
    """ninja's dependency log holds each object's mtime: a build folder copied with new times is rebuilt."""
    folder, path, _ = scratch
    (path / "ext").mkdir()
    for name, when in (("main.o", 1_700_000_000_123_456_789), ("main.cpp", 1_600_000_000_000_000_001)):
        (path / "ext" / name).write_bytes(b"x")
        os.utime(path / "ext" / name, ns=(when, when))
    with folder.sub("ext") as ext:
        copy_tree_out(ext, tmp_path / "copy", max_bytes=100, max_files=10)
        copy_tree_out(ext, tmp_path / "redacted", max_bytes=100, max_files=10, transform=lambda b: b + b"!")
    for copy in ("copy", "redacted"):
        assert (tmp_path / copy / "main.o").stat().st_mtime_ns == 1_700_000_000_123_456_789
        assert (tmp_path / copy / "main.cpp").stat().st_mtime_ns == 1_600_000_000_000_000_001


def test_replace_file_replaces_a_planted_link_never_writes_through_it(tmp_path):
    target = tmp_path / "outside.txt"
    target.write_text("keep\n")
    os.symlink(target, tmp_path / "cache.json")
    hostile_files.replace_file(tmp_path / "cache.json", b"{}")
    assert target.read_text() == "keep\n"
    assert not (tmp_path / "cache.json").is_symlink() and (tmp_path / "cache.json").read_bytes() == b"{}"
