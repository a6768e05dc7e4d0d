"""The trusted side's store of binding-unit objects: compiled in a fresh sandbox, kept per scope, read by builds.

A load_inline build is two units: `main.cpp` (torch/extension.h, the cpp_sources and the PYBIND11 module:
tens of seconds of host compiler) and the others (`cuda.cu`). Where the other units include no torch header
(kernels and plain launchers), an edit of a kernel body recompiles them in seconds and the binding unit,
which the edit did not change, dominates. harness.compiling.split_build takes it from an object cache; this
module is the only writer of that cache.

Scope: one cache per folder of candidates and problem (`scope_for`): an agent sample's versions live in one
folder, so its edits share objects, and no sample ever reads another's (samples stay independent). The
compile stage binds the scope read-only into the build sandbox at OBJECTS_MOUNT.

`store_bindings`, after a successful, stored native build (the cache entry is the trusted side's copy now),
for each extension folder of the entry:
- its build.ninja is read as hostile (no link, size-capped) and parsed as split_build reads it;
- stored only when every other unit's source includes no torch, ATen, c10 or pybind11 header: only then
  does the binding unit dominate an edit (PKB's recorded files include torch in `cuda.cu`; storing for them
  would cost every replay build a binding compile for nothing; load_inline itself puts torch/types.h atop
  `cuda.cu` unless called with no_implicit_headers=True);
- the key is split_build.unit_key over the SNAPSHOT's bytes, so what is stored is what the key names;
  nothing is compiled when the scope holds the key already;
- the binding command must pass `check_command` word by word (the compiler torch uses here, flags of the
  kinds torch writes, no shell metacharacter), and is run without a shell;
- it is compiled in a fresh bwrap sandbox (no GPU, the harness's cache hidden, memory limits, the build's
  own time limit), in a private folder mounted at the path the candidate's build used (EXT_MOUNT/<name>),
  so the command and the key are identical. No candidate code runs there, but the source is hostile: it
  could #include a file of the harness, which the sandbox hides;
- the object and its depfile are read back as hostile (bounded, no link); the object is stored only when
  the depfile names nothing but the source (torch's headers come in through -isystem, which -MMD leaves
  out; a header the key could not name is never trusted).
Without a bwrap sandbox nothing is stored (and the compile stage mounts no cache at all: an unsandboxed
candidate could write the folder).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from harness.common.hostile_files import Folder, HostileFile
from harness.common.paths import REPO_ROOT
from harness.compiling import split_build
from harness.compiling.build_cache import OBJECT_CAP, ObjectCache
from harness.launch.pool import worker_env
from harness.launch.priority import niced, set_session_niceness
from harness.launch.sandbox import EXT_MOUNT, SandboxPolicy, clean_environment
from harness.launch.sandbox.limits import SandboxLimits
from harness.launch.sandbox.memory import MemoryCgroup
from harness.launch.sandbox.policy import SANDBOX_UID, SandboxInfo
from harness.launch.sandbox.private import hand_over, private_folder, remove_private
from harness.records.cache_dir import cache_root

OBJECTS_MOUNT = "/.pkb-objects"  # where a build sandbox sees its scope (read-only)
SCOPES = "binding-objects"  # the scopes' folder under the harness's cache
NINJA_CAP = 1 << 20  # bytes of a build.ninja read
SOURCE_CAP = 64 << 20  # bytes of one unit's source read
DEPFILE_CAP = 1 << 20
ERROR_KEPT = 2000  # characters of the compiler's output kept when the store's compile fails
TORCH_HEADER = re.compile(rb"^[ \t]*#[ \t]*include[ \t]*[<\"](torch/|ATen/|c10/|pybind11)", re.MULTILINE)
# Shell metacharacters: none may appear in a binding command (the escaped quote of a -D value aside, which
# older torch writes: -DPYBIND11_COMPILER_TYPE=\"_gcc\").
_META = re.compile(r"[;&|$`<>(){}\[\]*?~!#'\"\\\n\r]")
_DEFINE = re.compile(r'^-D[A-Za-z_]\w*(=(\\"[\w.+-]*\\"|[\w.+,/:=-]*))?$')
_PATH = re.compile(r"^/[\w./+-]*$")
_SIMPLE = re.compile(r"^(-O[0-3sgz]?|-std=[\w+]+|-fPIC|-g[0-3]?|-W(?![pal],)[\w=+-]*|-f(no-)?[a-z0-9][\w+-]*"
                     r"(=[\w.,+-]*)?)$")
# Runs the compiler in the build folder, without a shell (the command's relative paths are the folder's).
_IN_FOLDER = "import os, sys; os.chdir(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"


def scope_for(candidate: Path, problem: str | None) -> Path:
    """The object cache of `candidate`'s folder and problem: every version of one agent sample shares it."""
    text = str(candidate.parent.resolve()) + "\0" + (problem or "")
    return cache_root() / SCOPES / hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass
class Stored:
    """What the store did for one extension folder: "stored", "present" (the scope had it), "skipped"
    (nothing to store, `reason` says why) or "failed" (the compile or its checks); seconds it took."""

    extension: str
    binding_store: str
    reason: str = ""
    binding_stored_s: float = 0.0


def check_command(command: str, unit: split_build.Unit, build_directory: PurePosixPath) -> list[str] | str:
    """The binding command's argv when every word is one torch writes; else why not (a refusal)."""
    if _META.search(command.replace('\\"', "")):
        return "a shell metacharacter"
    words = command.split()
    from torch.utils import cpp_extension

    if not words or words[0] != cpp_extension.get_cxx_compiler():
        return f"the compiler {words[0] if words else ''!r} is not torch's"
    expected = {"-MF": f"{unit.output}.d", "-c": str(build_directory / split_build.BINDING_SOURCE),
                "-o": unit.output}
    seen: set[str] = set()
    i = 1
    while i < len(words):
        word = words[i]
        if word in expected or word == "-isystem":
            if i + 1 >= len(words) or word in seen:
                return f"{word} twice or without its argument"
            value = words[i + 1]
            if word == "-isystem" and not _PATH.match(value):
                return f"-isystem {value!r}"
            if word != "-isystem" and value != expected[word]:
                return f"{word} {value!r}"
            seen |= {word} - {"-isystem"}
            i += 2
            continue
        if not (word == "-MMD" or _DEFINE.match(word) or (_SIMPLE.match(word) and "plugin" not in word) or
                (word.startswith("-I") and _PATH.match(word[2:]))):
            return f"the flag {word!r}"
        i += 1
    if seen != set(expected):
        return "no -MF, -c or -o"
    return [w.replace('\\"', '"') for w in words]


def _torch_free(ext: Folder, built: split_build.Plan, binding: split_build.Unit, where: PurePosixPath) -> str:
    """Why the other units do not qualify ('' when each lies in the build folder and includes no torch)."""
    for unit in built.units:
        if unit is binding:
            continue
        source = PurePosixPath(unit.source)
        if source.parent != where:
            return f"{source.name} is not in the build folder"
        if TORCH_HEADER.search(ext.read_bytes(source.name, SOURCE_CAP)):
            return f"{source.name} includes torch headers: the binding unit is not what an edit waits for"
    return ""


def store_bindings(entry: Path, scope: Path, timeout: float, limits: SandboxLimits | None,
                   sandbox: SandboxInfo, niceness: int = 0) -> list[Stored]:
    """For each extension folder of the stored cache entry `entry`, the binding object compiled and kept in
    `scope` where it qualifies (the module's docstring); one Stored per folder with a build.ninja. Its
    compiles run at `niceness`, as the compile stage's builds do."""
    out: list[Stored] = []
    if sandbox.backend != "bwrap":
        return out
    with Folder.open(entry) as snapshot:
        for name, kind in snapshot.entries():
            if kind != "dir" or name.startswith("."):
                continue
            started = time.perf_counter()
            try:
                with snapshot.sub(name) as ext:
                    if not ext.exists("build.ninja"):
                        continue
                    status, reason = _store_one(ext, name, ObjectCache(scope), timeout, limits, sandbox, niceness)
            except (HostileFile, OSError, split_build.SplitUnavailable) as err:
                status, reason = "skipped", f"{type(err).__name__}: {err}"[:300]
            out.append(Stored(name, status, reason, round(time.perf_counter() - started, 3)))
    return out


def _store_one(ext: Folder, name: str, cache: ObjectCache, timeout: float, limits: SandboxLimits | None,
               sandbox: SandboxInfo, niceness: int) -> tuple[str, str]:
    built = split_build.parse(ext.read_text("build.ninja", NINJA_CAP))
    binding = next((u for u in built.units if u.rule == "compile" and
                    PurePosixPath(u.source).name == split_build.BINDING_SOURCE), None)
    if binding is None:
        return "skipped", "no binding unit"
    where = PurePosixPath(EXT_MOUNT) / name  # where the candidate's build ran: the command names it
    if PurePosixPath(binding.source) != where / split_build.BINDING_SOURCE:
        return "skipped", "the binding unit is not in the build folder"
    why = _torch_free(ext, built, binding, where)
    if why:
        return "skipped", why
    source = ext.read_bytes(split_build.BINDING_SOURCE, SOURCE_CAP)
    key = split_build.unit_key(binding, Path(where), source)
    if key is None:
        return "skipped", "the compiler's version cannot be read"
    if cache.lookup(key) is not None:
        return "present", ""
    argv = check_command(binding.command, binding, where)
    if isinstance(argv, str):
        return "failed", f"the binding command was refused: {argv}"
    obj = _compile(argv, name, binding.output, source, timeout, limits, sandbox, niceness)
    if isinstance(obj, str):
        return "failed", obj
    folder = private_folder("pkb-binding-keep-")
    try:
        kept = folder / "main.o"
        kept.write_bytes(obj)
        return ("stored", "") if cache.store(key, kept, {}) else ("failed", "the cache did not keep it")
    finally:
        remove_private(folder)


def _depfile_names_only(depfile: bytes, output: str, source: str) -> bool:
    """Whether a make-style depfile says `output` was built from `source` and nothing else."""
    text = depfile.decode("utf-8", errors="replace").replace("\\\n", " ")
    target, colon, body = text.partition(":")
    return bool(colon) and target.strip() == output and body.split() == [source]


def _compile(argv: list[str], name: str, output: str, source: bytes, timeout: float, limits: SandboxLimits | None,
             sandbox: SandboxInfo, niceness: int) -> bytes | str:
    """The binding unit's object (`output`), compiled in a fresh sandbox and checked by its depfile, or why not."""
    folder = private_folder("pkb-binding-")
    cgroup: MemoryCgroup | None = None
    try:
        scratch, ext = folder / "scratch", folder / "ext"
        for made in (scratch, scratch / "tmp", scratch / "home", scratch / "cache", ext, ext / name):
            made.mkdir(mode=0o755)
        (ext / name / split_build.BINDING_SOURCE).write_bytes(source)
        if sandbox.host_uid_switch:
            hand_over(scratch, SANDBOX_UID)
            hand_over(ext, SANDBOX_UID)
        limits = limits or SandboxLimits.for_ranks(1)
        policy = SandboxPolicy(scratch=scratch, extensions=ext, hide=(cache_root(),), gpus=False, limits=limits,
                               info=sandbox)
        where = f"{EXT_MOUNT}/{name}"
        command = policy.bwrap_command([sys.executable, "-I", "-S", "-c", _IN_FOLDER, where, *argv], REPO_ROOT)
        cgroup = MemoryCgroup.create(folder.name, limits.memory_bytes)
        if cgroup is not None:
            command = cgroup.join_command(command)
        command = niced(command, niceness)
        env = clean_environment(worker_env("cpu"), scratch)
        log = folder / "compiler.log"
        with Folder.open(ext) as held, open(log, "wb") as out:  # held before it runs: no planted link is followed
            proc = subprocess.Popen(command, cwd=str(REPO_ROOT), env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            set_session_niceness(proc.pid, niceness)
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            with contextlib.suppress(ProcessLookupError, PermissionError):  # whatever is left of its session
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if code is None:
                return f"the binding unit did not compile within {timeout:.0f} s"
            if code != 0:
                with Folder.open(folder) as ours:
                    text = ours.read_tail("compiler.log", ERROR_KEPT).decode(errors="replace")
                return f"the binding unit did not compile (exit {code}): {text}"
            with held.sub(name) as built:
                obj = built.read_bytes(output, OBJECT_CAP)
                depfile = built.read_bytes(f"{output}.d", DEPFILE_CAP)
        if not _depfile_names_only(depfile, output, f"{where}/{split_build.BINDING_SOURCE}"):
            return "the binding unit read headers besides torch's (-isystem): its key cannot name them"
        return obj
    except HostileFile as err:
        return f"the binding unit's output was refused: {err}"
    finally:
        if cgroup is not None:
            cgroup.remove()
        remove_private(folder)


def as_records(stored: list[Stored]) -> dict[str, dict[str, object]]:
    """extension folder -> its store result, for the build records."""
    return {s.extension: {"binding_store": s.binding_store, **({"reason": s.reason} if s.reason else {}),
                          "binding_stored_s": s.binding_stored_s} for s in stored}
