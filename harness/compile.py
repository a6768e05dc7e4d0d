"""Step 1 of the protocol: compile the candidate before any GPU waits on it.

Python syntax is checked in-process (compile() executes nothing). A candidate that builds native code
(torch.utils.cpp_extension.load_inline or load, PKB's compile_cuda_extension helper, NVRTC, CuPy) is
imported once, inside a sandbox of its own (harness.sandbox) with a time limit; harness.precompile also
runs the builds it finds inside functions (PKB's solutions build lazily in `solution()`). The build
lands in the sandbox's extension folder, which the harness then moves into its cache under the hash of
the candidate's source: only the trusted side writes the cache, and a candidate's build is only ever
used by the same source. A rank sandbox gets a private copy of that entry, mounted at the same path
the build used, so torch finds the build complete and loads it instead of compiling while the peers
wait. A build that overruns its limit is stopped whole: the sandbox dies with everything in it.

Without a sandbox (harness.sandbox falls back to "none", and says so) the build runs as before this
module had one: in a session of its own, its extension folder the cache entry itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import cancel, channel, failures
from harness.builds import may_build
from harness.cache_dir import cache_root
from harness.pool import REPO_ROOT, _pid_namespace_members, _sandbox_init, worker_env
from harness.sandbox import EXT_MOUNT, SandboxPolicy, clean_environment, probe

MAX_ERROR_CHARS = 3000
DONE = ".pkb-build-done"  # written into a cache entry once it is complete


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


def _builds_reported(text: str) -> list[dict[str, Any]]:
    """The builds harness.precompile reports in the JSON line it prints last: {"builds": [...], ...}."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and '"builds"' in line:
            try:
                value = json.loads(line)
            except ValueError:
                return []
            builds = value.get("builds") if isinstance(value, dict) else None
            return [b for b in builds if isinstance(b, dict)] if isinstance(builds, list) else []
    return []


def compile_candidate(path: Path, timeout: float, device: str, *, problem: str | None = None) -> CompileOutcome:
    """Syntax, then (for a candidate that builds native code) one sandboxed import with its builds.
    `problem`: the problem's loader spec, loaded there first (a PKB checkout's solutions import its
    `utils` at import time, and only loading the problem makes that package importable)."""
    raw = path.read_bytes()
    source = raw.decode(errors="replace")
    outcome = check_syntax(source, str(path))
    if not outcome.ok or not may_build(source):
        return outcome
    entry = entry_for(raw, problem)
    if (entry / DONE).exists():
        return CompileOutcome(True, 0.0, native=True, extensions=entry, cached=True,
                              builds=json.loads((entry / DONE).read_text() or "[]"))
    started, started_wall = time.perf_counter(), time.time()
    sandbox = probe()
    command = [sys.executable, "-m", "harness.precompile", str(path), *(["--problem", problem] if problem else [])]
    with tempfile.TemporaryDirectory(prefix="pkb-build-") as tmp:
        scratch = Path(tmp)
        (scratch / "tmp").mkdir()
        build = scratch / "ext"
        build.mkdir()
        if sandbox.backend == "bwrap":
            env = clean_environment(worker_env(device, {"TORCH_EXTENSIONS_DIR": EXT_MOUNT}), scratch)
            policy = SandboxPolicy(scratch=scratch, extensions=build, hide=(cache_root(),), gpus=device == "cuda",
                                   visible=visible_for(path, problem))
            command = policy.bwrap_command(command, REPO_ROOT)
        else:
            env = worker_env(device, {"TORCH_EXTENSIONS_DIR": str(build)})
        proc = subprocess.Popen(command, cwd=str(REPO_ROOT), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, stdin=subprocess.DEVNULL)
        try:
            with cancel.killable(lambda: _signal_build(proc.pid)):  # Ctrl-C ends the build at once
                out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            cleanup = stop_build(proc, build, started_wall)
            return CompileOutcome(False, time.perf_counter() - started, failures.COMPILE_ERROR,
                                  f"compilation did not finish within {timeout:.0f} s", native=True, cleanup=cleanup)
        if cancel.requested():  # killed by Ctrl-C: no verdict, and nothing of the build left behind
            channel.kill_session(proc.pid)
            channel.kill_orphaned_builds(build)
            channel.remove_build_locks(build, started_wall)
            cancel.check()
        text = out.decode(errors="replace")
        seconds = time.perf_counter() - started
        builds = _builds_reported(text)
        if proc.returncode == 3:  # precompile's code for "a build failed"
            return CompileOutcome(False, seconds, failures.COMPILE_ERROR, "native build failed",
                                  trim_compiler_output(text), native=True, builds=builds)
        _store(build, entry, builds)
    return CompileOutcome(True, seconds, native=True, evidence=text[-500:], extensions=entry, builds=builds)


def visible_for(candidate: Path, problem: str | None) -> tuple[Path, ...]:
    """What a sandbox importing `candidate` must see although its /tmp is its own: the candidate's
    folder (it may load files beside it) and, for a PKB problem, the checkout (its `utils`)."""
    folders = [candidate.resolve().parent]
    if problem and problem.startswith("pkb:"):
        folders.append(Path(problem[4:].split("::", 1)[0]))
    return tuple(folders)


def _store(build: Path, entry: Path, builds: list[dict[str, Any]]) -> None:
    """Move a finished build into the cache (the trusted side writes it; a half-written entry never counts)."""
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=entry.parent))
    try:
        shutil.copytree(build, staging / "ext", symlinks=True)
        for lock in (staging / "ext").glob("*/lock"):
            lock.unlink(missing_ok=True)
        (staging / "ext" / DONE).write_text(json.dumps(builds))
        try:
            os.replace(staging / "ext", entry)
        except OSError:  # another evaluation of the same source stored it first
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def private_copy(entry: Path | None, folder: Path) -> Path:
    """A rank sandbox's own copy of a cache entry (torch writes lock files and logs into it), at `folder`."""
    if entry is not None and entry.is_dir():
        shutil.copytree(entry, folder, symlinks=True)
    else:
        folder.mkdir(parents=True)
    return folder


def keep_lazy_builds(copy: Path, entry: Path | None) -> list[str]:
    """After an evaluation: extensions the ranks built in their first call (which no compile stage could
    see coming) go into the cache entry of this source, so the next evaluation of it finds them."""
    if entry is None or not copy.is_dir():
        return []
    entry.mkdir(parents=True, exist_ok=True)
    added = []
    for built in copy.iterdir():
        if built.is_dir() and not (entry / built.name).exists() and any(built.glob("*.so")):
            shutil.copytree(built, entry / built.name, symlinks=True, ignore=shutil.ignore_patterns("lock"))
            added.append(built.name)
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
    init = _sandbox_init(proc.pid)
    sandboxed = len(_pid_namespace_members(init)) if init is not None else 0  # they die with the sandbox
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
