"""Step 1 of the protocol: compile the candidate before any GPU waits on it.

Python syntax is checked in-process (compile() executes nothing). A candidate that builds native code
(torch.utils.cpp_extension.load_inline, NVRTC) is imported once in a separate, killable process with
a time limit, so the build lands in a persistent cache keyed by source hash and the rank workers load
it instead of compiling while their peers wait. Only compile failures count here: any other error at
import (a candidate that needs a process group at import time, say) is left for the workers to judge.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import channel, failures
from harness.pool import REPO_ROOT, worker_env

NATIVE_MARKERS = ("load_inline", "cpp_extension", "nvrtc", "NVRTC", "cupy.RawKernel", "cupy.RawModule")
MAX_ERROR_CHARS = 3000


def extensions_dir() -> Path:
    """Where built extensions persist across runs (torch keys each build by name and source hash)."""
    root = Path(os.environ.get("PKB_CACHE_DIR", Path.home() / ".cache" / "pkb-agent"))
    path = root / "torch_extensions"
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class CompileOutcome:
    ok: bool
    seconds: float
    verdict: str = failures.CORRECT
    message: str = ""
    evidence: str = ""
    native: bool = False
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


def compile_candidate(path: Path, timeout: float, device: str, *, problem: str | None = None) -> CompileOutcome:
    """Syntax, then (for a candidate that builds native code) one import in a killable process.
    `problem`: the problem's loader spec, loaded there first (a PKB checkout's solutions import its
    `utils` at import time, and only loading the problem makes that package importable)."""
    source = path.read_text(errors="replace")
    outcome = check_syntax(source, str(path))
    if not outcome.ok or not any(marker in source for marker in NATIVE_MARKERS):
        return outcome
    started = time.perf_counter()
    started_wall = time.time()
    folder = extensions_dir()
    env = worker_env(device, {"TORCH_EXTENSIONS_DIR": str(folder)})
    command = [sys.executable, "-m", "harness.precompile", str(path), *(["--problem", problem] if problem else [])]
    proc = subprocess.Popen(command, cwd=str(REPO_ROOT),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            stdin=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        cleanup = stop_build(proc, folder, started_wall)
        return CompileOutcome(False, time.perf_counter() - started, failures.COMPILE_ERROR,
                              f"compilation did not finish within {timeout:.0f} s", native=True, cleanup=cleanup)
    text = out.decode(errors="replace")
    seconds = time.perf_counter() - started
    if proc.returncode == 3:  # precompile's code for "a build failed"
        return CompileOutcome(False, seconds, failures.COMPILE_ERROR, "native build failed",
                              trim_compiler_output(text), native=True)
    return CompileOutcome(True, seconds, native=True, evidence=text[-500:])


def stop_build(proc: subprocess.Popen, folder: Path, since: float) -> dict[str, Any]:
    """End a build that overran its limit, and everything it started, and unblock the next build.

    The precompile process leads its own session; ninja starts each compiler in a process group of its
    own, so killing the precompile's group alone leaves the compiler running (for minutes, on a
    pathological source). Every process of the session dies instead. torch's build lock
    (`<extension>/lock`) outlives its holder and every later build of an extension with that name
    would wait on it until it, too, ran out of time: locks created since the build started go.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    killed = channel.kill_session(proc.pid)
    try:
        proc.communicate(timeout=30)  # reaps it; the output pipe closes once every writer is dead
    except subprocess.TimeoutExpired:  # a writer left the session (setsid): stop waiting for the pipe
        proc.wait()
    killed += channel.kill_session(proc.pid)  # started between the first sweep and the reap
    # Builds left by harness processes that died mid-compile (their session leader is gone).
    killed += channel.kill_orphaned_builds(folder)
    return {"processes_killed": killed, "locks_removed": channel.remove_build_locks(folder, since)}
