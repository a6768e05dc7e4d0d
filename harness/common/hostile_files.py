"""The one way the trusted side touches a file a candidate could have written.

A candidate's ranks (and, without a sandbox, the candidate itself) can put anything at a path the harness
later reads or writes: a symbolic link to a secret (`/proc/self/environ` is the environment of whoever
opens it), a FIFO that blocks whoever opens it, a sparse file of terabytes that costs nothing to make, a
folder where a file is expected, a link planted in place of a folder on the way. So every access here:

- starts from a folder the trusted side holds open (`Folder`: a descriptor taken before any candidate code
  could run there) and walks down one component at a time with O_NOFOLLOW | O_DIRECTORY: no link is
  followed, in the last component or in any folder on the way, and renaming a folder meanwhile changes
  nothing already open;
- opens with O_NONBLOCK, then requires a regular file with one link (fstat), so a FIFO or a device never
  blocks and a hard link to another file is refused;
- caps the size from fstat before a byte is read, and reads no more than that;
- writes only new names (O_CREAT | O_EXCL | O_NOFOLLOW): a name that exists already where the harness
  writes was planted, and that is the candidate's failure, never a write through it;
- copies trees out of a candidate's folders file by file (regular files and folders only, bounded);
- parses strictly (`strict_json`: no trailing bytes, no duplicate keys, no NaN or infinity).

Every refusal is a HostileFile error whose message is one line naming the file (its name relative to the
folder, never what it points to); callers charge it to the candidate. Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from harness.common.atomic_write import replace_atomically

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _O_NOCTTY | _O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_NOCTTY | _O_CLOEXEC
CHUNK = 1 << 24

# Called with (operation, folder, relative path) for every access through a Folder: tests use it to list
# every path the trusted side touches in an evaluation. None in normal use.
observer: Callable[[str, Path, str], None] | None = None


class HostileFile(Exception):
    """A file a candidate could have written is not what the harness expects; one line, the candidate's
    failure."""


class Missing(HostileFile):
    """Nothing at the path (the candidate did not write it)."""


class TooLarge(HostileFile):
    """A regular file larger than the reader's limit; nothing of it was read."""

    def __init__(self, message: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.size, self.limit = size, limit


class Planted(HostileFile):
    """Something the harness did not make stands where it writes, or a link or special file stands where it
    walks or reads."""


def _parts(path: str | PurePosixPath) -> tuple[str, ...]:
    parts = tuple(p for p in PurePosixPath(path).parts if p not in ("", "."))
    if any(p == ".." or "/" in p for p in parts):
        raise HostileFile(f"{path}: a path with '..' is never followed")
    return parts


def _describe(err: OSError, name: str | None = None, dir_fd: int | None = None) -> str:
    """Why an open failed, naming what stands at `name` (in `dir_fd`) where that can be seen without
    following it."""
    if name is not None and err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
            kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                    "a folder" if stat.S_ISDIR(mode) else "a plain file" if stat.S_ISREG(mode) else "a special file")
            return f"is {kind}"
        except OSError:
            pass
    if err.errno == errno.ELOOP:
        return "is a symbolic link"
    if err.errno == errno.ENOTDIR:
        return "passes through something that is not a folder"
    return err.strerror or type(err).__name__


def _regular(fd: int, name: str, limit: int) -> int:
    """The size of the regular file open at `fd`; HostileFile for anything else or too large a file."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise Planted(f"{name} is not a plain file")
    if info.st_nlink != 1:
        raise Planted(f"{name} has {info.st_nlink} hard links: not a plain file of its own")
    if info.st_size > limit:
        raise TooLarge(f"{name} holds {info.st_size} bytes, more than the {limit} allowed", info.st_size, limit)
    return info.st_size


def _whole(fd: int, name: str, limit: int) -> bytes:
    """All of the regular file open at `fd` (closed after), at most `limit` bytes."""
    try:
        return _read_fd(fd, _regular(fd, name, limit))
    finally:
        os.close(fd)


def _end(fd: int, name: str, limit: int) -> bytes:
    """The last `limit` bytes of the regular file open at `fd` (closed after), whatever its size."""
    try:
        size = _regular(fd, name, 1 << 62)
        start = max(0, size - limit)
        return _read_fd(fd, size - start, start)
    finally:
        os.close(fd)


def _read_fd(fd: int, size: int, start: int = 0) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = os.pread(fd, min(CHUNK, size - got), start + got)
        if not chunk:  # shrank while read: what was there; strict parsing judges it
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def strict_json(data: bytes | str, what: str = "the file") -> Any:
    """JSON with nothing after the document, no repeated key in an object, no NaN or infinity, UTF-8 only."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise HostileFile(f"{what}: the key {key[:40]!r} appears twice")
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise HostileFile(f"{what}: {name} is not JSON")

    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except UnicodeDecodeError:
        raise HostileFile(f"{what} is not UTF-8") from None
    except RecursionError:
        raise HostileFile(f"{what} nests too deep") from None
    except ValueError as err:  # JSONDecodeError included: trailing bytes are "Extra data"
        raise HostileFile(f"{what} is not well-formed JSON: {str(err).splitlines()[0][:120]}") from None


class Folder:
    """A folder held open by descriptor; every path below it is reached without following a link.

    Open it before any candidate code can write there (the path up to it is the trusted side's own); then
    a candidate that swaps the folder or anything in it for a link changes nothing the harness reads or
    writes outside it. Paths are relative to the folder, or absolute paths under it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path: Path | str) -> Folder:
        path = Path(path)
        try:
            fd = os.open(path, _DIR_FLAGS)
        except OSError as err:
            raise Planted(f"{path.name}: the folder cannot be opened: {_describe(err, str(path))}") from None
        return cls(path, fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- names --------------------------------------------------------------------------------------
    def relative(self, path: str | Path) -> tuple[str, ...]:
        """The components of `path` below this folder (an absolute path must lie under it, lexically)."""
        p = Path(path)
        if p.is_absolute():
            try:
                p = p.relative_to(self.path)
            except ValueError:
                raise HostileFile(f"{p.name} lies outside {self.path.name}") from None
        parts = _parts(PurePosixPath(p))
        if not parts:
            raise HostileFile(f"{path}: names the folder itself, not a file in it")
        return parts

    def _parent(self, parts: tuple[str, ...], create: bool = False) -> int:
        """A new descriptor of the folder holding parts[-1], walked down from this one without links."""
        if self.fd < 0:
            raise HostileFile(f"{self.path.name}: the folder is closed")
        fd = os.dup(self.fd)
        try:
            for i, name in enumerate(parts[:-1]):
                try:
                    nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise Missing(f"{'/'.join(parts[:i + 1])} does not exist") from None
                    try:
                        os.mkdir(name, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                    nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
            return fd
        except OSError as err:
            where = "/".join(parts[:i + 1])
            why = _describe(err, name, fd)
            os.close(fd)
            raise Planted(f"{where} {why}: not a folder the harness made") from None
        except BaseException:
            os.close(fd)
            raise

    def _note(self, op: str, parts: tuple[str, ...]) -> None:
        if observer is not None:
            observer(op, self.path, "/".join(parts))

    # -- reading ------------------------------------------------------------------------------------
    def _open_read(self, path: str | Path) -> tuple[int, str]:
        parts = self.relative(path)
        self._note("read", parts)
        name = "/".join(parts)
        parent = self._parent(parts)
        try:
            return os.open(parts[-1], _READ_FLAGS, dir_fd=parent), name
        except FileNotFoundError:
            raise Missing(f"{name} was not written") from None
        except OSError as err:
            raise Planted(f"{name} cannot be opened ({_describe(err, parts[-1], parent)}): not a plain file") from None
        finally:
            os.close(parent)

    def read_bytes(self, path: str | Path, limit: int) -> bytes:
        """The whole file, at most `limit` bytes (TooLarge before reading anything bigger)."""
        return _whole(*self._open_read(path), limit)

    def read_tail(self, path: str | Path, limit: int) -> bytes:
        """The last `limit` bytes of the file, whatever its size."""
        return _end(*self._open_read(path), limit)

    def read_text(self, path: str | Path, limit: int) -> str:
        return self.read_bytes(path, limit).decode("utf-8", errors="replace")

    def read_json(self, path: str | Path, limit: int) -> Any:
        parts = self.relative(path)
        return strict_json(self.read_bytes(path, limit), "/".join(parts))

    def exists(self, path: str | Path) -> bool:
        """Whether anything at all (a link included) has the name; False where a folder on the way is
        missing. A link or special file on the way is HostileFile."""
        parts = self.relative(path)
        self._note("stat", parts)
        try:
            parent = self._parent(parts)
        except Missing:
            return False
        try:
            os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(parent)

    # -- writing ------------------------------------------------------------------------------------
    def _open_new(self, parts: tuple[str, ...]) -> int:
        name = "/".join(parts)
        parent = self._parent(parts, create=True)
        try:
            return os.open(parts[-1], _NEW_FLAGS, 0o644, dir_fd=parent)
        except FileExistsError as err:
            what = _describe(err, parts[-1], parent)
            raise Planted(f"{name} exists already where the harness writes a new file ({what}): planted") from None
        except OSError as err:
            raise Planted(f"{name} cannot be created ({_describe(err, parts[-1], parent)})") from None
        finally:
            os.close(parent)

    def write_new(self, path: str | Path, data: bytes) -> None:
        """A new file with `data` (folders on the way made where missing); Planted where the name exists."""
        parts = self.relative(path)
        self._note("write", parts)
        fd = self._open_new(parts)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    def copy_new(self, path: str | Path, source: Path) -> None:
        """A new file holding a copy of `source`, a file of the trusted side's own."""
        parts = self.relative(path)
        self._note("write", parts)
        with open(source, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            fd = self._open_new(parts)
            try:
                _copy_fd(src.fileno(), fd, size)
            finally:
                os.close(fd)

    def make_dir(self, path: str | Path, mode: int = 0o755) -> None:
        """A folder at `path`: made (with `mode`, less the umask), or one that exists already as a real folder
        (never a link to one)."""
        parts = self.relative(path)
        self._note("mkdir", parts)
        parent = self._parent(parts, create=True)
        try:
            try:
                os.mkdir(parts[-1], mode, dir_fd=parent)
            except FileExistsError:
                fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=parent)
                os.close(fd)
        except OSError as err:
            raise Planted(f"{'/'.join(parts)} {_describe(err, parts[-1], parent)}: not a folder the harness made"
                          ) from None
        finally:
            os.close(parent)

    def unlink(self, path: str | Path) -> None:
        """Remove the name (a link itself, never what it points to); nothing there is fine. A folder where a
        file was expected is left (the whole scratch goes at the end)."""
        parts = self.relative(path)
        self._note("unlink", parts)
        try:
            parent = self._parent(parts)
        except Missing:
            return
        try:
            os.unlink(parts[-1], dir_fd=parent)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            pass
        except OSError as err:
            if err.errno not in (errno.EISDIR, errno.EPERM, errno.ENOTDIR):
                raise
        finally:
            os.close(parent)

    def sub(self, path: str | Path) -> Folder:
        """A folder below this one, held open by its own descriptor."""
        parts = self.relative(path)
        parent = self._parent(parts)
        try:
            fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            raise Missing(f"{'/'.join(parts)} does not exist") from None
        except OSError as err:
            raise Planted(f"{'/'.join(parts)} {_describe(err, parts[-1], parent)}: not a folder") from None
        finally:
            os.close(parent)
        return Folder(self.path.joinpath(*parts), fd)

    def entries(self) -> list[tuple[str, str]]:
        """(name, kind) of every entry, kind "dir", "file" or "other" (links and special files), read without
        following anything."""
        out = []
        with os.scandir(self.fd) as it:
            for entry in it:
                mode = entry.stat(follow_symlinks=False).st_mode
                kind = "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"
                out.append((entry.name, kind))
        return sorted(out)


def _copy_fd(src: int, dst: int, size: int) -> None:
    done = 0
    while done < size:
        try:
            sent = os.sendfile(dst, src, done, min(1 << 30, size - done))
        except OSError as err:
            if err.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            sent = os.write(dst, os.pread(src, min(CHUNK, size - done), done))
        if sent == 0:
            break
        done += sent


def copy_tree_out(source: Folder, dest: Path, *, max_bytes: int, max_files: int,
                  skip: Callable[[str], bool] | None = None,
                  transform: Callable[[bytes], bytes] | None = None) -> int:
    """Copy the tree under `source` (a folder a candidate could write) to the new folder `dest` (the
    trusted side's): regular files and folders only; a link, FIFO or device anywhere is Planted, more than
    `max_bytes` or `max_files` TooLarge. `skip(name)` leaves entries out by name; `transform` rewrites each
    file's bytes (redaction). Each copy keeps its file's times: ninja's dependency log records every
    object's mtime, and a build folder copied with new times was rebuilt in full by the first call that
    loaded it (58-68 s per PKB candidate, inside the GPU lease: one H200, 2026-12-02). Returns the bytes
    copied."""
    total, files = 0, 0

    def copy(folder: Folder, target: Path, depth: int) -> None:
        nonlocal total, files
        if depth > 32:
            raise Planted(f"{folder.path.name}: folders nest more than 32 deep")
        target.mkdir(mode=0o755)
        for name, kind in folder.entries():
            if skip is not None and skip(name):
                continue
            files += 1
            if files > max_files:
                raise TooLarge(f"{source.path.name} holds more than {max_files} files", files, max_files)
            if kind == "dir":
                with folder.sub(name) as inner:
                    copy(inner, target / name, depth + 1)
            elif kind == "file":
                fd, shown = folder._open_read(name)
                try:
                    size = _regular(fd, shown, max_bytes - total)
                    total += size
                    out = os.open(target / name, _NEW_FLAGS, 0o644)
                    try:
                        if transform is None:
                            _copy_fd(fd, out, size)
                        else:
                            view = memoryview(transform(_read_fd(fd, size)))
                            while view:
                                view = view[os.write(out, view):]
                        times = os.fstat(fd)
                        os.utime(out, ns=(times.st_atime_ns, times.st_mtime_ns))
                    finally:
                        os.close(out)
                finally:
                    os.close(fd)
            else:
                raise Planted(f"{name} in {folder.path.name} is a link or special file: refused")

    copy(source, dest, 0)
    return total


# -- a path whose folders are the trusted side's own (its cache): only the last component is suspect ------
def _open_path(path: Path) -> int:
    try:
        return os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        raise Missing(f"{path.name} does not exist") from None
    except OSError as err:
        raise Planted(f"{path.name} cannot be opened ({_describe(err, str(path))}): not a plain file") from None


def read_bytes(path: Path, limit: int) -> bytes:
    """The whole file at `path` (last component not followed, not blocking, at most `limit` bytes)."""
    return _whole(_open_path(path), path.name, limit)


def read_tail(path: Path, limit: int) -> bytes:
    """The last `limit` bytes of the file at `path`, whatever its size (not followed, not blocking)."""
    return _end(_open_path(path), path.name, limit)


def read_json(path: Path, limit: int) -> Any:
    return strict_json(read_bytes(path, limit), path.name)


def replace_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to a fresh random name beside `path`, then rename it over `path`: whatever stood at
    `path` (a link, a FIFO) is replaced, never written through (harness.common.atomic_write)."""
    replace_atomically(path, data, mode)

# -- a file a user named (a command-line path, a file of a folder given on the command line) ---------------
GIVEN_LIMIT = 8 << 20  # bytes of a file the CLI is pointed at (a candidate's source, a sweep file)


def _kind(mode: int) -> str:
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode) else
            "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a special file")


def _open_given(path: Path, limit: int, inside: Path | None) -> tuple[int, int]:
    """(descriptor, size) of the regular file at `path`; HostileFile naming `path` otherwise. A link the user
    made is followed, but where `inside` is given (the folder the user named) not to anything outside it."""
    if inside is not None:
        real, root = os.path.realpath(path), os.path.realpath(inside)
        if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
            raise Planted(f"{path} is a link out of {inside}: refused")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _O_NOCTTY | _O_CLOEXEC)  # a FIFO never blocks
    except FileNotFoundError:
        raise Missing(f"{path} does not exist") from None
    except OSError as err:
        raise Planted(f"{path} cannot be opened: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Planted(f"{path} is {_kind(info.st_mode)}, not a plain file: refused")
        if info.st_size > limit:
            raise TooLarge(f"{path} holds {info.st_size} bytes, more than the {limit} allowed", info.st_size, limit)
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def read_given(path: Path, limit: int = GIVEN_LIMIT, *, inside: Path | None = None) -> bytes:
    """The whole of a file a user named: a regular file (never a FIFO, device or folder), opened without
    blocking, at most `limit` bytes; with `inside`, not through a link out of that folder. HostileFile, one
    line naming the file, otherwise."""
    fd, size = _open_given(path, limit, inside)
    try:
        return _read_fd(fd, size)
    finally:
        os.close(fd)


def check_given(path: Path, limit: int = GIVEN_LIMIT, *, inside: Path | None = None) -> None:
    """read_given's checks without the read: for files read later by path (a replay set's solutions)."""
    os.close(_open_given(path, limit, inside)[0])
