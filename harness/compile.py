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
from dataclasses import dataclass
from pathlib import Path

from harness import failures
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


def compile_candidate(path: Path, timeout: float, device: str) -> CompileOutcome:
    source = path.read_text(errors="replace")
    outcome = check_syntax(source, str(path))
    if not outcome.ok or not any(marker in source for marker in NATIVE_MARKERS):
        return outcome
    started = time.perf_counter()
    env = worker_env(device, {"TORCH_EXTENSIONS_DIR": str(extensions_dir())})
    proc = subprocess.Popen([sys.executable, "-m", "harness.precompile", str(path)], cwd=str(REPO_ROOT),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            stdin=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return CompileOutcome(False, time.perf_counter() - started, failures.COMPILE_ERROR,
                              f"compilation did not finish within {timeout:.0f} s", native=True)
    text = out.decode(errors="replace")
    seconds = time.perf_counter() - started
    if proc.returncode == 3:  # precompile's code for "a build failed"
        return CompileOutcome(False, seconds, failures.COMPILE_ERROR, "native build failed",
                              trim_compiler_output(text), native=True)
    return CompileOutcome(True, seconds, native=True, evidence=text[-500:])
