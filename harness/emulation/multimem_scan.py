"""Look for multimem instructions in a built binary (an extension .so, a cubin, a fatbin, an object).

The rewrite (harness.emulation.multimem_rewrite) works on text; this checks what the compiler made of
it, so that nothing a macro, a header or a missed spelling let through can reach a GPU under emulation.
It reads the binary's SASS and, where the binary embeds it, its PTX, with CUDA's `cuobjdump`.

What each view can show (measured with nvcc 13.0 for sm_90a): in PTX every multimem instruction keeps
its name. In SASS, `multimem.ld_reduce` becomes `LDGMC`, but `multimem.st` and `multimem.red` become the
ordinary `STG` and `REDG` (on Hopper the multicast lies in the address, not the instruction), so a binary
without PTX shows only the loads. Those stores and reductions, if any were left, would go to the
emulated window, a reserved range that is never mapped: they fault there and reach no memory.

A scan that cannot run (no cuobjdump, a timeout, an unreadable file) is a failure, never a pass.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

SASS_MULTICAST = re.compile(r"\b(?:LD|ST|RED|ATOM)G?MC\b[\w.]*|\bMULTIMEM\w*")
PTX_MULTIMEM = re.compile(r"\bmultimem\.[\w.:]+")
NO_DEVICE_CODE = "does not contain device code"
SCAN_TIMEOUT_S = 300.0
MAX_FINDINGS = 20


@dataclass
class ScanResult:
    """What the scan of one binary found: `findings` (instruction lines), which views it read, and
    `error` when it could not run (then the binary is not clean)."""

    path: str
    findings: list[str] = field(default_factory=list)
    views: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def clean(self) -> bool:
        return not self.error and not self.findings

    def describe(self) -> str:
        if self.error:
            return f"{self.path}: the multimem scan could not run ({self.error})"
        if self.findings:
            return f"{self.path}: multimem left in the binary: {'; '.join(self.findings[:3])}"
        return f"{self.path}: no multimem ({', '.join(self.views) or 'no device code'})"


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, beside the CUDA toolkit, or from the nvidia-cuda-cuobjdump wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    roots = [os.environ.get(k, "") for k in ("CUDA_HOME", "CUDA_PATH")] + sorted(glob.glob("/usr/local/cuda*"))
    roots += [str(Path(p) / "nvidia" / sub) for p in sys.path if p for sub in ("cu13", "cu12", "cuda_cuobjdump")]
    for root in roots:
        candidate = Path(root) / "bin" / "cuobjdump"
        if root and candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _dump(tool: str, view: str, path: Path) -> tuple[str, str]:
    """(text, error) of `cuobjdump -<view> path`; text '' with no error when there is no device code."""
    # cuobjdump runs nvdisasm for SASS; the wheels (nvidia-cuda-cuobjdump, -nvdisasm) put it beside cuobjdump,
    # where the toolkit has it too, but not on PATH.
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(tool).parent), os.environ.get("PATH", "")])}
    try:
        done = subprocess.run([tool, f"-{view}", str(path)], capture_output=True, text=True, errors="replace",
                              timeout=SCAN_TIMEOUT_S, check=False, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"cuobjdump -{view}: {type(exc).__name__}: {exc}"
    if done.returncode != 0:
        if NO_DEVICE_CODE in done.stderr or NO_DEVICE_CODE in done.stdout:
            return "", ""
        return "", f"cuobjdump -{view} exited {done.returncode}: {done.stderr.strip()[-300:]}"
    return done.stdout, ""


def scan(path: Path | str, tool: str | None = None) -> ScanResult:
    """Every multimem instruction in the SASS and PTX of the binary at `path`."""
    path = Path(path)
    result = ScanResult(str(path))
    tool = tool or find_cuobjdump()
    if tool is None:
        result.error = "cuobjdump was not found (CUDA toolkit or the nvidia-cuda-cuobjdump package)"
        return result
    if not path.is_file():
        result.error = "no such file"
        return result
    for view, pattern in (("sass", SASS_MULTICAST), ("ptx", PTX_MULTIMEM)):
        text, error = _dump(tool, view, path)
        if error:
            result.error = error
            return result
        if text.strip():
            result.views.append(view)
        for line in text.splitlines():
            if pattern.search(line) and len(result.findings) < MAX_FINDINGS:
                result.findings.append(f"{view}: {' '.join(line.split())[:160]}")
    return result
