"""Step 1 of the protocol: compile the candidate before any GPU waits on it.

Python syntax is checked in-process (compile() executes nothing). A candidate that builds native code
(torch.utils.cpp_extension.load_inline or load, PKB's compile_cuda_extension helper, NVRTC, CuPy) is
imported once, inside a sandbox of its own (harness.launch.sandbox) with a time limit; harness.compiling.precompile also
runs the builds it finds inside functions (PKB's solutions build lazily in `solution()`). The build
lands in the sandbox's extension folder, which the harness then moves into its cache under the hash of
the candidate's source: only the trusted side writes the cache, and a candidate's build is only ever
used by the same source. A rank sandbox gets a private copy of that entry, mounted at the same path
the build used, so torch finds the build complete and loads it instead of compiling while the peers
wait. A build that overruns its limit is stopped whole: the sandbox dies with everything in it.

Without a sandbox (harness.launch.sandbox falls back to "none", and says so) the build runs in a session of
its own with the same allow-listed environment, into the same throwaway build folder.

Binding units (docs/performance.md, "Edit → built"): the precompile builds load_inline extensions split
(harness.compiling.split_build), the binding unit's object from the scope of this candidate's folder
(harness.compiling.binding_store.scope_for), bound read-only into the build sandbox at OBJECTS_MOUNT. After a
stored build, binding_store compiles and keeps the binding objects that qualify, in a sandbox of its own:
only this trusted process writes the scope. Without a bwrap sandbox no object cache is used at all: the
candidate would run as the harness's user, and could write the folder. The split build's marks in each build
entry (`binding_cache`, `split_seconds`) come from the candidate's process: informational, never a verdict.

Fail closed: only a build the helper reported as a success (its result, on a channel of its own with a
per-evaluation nonce that candidate code never holds, parsed strictly) with exit code 0 is a success, and
only a success is cached; a helper that crashed, was killed, printed more than HELPER_OUTPUT_CAP or
reported nothing is the candidate's compile_error (its code ran there). The build
folder is candidate-written: it is copied into the cache file by file through harness.common.hostile_files (no
link, no special file, within BUILD_BYTES_LIMIT). Paths handed to the helper are absolute.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import cancel
from harness.common import channel, failures
from harness.common.hostile_files import Folder, HostileFile, copy_tree_out, read_json, replace_file, strict_json
from harness.common.paths import REPO_ROOT
from harness.compiling import binding_store
from harness.compiling.builds import may_build
from harness.compiling.precompile import (
    BUILD_FAILED_STATUS,
    IMPORT_FAILED_STATUS,
    NONCE_BYTES,
    RESULT_CAP,
    RESULT_MARKER,
    STATUS_EXIT,
)
from harness.compiling.slots import BuildSlots
from harness.compiling.source_text import SourceEncodingError, source_text
from harness.launch.pool import worker_env
from harness.launch.priority import niced, set_session_niceness
from harness.launch.sandbox import EXT_MOUNT, SandboxPolicy, SandboxUnavailable, clean_environment, probe
from harness.launch.sandbox.limits import SandboxLimits
from harness.launch.sandbox.memory import MemoryCgroup
from harness.launch.sandbox.namespace import pid_namespace_members, sandbox_init
from harness.launch.sandbox.policy import SANDBOX_UID, SandboxInfo
from harness.launch.sandbox.private import hand_over, private_folder, remove_private, stage_file
from harness.launch.sandbox.watch import SandboxWatch
from harness.records.cache_dir import cache_root

MAX_ERROR_CHARS = 3000
DONE = ".pkb-build-done"  # written into a cache entry once it is complete
HIT, MISS = "hit", "miss"  # a build's "cache" mark in the result's integrity.builds
HELPER_OUTPUT_CAP = 64 << 20  # bytes a build helper (candidate code included) may print
REPORT_CAP = RESULT_CAP + 256  # the helper's report: its child's result, the marker and the nonce
HELPER_OUTPUT_KEPT = 256 << 10  # of which the tail is kept: the compiler's errors and the helper's result
BUILD_BYTES_LIMIT = 4 << 30  # bytes of one build folder the cache takes (a CUDA extension is tens of MB)
BUILD_FILES_LIMIT = 20000
# At most one native build per core at once in this process; the others queue before their clock starts. A
# build's limit is wall time, so builds beyond the cores would slow each other into compile_errors that only
# the run's --concurrency caused (one H200 node, 16 cores: 14 PKB builds at once took 80.5 s median, 145 s
# at most, against compile_s = 180 s; 58-64 s alone). Even within the cores they slow each other: a build that
# overran its limit beside others is built again alone (harness.compiling.slots).
BUILD_SLOTS = BuildSlots(max(1, len(os.sched_getaffinity(0))))
# Builds run this much nicer than the harness (harness.launch.priority: the processes and their sessions): on a
# GPU node they share the cores with evaluations that hold a device, whose ranks (and a timed candidate's host
# side) should get the CPU first. Fourteen builds at once on the 16-core H200 node loaded it to 23 while the
# GPU lease was the bottleneck (2026-12-02).
BUILD_NICENESS = 10


def extensions_dir() -> Path:
    """Where built extensions persist across runs: one entry per candidate source hash."""
    path = cache_root() / "torch_extensions"
    path.mkdir(parents=True, exist_ok=True)
    return path


def entry_for(source: bytes, problem: str | None) -> Path:
    key = hashlib.sha256(source + b"\0" + (problem or "").encode()).hexdigest()[:24]
    return extensions_dir() / key


@dataclass
class CompileOutcome:
    ok: bool
    seconds: float
    verdict: str = failures.CORRECT
    message: str = ""
    evidence: str = ""
    native: bool = False
    extensions: Path | None = None  # the cache entry holding this candidate's builds
    builds: list[dict[str, Any]] = field(default_factory=list)  # what precompile built, with seconds
    cached: bool = False
    # What stopping a build that overran its limit took: processes killed, build locks removed.
    cleanup: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False
    # A build that overran its limit beside other builds, then built alone: how the first try ended.
    built_again_alone: dict[str, Any] = field(default_factory=dict)


def trim_compiler_output(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Keep the compiler's own error lines (and their context) rather than the wrapper's noise."""
    lines = text.splitlines()
    keep = [i for i, line in enumerate(lines) if "error" in line.lower() or "Error" in line]
    if keep:
        picked: list[str] = []
        for i in keep[:20]:
            for j in range(max(0, i - 1), min(len(lines), i + 3)):
                if lines[j] not in picked[-4:]:
                    picked.append(lines[j])
        text = "\n".join(picked)
    return text[-limit:]


def check_syntax(source: str, filename: str) -> CompileOutcome:
    started = time.perf_counter()
    try:
        compile(source, filename, "exec")
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        text = (exc.text or "").rstrip()
        return CompileOutcome(False, time.perf_counter() - started, failures.COMPILE_ERROR,
                              f"SyntaxError at {where}: {exc.msg}", text)
    return CompileOutcome(True, time.perf_counter() - started)


@dataclass
class HelperOutput:
    """What a helper process printed (its last `keep` bytes), how much, and how it ended."""

    tail: bytes
    total: int
    timed_out: bool = False
    over_cap: bool = False


def read_bounded(proc: subprocess.Popen[bytes], timeout: float, cap: int | None = None,
                 keep: int = HELPER_OUTPUT_KEPT) -> HelperOutput:
    """Read a helper's stdout until it closes and the helper exits, keeping the tail: never more than `keep`
    bytes in memory however much candidate code prints. Stops (leaving the helper running, for the caller
    to end) at `timeout` seconds or past `cap` bytes."""
    assert proc.stdout is not None
    cap = HELPER_OUTPUT_CAP if cap is None else cap
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    tail, total = bytearray(), 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return HelperOutput(bytes(tail), total, timed_out=True)
        ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        total += len(chunk)
        tail += chunk
        if len(tail) > keep:
            del tail[:len(tail) - keep]
        if total > cap:
            return HelperOutput(bytes(tail), total, over_cap=True)
    try:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return HelperOutput(bytes(tail), total, timed_out=True)
    return HelperOutput(bytes(tail), total)


def parse_report(text: str, nonce: str | None = None) -> dict[str, Any] | None:
    """harness.compiling.precompile's result, parsed strictly: `RESULT_MARKER`, then (from the private channel,
    `nonce` given) the nonce and a space, then a JSON object with a known status and a list of builds. With
    `nonce`, `text` is the whole channel and must be that one line; without (the helper run by hand), the
    last non-empty line of its output. None for anything else (the helper crashed, was killed, the nonce is
    wrong, something came after it)."""
    if nonce is not None:
        prefix = f"{RESULT_MARKER}{nonce} "
        if not text.endswith("\n") or text.count("\n") != 1 or not text.startswith(prefix):
            return None
        payload = text[len(prefix):-1]
    else:
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines or not lines[-1].startswith(RESULT_MARKER):
            return None
        payload = lines[-1][len(RESULT_MARKER):]
    try:
        report = strict_json(payload, "the build helper's result")
    except HostileFile:
        return None
    if not isinstance(report, dict) or report.get("status") not in STATUS_EXIT:
        return None
    builds = report.get("builds")
    if not isinstance(builds, list) or not all(isinstance(b, dict) for b in builds):
        return None
    return report


def read_channel(sock: socket.socket, cap: int = REPORT_CAP) -> str:
    """What the helper wrote on its report channel, read once it has exited: without waiting (a process
    still holding the other end cannot stall the harness), at most `cap` bytes (more is nothing)."""
    sock.setblocking(False)
    data = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            break
        if not chunk:
            break
        data += chunk
        if len(data) > cap:
            return ""
    return data.decode("utf-8", errors="replace")


def _helper_ended(code: int | None) -> str:
    return f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"


def compile_candidate(path: Path, timeout: float, device: str, *, problem: str | None = None,
                      limits: SandboxLimits | None = None) -> CompileOutcome:
    """Syntax, then (for a candidate that builds native code) one sandboxed import with its builds.
    `problem`: the problem's loader spec, loaded there first (a PKB checkout's solutions import its
    `utils` at import time, and only loading the problem makes that package importable). `limits`: the
    sandbox's (default: the integrity settings' defaults for one rank).

    Fail closed: the build counts as done only when harness.compiling.precompile reported success (its result line,
    parsed strictly) and exited 0; only then is it cached. A helper that crashed, was killed, printed
    too much or reported nothing is the candidate's compile_error (its code ran in that process)."""
    path = Path(path).resolve()  # the helper runs in the checkout: a relative path would name another file
    raw = path.read_bytes()
    try:
        source = source_text(raw)  # what Python runs: a declared encoding other than UTF-8 is refused
    except SourceEncodingError as err:
        return CompileOutcome(False, 0.0, failures.COMPILE_ERROR, str(err))
    outcome = check_syntax(source, str(path))
    if not outcome.ok or not may_build(source):
        return outcome
    entry = entry_for(raw, problem)
    cached = cached_builds(entry)
    if cached is not None:
        return CompileOutcome(True, 0.0, native=True, extensions=entry, cached=True, builds=with_cache(cached, HIT))
    with BUILD_SLOTS.shared() as hold:
        cached = cached_builds(entry)  # another evaluation may have built it while this one waited
        if cached is not None:
            return CompileOutcome(True, 0.0, native=True, extensions=entry, cached=True,
                                  builds=with_cache(cached, HIT))
        outcome = _build_failing_closed(path, raw, entry, timeout, device, problem, limits)
    if not (outcome.timed_out and hold.beside):
        return outcome
    # Builds beside it may have slowed it past its limit (a wall-time limit): the verdict that counts is the
    # one it earns alone. A build that hangs costs two limits, never a wrong verdict.
    first = {"seconds": round(outcome.seconds, 3), "beside": hold.beside, "message": outcome.message}
    with BUILD_SLOTS.alone():
        again = _build_failing_closed(path, raw, entry, timeout, device, problem, limits)
    again.built_again_alone = first
    again.seconds += outcome.seconds  # the compile stage took both
    if not again.ok:
        again.message += f" (alone; it had also overrun its limit beside {hold.beside} other build(s))"
    return again


def _build_failing_closed(path: Path, raw: bytes, entry: Path, timeout: float, device: str, problem: str | None,
                          limits: SandboxLimits | None) -> CompileOutcome:
    started = time.perf_counter()
    try:
        return _build(path, raw, entry, timeout, device, problem, limits)
    except SandboxUnavailable:  # PKB_SANDBOX=require on a machine without one: nobody's failure (infra_error)
        raise
    except Exception as exc:  # noqa: BLE001 - the candidate's build was being handled: fail closed, never raise
        return CompileOutcome(False, time.perf_counter() - started, failures.COMPILE_ERROR,
                              f"the build could not be completed: {type(exc).__name__}: {exc}"[:600], native=True)


def _build(path: Path, raw: bytes, entry: Path, timeout: float, device: str, problem: str | None,
           limits: SandboxLimits | None) -> CompileOutcome:
    """The native part of compile_candidate: one helper run in its sandbox, its result, the cache."""
    started, started_wall = time.perf_counter(), time.time()
    sandbox = probe()
    scope = binding_store.scope_for(path, problem)
    # Under the private root: the sandbox sees the candidate's copy (read-only), its scratch and the build
    # folder, never the candidate's own folder (harness.launch.sandbox.private).
    folder = private_folder("pkb-build-")
    cgroup: MemoryCgroup | None = None
    watch: SandboxWatch | None = None
    ours: socket.socket | None = None
    try:
        code = stage_file(raw, path.name, folder / "code")
        scratch, build = folder / "scratch", folder / "ext"
        for made in (scratch, scratch / "tmp", scratch / "home", scratch / "cache", build):
            made.mkdir(mode=0o700)
        # The helper's report comes on a channel of its own, with a nonce: its stdout is the candidate's log.
        ours, theirs = socket.socketpair()
        nonce = secrets.token_bytes(NONCE_BYTES)
        ours.sendall(nonce)
        command = [sys.executable, "-m", "harness.compiling.precompile", str(code), "--report-fd",
                   str(theirs.fileno()), *(["--problem", problem] if problem else [])]
        limits = limits or SandboxLimits.for_ranks(1)
        if sandbox.backend == "bwrap":
            if sandbox.host_uid_switch:
                hand_over(scratch, SANDBOX_UID)
                hand_over(build, SANDBOX_UID)
            env = clean_environment(worker_env(device, {"TORCH_EXTENSIONS_DIR": EXT_MOUNT}), scratch)
            scope.mkdir(parents=True, exist_ok=True)
            command += ["--object-cache", binding_store.OBJECTS_MOUNT]
            policy = SandboxPolicy(scratch=scratch, extensions=build, hide=(cache_root(),), gpus=device == "cuda",
                                   visible=visible_for(code, problem), limits=limits, info=sandbox,
                                   read_only=((scope, binding_store.OBJECTS_MOUNT),))
            command = policy.bwrap_command(command, REPO_ROOT)
            cgroup = MemoryCgroup.create(folder.name, limits.memory_bytes)
            if cgroup is not None:
                command = cgroup.join_command(command)
        else:  # candidate code runs here too: the same allow-listed environment, no secret of the harness, and
            # no object cache (a candidate running as this user could write any folder it was given)
            env = clean_environment(worker_env(device, {"TORCH_EXTENSIONS_DIR": str(build)}), scratch)
        command = niced(command, BUILD_NICENESS)
        with Folder.open(build) as build_files:  # held from before the helper runs: no link it plants is followed
            try:
                proc = subprocess.Popen(command, cwd=str(REPO_ROOT), env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True, stdin=subprocess.DEVNULL,
                                        pass_fds=(theirs.fileno(),))
            finally:
                theirs.close()
            set_session_niceness(proc.pid, BUILD_NICENESS)  # its session exists: Popen returns after the exec
            if sandbox.backend == "bwrap":
                watch = SandboxWatch(limits, proc.pid, [scratch, build], kill=lambda: _kill_group(proc.pid),
                                     niceness=BUILD_NICENESS,
                                     cgroup=cgroup).start()
            try:
                with cancel.killable(lambda: _signal_build(proc.pid)):  # Ctrl-C ends the build at once
                    out = read_bounded(proc, timeout)
                if cancel.requested():  # killed by Ctrl-C: no verdict, and nothing of the build left behind
                    channel.kill_session(proc.pid)
                    channel.kill_orphaned_builds(build)
                    channel.remove_build_locks(build, started_wall)
                    cancel.check()
                if out.timed_out or out.over_cap:
                    cleanup = stop_build(proc, build, started_wall)
                    why = (f"did not finish within {timeout:.0f} s" if out.timed_out else
                           f"printed more than {HELPER_OUTPUT_CAP >> 20} MiB")
                    return CompileOutcome(False, time.perf_counter() - started, failures.COMPILE_ERROR,
                                          f"compilation {why}", native=True, cleanup=cleanup,
                                          timed_out=out.timed_out)
            finally:
                if proc.stdout is not None:
                    proc.stdout.close()
            text = out.tail.decode(errors="replace").replace(str(code), str(path))  # the user's file, not the copy
            seconds = time.perf_counter() - started
            if watch is not None:
                watch.stop()
                over = watch.breach or (watch.explain() if proc.returncode != 0 else None)
                if over:  # its import went over a limit of the sandbox: the candidate's failure
                    return CompileOutcome(False, seconds, failures.RUNTIME_ERROR, over, trim_compiler_output(text),
                                          native=True)
            report = parse_report(read_channel(ours), nonce.hex())
            if report is None or proc.returncode != STATUS_EXIT[report["status"]]:
                said = "without reporting a result" if report is None else f"reporting {report['status']!r}"
                return CompileOutcome(False, seconds, failures.COMPILE_ERROR,
                                      f"the build helper {_helper_ended(proc.returncode)} {said}: the candidate's "
                                      "import did not complete", trim_compiler_output(text), native=True)
            builds = report["builds"]
            if report["status"] == BUILD_FAILED_STATUS:
                return CompileOutcome(False, seconds, failures.COMPILE_ERROR, "native build failed",
                                      trim_compiler_output(text), native=True, builds=builds)
            if report["status"] == IMPORT_FAILED_STATUS:
                # Not the compiler: the ranks import it again and judge what it raises. Nothing is cached, so
                # the next compile looks again.
                return CompileOutcome(True, seconds, native=True, evidence=text[-500:], builds=builds,
                                      message=f"import {report.get('import', 'failed')} (not a build failure; "
                                              "the ranks will report it)")
            try:
                _store(build_files, entry, builds)
            except HostileFile as err:
                return CompileOutcome(False, seconds, failures.COMPILE_ERROR,
                                      f"the build's output was refused: {err}", native=True, builds=builds)
            builds = with_binding_store(builds, entry, scope, timeout, limits, sandbox)
    finally:
        if ours is not None:
            ours.close()
        if watch is not None:
            watch.stop()
        if cgroup is not None:
            cgroup.remove()
        remove_private(folder)
    return CompileOutcome(True, seconds, native=True, evidence=text[-500:], extensions=entry,
                          builds=with_cache(builds, MISS))


def with_binding_store(builds: list[dict[str, Any]], entry: Path, scope: Path, timeout: float,
                       limits: SandboxLimits, sandbox: SandboxInfo) -> list[dict[str, Any]]:
    """The builds, each with what binding_store did for its extension folder (`binding_store`, `reason`,
    `binding_stored_s`). The store only saves later builds time: a failure of it is recorded, never the
    candidate's (the compile succeeded)."""
    try:
        records = binding_store.as_records(binding_store.store_bindings(entry, scope, timeout, limits, sandbox,
                                                                         BUILD_NICENESS))
    except Exception as exc:  # noqa: BLE001 - an optimisation failed: the build stands
        records = {str(b.get("extension")): {"binding_store": "failed", "reason": f"{type(exc).__name__}: {exc}"[:300]}
                   for b in builds if b.get("extension")}
    return [{**b, **records.get(str(b.get("extension")), {})} if b.get("extension") else b for b in builds]


def with_cache(builds: list[dict[str, Any]], state: str) -> list[dict[str, Any]]:
    """The builds, each marked with whether the compile stage took it from its cache ("hit": this very source
    was built before, nothing compiled) or built it now ("miss"); the mark is the trusted side's, set after
    the helper's report was read (and after the entry was stored: a stored entry carries no mark)."""
    return [{**b, "cache": state} for b in builds]


def cached_builds(entry: Path) -> list[dict[str, Any]] | None:
    """The builds of a complete cache entry (its DONE file, read as hostile and strictly), or None: absent,
    half-written, or not what the trusted side wrote."""
    try:
        if not stat.S_ISDIR(os.lstat(entry).st_mode):
            return None
        builds = read_json(entry / DONE, 1 << 20)
    except (OSError, HostileFile):
        return None
    if not isinstance(builds, list) or not all(isinstance(b, dict) for b in builds):
        return None
    return builds


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def visible_for(candidate: Path, problem: str | None) -> tuple[Path, ...]:
    """What a sandbox importing `candidate` (the evaluation's read-only copy: harness.launch.sandbox.private) must
    see besides the code harness.launch.sandbox.mounts binds: the copy's folder, and the problem: a PKB checkout
    (its `utils`), else the problem's file (alone: its folder may be TMPDIR)."""
    paths = [candidate.parent]
    if problem and problem.startswith("pkb:"):
        paths.append(Path(problem[4:].split("::", 1)[0]))
    elif problem:
        paths.append(Path(problem))
    return tuple(paths)


def _store(build: Folder, entry: Path, builds: list[dict[str, Any]]) -> None:
    """Copy a finished build into the cache (the trusted side writes it; a half-written entry never counts).
    The build folder is the helper's, written by candidate code: copied file by file, no link or special
    file, within BUILD_BYTES_LIMIT. An entry that is not a complete one (planted, broken) is replaced."""
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=entry.parent))
    try:
        copy_tree_out(build, staging / "ext", max_bytes=BUILD_BYTES_LIMIT, max_files=BUILD_FILES_LIMIT,
                      skip=lambda name: name == "lock")
        replace_file(staging / "ext" / DONE, json.dumps(builds).encode())
        if os.path.lexists(entry) and cached_builds(entry) is None:
            aside = staging / "broken"
            os.rename(entry, aside)  # removed with the staging folder
        try:
            os.replace(staging / "ext", entry)
        except OSError:  # another evaluation of the same source stored it first
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def private_copy(entry: Path | None, folder: Path) -> Path:
    """A rank sandbox's own copy of a cache entry (torch writes lock files and logs into it), at `folder`."""
    if entry is not None and cached_builds(entry) is not None:
        with Folder.open(entry) as source:
            copy_tree_out(source, folder, max_bytes=BUILD_BYTES_LIMIT, max_files=BUILD_FILES_LIMIT)
    else:
        folder.mkdir(parents=True)
    return folder


def keep_lazy_builds(copy: Folder, entry: Path | None) -> list[str]:
    """After an evaluation: extensions the ranks built in their first call (which no compile stage could
    see coming) go into the cache entry of this source, so the next evaluation of it finds them. `copy` is
    the ranks' extension folder (they could write anything there), held open since before they started: a
    build is kept only if it is plain files and folders within the limits; anything else is left out."""
    if entry is None or cached_builds(entry) is None:
        return []
    added = []
    for name, kind in copy.entries():
        if kind != "dir" or os.path.lexists(entry / name):
            continue
        try:
            with copy.sub(name) as built:
                if not any(k == "file" and n.endswith(".so") for n, k in built.entries()):
                    continue
                staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=entry))
                try:
                    copy_tree_out(built, staging / name, max_bytes=BUILD_BYTES_LIMIT, max_files=BUILD_FILES_LIMIT,
                                  skip=lambda n: n == "lock")
                    os.rename(staging / name, entry / name)
                    added.append(name)
                except OSError:  # another evaluation kept it first
                    pass
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
        except HostileFile:
            continue
    return added


def _signal_build(pid: int) -> None:
    """SIGKILL of a build's session (sandboxed: bwrap, and so its namespace): signals only."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    channel.kill_session(pid)


def stop_build(proc: subprocess.Popen[bytes], folder: Path, since: float) -> dict[str, Any]:
    """End a build that overran its limit, and everything it started, and unblock the next build.

    Sandboxed, killing bwrap ends its whole PID namespace. Unsandboxed, the precompile process leads its
    own session; ninja starts each compiler in a process group of its own, so every process of the
    session dies, and torch's build locks created since the build started go (a later build of an
    extension with that name would otherwise wait on them until it, too, ran out of time)."""
    init = sandbox_init(proc.pid)
    sandboxed = len(pid_namespace_members(init)) if init is not None else 0  # they die with the sandbox
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    killed = sandboxed + channel.kill_session(proc.pid)
    try:
        proc.communicate(timeout=30)  # reaps it; the output pipe closes once every writer is dead
    except subprocess.TimeoutExpired:  # a writer left the session (setsid): stop waiting for the pipe
        proc.wait()
    killed += channel.kill_session(proc.pid)  # started between the first sweep and the reap
    killed += channel.kill_orphaned_builds(folder)
    return {"processes_killed": killed, "locks_removed": channel.remove_build_locks(folder, since)}
