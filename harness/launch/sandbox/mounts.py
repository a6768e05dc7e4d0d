"""What a sandbox's filesystem holds, built from facts about this process rather than by binding `/` whole.

Bound read-only: the system's programs and libraries (/usr and the /bin, /sbin, /lib* that point into it or
stand beside it; the GPU driver's libraries live there), the pieces of /etc that programs and the dynamic
loader read (no /etc/shadow, nothing with a secret), /sys (CPU and PCI topology for torch and NCCL), the
interpreter's prefixes and every folder on sys.path, PYTHONPATH and LD_LIBRARY_PATH, the checkout (its
`runs/` folder masked), and what the caller names (a problem's file or a PKB checkout, the candidate's
read-only copy). Writable: the scratch and the extension folder. Fresh and size-limited: /tmp and
/dev/shm. A minimal /dev (GPU nodes added on CUDA) and the sandbox's own /proc.

Never bound: the home folder or any of its ancestors, the harness's cache, TMPDIR and the private root
(harness.launch.sandbox.private) with every evaluation's folders. A code folder that is one of these is refused
(and recorded); one that contains one of them is bound with that path masked by an empty tmpfs.
Folders bwrap creates on the way to a mount point get mode 0755, so a rank running as another uid can walk
to what is bound there (bubblewrap makes them 0700 otherwise).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harness.launch.sandbox.private import ROOT_PREFIX

SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs read from /etc: the dynamic loader's cache, user and host names, time zone, the compilers'
# alternatives (Debian's c++ -> /etc/alternatives/c++), TLS certificates. Nothing that holds a secret.
ETC_ENTRIES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "hosts",
               "host.conf", "gai.conf", "hostname", "localtime", "timezone", "alternatives", "ssl",
               "ca-certificates", "pki", "os-release", "debian_version", "protocols", "services", "mime.types")
CHECKOUT_DATA = ("runs",)  # folders of the checkout that hold other evaluations' records, not code
GPU_NODES = ("/dev/nvidia*", "/dev/nvidia-caps/*")


@dataclass(frozen=True)
class Mount:
    kind: str  # "ro" | "rw" | "dev" | "tmpfs" | "symlink"
    dest: str
    source: str = ""
    size: int | None = None  # tmpfs only

    def args(self, sizes: bool, perms: bool) -> list[str]:
        if self.kind == "tmpfs":
            # /tmp and /dev/shm are every process's, whatever its uid (sticky, like the host's).
            mode = ["--perms", "1777"] if perms and self.dest in ("/tmp", "/dev/shm") else []
            return [*mode, *(["--size", str(self.size)] if self.size and sizes else []), "--tmpfs", self.dest]
        if self.kind == "symlink":
            return ["--symlink", self.source, self.dest]
        flag = {"ro": "--ro-bind", "rw": "--bind", "dev": "--dev-bind"}[self.kind]
        return [flag, self.source, self.dest]


@dataclass
class Layout:
    """The mounts of one sandbox in order, and what was refused or masked (for the record)."""

    mounts: list[Mount] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    masked: list[str] = field(default_factory=list)

    def record(self) -> dict[str, object]:
        by_kind: dict[str, list[str]] = {}
        for m in self.mounts:
            if m.kind in ("ro", "rw", "dev"):
                by_kind.setdefault({"ro": "read_only", "rw": "writable", "dev": "devices"}[m.kind], []).append(
                    m.dest if m.source == m.dest else f"{m.source} -> {m.dest}")
        out: dict[str, object] = dict(by_kind)
        out["tmpfs"] = {m.dest: m.size for m in self.mounts if m.kind == "tmpfs" and m.dest not in self.masked}
        if self.masked:
            out["masked"] = list(self.masked)
        if self.refused:
            out["refused"] = list(self.refused)
        return out


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


# The build toolchain's environment: a compiler named by path, and the folders compilers and linkers search.
# Kept in a sandbox's environment (policy.clean_environment) and bound into it (toolchain_folders).
COMPILER_VARS = ("CC", "CXX", "CUDAHOSTCXX", "NVCC_CCBIN")
SEARCH_PATH_VARS = ("LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "COMPILER_PATH")
TOOLCHAIN_VARS = (*COMPILER_VARS, *SEARCH_PATH_VARS, "GCC_EXEC_PREFIX")


def _install_prefix(folder: Path) -> Path:
    """The prefix a program folder was installed under: /opt/gcc for /opt/gcc/bin (its libexec, lib and
    include folders sit beside bin), the folder itself otherwise."""
    return folder.parent if folder.name == "bin" and folder.parent != Path("/") else folder


def toolchain_folders(env: dict[str, str]) -> list[Path]:
    """What a native build needs besides /usr: the install prefix of each compiler the environment names and of
    each program folder on PATH (a compiler found there needs its prefix's lib and libexec), and the folders
    on the compilers' and linker's search paths. Nothing under the home folder: a user's own tools are not
    the machine's toolchain, and ~/.cargo or ~/.local hold credentials beside their programs."""
    found: list[Path] = []
    for var in COMPILER_VARS:
        named = env.get(var, "").split()  # CC may carry flags ("gcc -m64"): the program is the first word
        program = shutil.which(named[0], path=env.get("PATH")) if named else None
        if program:
            found.append(_install_prefix(Path(os.path.realpath(program)).parent))
    for folder in env.get("PATH", "").split(os.pathsep):
        if folder and os.path.isabs(folder):
            found.append(_install_prefix(Path(folder)))
    for var in SEARCH_PATH_VARS:
        found += [Path(p) for p in env.get(var, "").split(os.pathsep) if p]
    home = Path(os.path.expanduser("~")).resolve()
    return [f for f in found if f.is_absolute() and not _under(f.resolve(), home)]


def code_folders(cwd: Path) -> list[Path]:
    """What the sandbox's processes need to run, import and build: the checkout (`cwd`), the interpreter's
    prefixes, the folders on sys.path, PYTHONPATH and LD_LIBRARY_PATH, and the build toolchain's."""
    found = [cwd, Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.base_exec_prefix),
             Path(os.path.realpath(sys.executable)).parent, *(Path(p) for p in sys.path if p)]
    for var in ("PYTHONPATH", "LD_LIBRARY_PATH"):
        found += [Path(p) for p in os.environ.get(var, "").split(os.pathsep) if p]
    found += toolchain_folders(dict(os.environ))
    return list(dict.fromkeys(p for p in found if p.is_absolute()))


SHARED_TEMP = ("/tmp", "/var/tmp", "/dev/shm")  # every user's temporary files; other evaluations' by default


def protected_paths(hide: Iterable[Path]) -> list[Path]:
    """Paths no sandbox may see besides the home folder: the machine's shared temporary folders, TMPDIR and
    the private root (other evaluations' folders), and the caller's `hide` (the harness's cache)."""
    tmp = Path(tempfile.gettempdir())
    return [*(Path(t) for t in SHARED_TEMP), tmp, tmp / f"{ROOT_PREFIX}{os.geteuid()}", *hide]


def system_mounts(gpus: bool) -> list[Mount]:
    out = []
    for top in SYSTEM_FOLDERS:
        if os.path.islink(top):
            out.append(Mount("symlink", top, os.readlink(top)))
        elif os.path.isdir(top):
            out.append(Mount("ro", top, top))
    for name in ETC_ENTRIES:
        path = f"/etc/{name}"
        if os.path.lexists(path):
            out.append(Mount("ro", path, path))
    if os.path.isdir("/sys"):
        out.append(Mount("ro", "/sys", "/sys"))
    if gpus:
        for node in sorted({n for pattern in GPU_NODES for n in glob.glob(pattern)}):
            if os.path.exists(node) and not os.path.isdir(node):
                out.append(Mount("dev", node, node))
    return out


def plan(*, cwd: Path, visible: Iterable[Path], hide: Iterable[Path], scratch: Path | None,
         extensions: Path | None, ext_mount: str, gpus: bool, tmp_bytes: int | None,
         shm_bytes: int | None, read_only: Iterable[tuple[Path, str]] = ()) -> Layout:
    """The mounts of a sandbox whose processes start in `cwd` (the checkout), see `visible` read-only
    (files or folders: a problem, the candidate's copy) and write `scratch` and `extensions`. `read_only`:
    (host folder, path inside) pairs bound read-only at a path of their own, last: a folder of the harness's
    cache the sandbox may read but not find by its host path (the binding objects of a candidate's scope)."""
    layout = Layout()
    home = Path(os.path.expanduser("~")).resolve()
    protected = [p.resolve() for p in protected_paths(hide)]
    system = [Path(t) for t in SYSTEM_FOLDERS if os.path.exists(t)]
    # /tmp and /dev/shm first: code folders that lie under them are bound on top of the fresh ones.
    layout.mounts += [Mount("tmpfs", "/tmp", size=tmp_bytes), Mount("tmpfs", "/dev/shm", size=shm_bytes)]
    layout.mounts += system_mounts(gpus)
    chosen: list[Path] = []
    for folder in code_folders(cwd):
        real = folder.resolve()
        if not real.exists() or any(_under(real, s.resolve()) or _under(folder, s) for s in system):
            continue  # missing, or inside /usr and the like, bound already
        if real == Path("/") or _under(home, real) or real in protected:
            layout.refused.append(str(folder))  # binding it would show the home folder, TMPDIR or a cache
            continue
        chosen.append(folder)
    chosen = sorted(set(chosen), key=lambda p: (len(p.parts), str(p)))
    kept: list[Path] = []
    for folder in chosen:
        if not any(_under(folder, k) for k in kept):
            kept.append(folder)
    layout.mounts += [Mount("ro", str(k), str(k)) for k in kept]
    masks = [p for p in protected if p.exists() and any(_under(p, k.resolve()) for k in kept)]
    masks += [cwd / d for d in CHECKOUT_DATA if (cwd / d).is_dir() and any(_under(cwd, k) for k in kept)]
    for mask in sorted(set(masks), key=lambda p: len(p.parts)):
        if any(_under(mask, Path(m)) for m in layout.masked):
            continue  # inside a mask already
        layout.mounts.append(Mount("tmpfs", str(mask), size=1 << 20))
        layout.masked.append(str(mask))
    for path in visible:
        real = path.resolve()
        if not real.exists():
            continue
        if real == Path("/") or _under(home, real) or real in protected:
            layout.refused.append(str(path))
            continue
        if any(_under(real, k.resolve()) for k in kept) and not any(_under(real, Path(m)) for m in layout.masked):
            continue  # inside the checkout or another code folder: visible already
        layout.mounts.append(Mount("ro", str(path.absolute()), str(real)))  # at the path the ranks are told
    if scratch is not None:
        layout.mounts.append(Mount("rw", str(scratch), str(scratch)))
    if extensions is not None:
        layout.mounts.append(Mount("rw", ext_mount, str(extensions)))
    layout.mounts += [Mount("ro", inside, str(host)) for host, inside in read_only]
    return layout


def bwrap_args(layout: Layout, *, perms: bool, sizes: bool) -> list[str]:
    """bubblewrap's arguments for `layout`: a fresh /dev and /proc, then every mount in order, each
    preceded by the folders on its way that nothing bound yet (mode 0755 where `perms`)."""
    args = ["--dev", "/dev", "--proc", "/proc"]
    made: set[str] = {"/", "/dev", "/proc"}
    mounted: list[Mount] = []
    for m in layout.mounts:
        for parent in reversed(Path(m.dest).parents):
            p = str(parent)
            below = [b for b in mounted if _under(parent, Path(b.dest))]
            if p in made or (below and below[-1].kind != "tmpfs" and below[-1].source == below[-1].dest):
                continue  # made already, or a folder of a host folder bound at its own path
            args += (["--perms", "0755"] if perms else []) + ["--dir", p]
            made.add(p)
        args += m.args(sizes, perms)
        made.add(m.dest)
        if m.kind != "symlink":
            mounted.append(m)
    return args
