"""A content-addressed cache of compiled objects: one object per key, the key a hash of every input.

The split build (harness.compiling.split_build) keeps here the object of a load_inline extension's binding
unit (main.cpp: torch/extension.h and the generated PYBIND11 module), the unit an agent's edits rarely
touch and whose compile is a host pass over torch's headers (17-22 s on an H200 node).

Fail closed:
- the key covers what decides the object: the unit's source bytes, the full compile command (compiler,
  every flag, include paths), the compiler's own version text, torch's version and the identity of its
  headers (harness.compiling.split_build.unit_key). Another input, another key: never another's object;
- an entry is a folder holding the object and a manifest (the key, the object's size and sha256), made in
  a staging folder and renamed into place whole: a reader sees no entry or a complete one. The manifest is
  written with harness.common.atomic_write;
- the manifest also names every file the compile read besides the source (the headers its depfile lists)
  with each one's sha256: a lookup hashes them again, so a changed header (another torch, another CUDA)
  is a miss although the key, fixed before the compile, could not name them;
- a lookup reads the manifest strictly (no link followed, size-capped) and hashes the object again: an
  entry whose key, size, hash or headers do not match (tampered, truncated, planted, stale) is a miss, and
  is removed so the next store replaces it;
- two builds storing the same key at once: the first rename wins, the second finds the folder there and
  drops its own copy; both objects were built from the same inputs.
Only the trusted side may hold a writable cache: a build process that candidate code shares is given none
(split_build's `cache=None`), so nothing a candidate runs can place an object under a key.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.common.atomic_write import replace_atomically
from harness.common.hostile_files import HostileFile, read_json

OBJECT = "object.o"
MANIFEST = "manifest.json"
MANIFEST_CAP = 4 << 20  # bytes of a manifest a lookup reads (a torch binding unit reads ~1,500 headers)
HEADER_CAP = 64 << 20  # bytes of one header hashed
OBJECT_CAP = 512 << 20  # an object larger than this is not kept (a binding unit is a few MB)
KEY_CHARS = 64


def digest(*parts: bytes) -> str:
    """sha256 over length-prefixed parts: ("ab", "c") and ("a", "bc") differ."""
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def _file_digest(path: Path, cap: int, *, follow: bool = False) -> tuple[int, str] | None:
    """(size, sha256) of a regular file, opened without following a link unless `follow` (a header of the
    toolchain: /usr/local/cuda is often one); None if it is not one or is larger than `cap`."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > cap:
            return None
        h, size = hashlib.sha256(), 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > cap:
                return None
            h.update(chunk)
        return size, h.hexdigest()
    finally:
        os.close(fd)


def input_digests(paths: list[str]) -> dict[str, str] | None:
    """path -> sha256 of each file; None when one cannot be read whole (then nothing is stored)."""
    out: dict[str, str] = {}
    for path in paths:
        found = _file_digest(Path(path), HEADER_CAP, follow=True)
        if found is None:
            return None
        out[path] = found[1]
    return out


def inputs_match(inputs: object) -> bool:
    """Whether a manifest's `inputs` (path -> sha256) still hash as recorded."""
    if not isinstance(inputs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in inputs.items()):
        return False
    return input_digests(list(inputs)) == inputs


@dataclass(frozen=True)
class ObjectCache:
    """The cache folder; `root` is created on first store."""

    root: Path

    def entry(self, key: str) -> Path:
        if len(key) != KEY_CHARS or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"not a cache key: {key!r}")
        return self.root / key

    def lookup(self, key: str) -> Path | None:
        """The cached object of `key`, checked whole; None (and a bad entry removed) otherwise."""
        entry = self.entry(key)
        try:
            if not stat.S_ISDIR(os.lstat(entry).st_mode):
                raise HostileFile(f"{entry} is not a folder")
            manifest = read_json(entry / MANIFEST, MANIFEST_CAP)
            if not isinstance(manifest, dict) or manifest.get("key") != key:
                raise HostileFile("the manifest is not this key's")
            found = _file_digest(entry / OBJECT, OBJECT_CAP)
            if found is None or [found[0], found[1]] != [manifest.get("size"), manifest.get("sha256")]:
                raise HostileFile("the object is not the one the manifest names")
            if not inputs_match(manifest.get("inputs")):
                raise HostileFile("a file the compile read has changed")
        except FileNotFoundError:
            return None
        except (OSError, HostileFile):
            self._discard(entry)
            return None
        return entry / OBJECT

    def store(self, key: str, built: Path, inputs: dict[str, str]) -> bool:
        """Keep `built` (an object this trusted process compiled) under `key`, with `inputs` (the files the
        compile read: path -> sha256, from input_digests); False when not kept (too large, not a regular
        file, or another process stored the key first)."""
        entry = self.entry(key)
        found = _file_digest(built, OBJECT_CAP)
        if found is None:
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))
        try:
            shutil.copyfile(built, staging / OBJECT, follow_symlinks=False)
            if _file_digest(staging / OBJECT, OBJECT_CAP) != found:  # changed while copied
                return False
            manifest = {"key": key, "size": found[0], "sha256": found[1], "inputs": inputs}
            replace_atomically(staging / MANIFEST, json.dumps(manifest).encode())
            # Readable by a build sandbox's uid (65534 where the harness is root), writable by this user only.
            for path, mode in ((staging / OBJECT, 0o644), (staging / MANIFEST, 0o644), (staging, 0o755)):
                os.chmod(path, mode)
            if os.path.lexists(entry) and self.lookup(key) is None and os.path.lexists(entry):
                return False  # a bad entry that could not be removed
            try:
                os.rename(staging, entry)  # whole, or not at all; fails when the key is there already
            except OSError:
                return False
            return True
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _discard(self, entry: Path) -> None:
        """Move a bad entry aside and remove it (a rename first, so no reader sees it half removed)."""
        aside = entry.with_name(f".bad-{entry.name}-{os.getpid()}")
        try:
            os.rename(entry, aside)
        except OSError:
            return
        if os.path.isdir(aside) and not os.path.islink(aside):
            shutil.rmtree(aside, ignore_errors=True)
        else:
            try:
                os.unlink(aside)
            except OSError:
                pass
