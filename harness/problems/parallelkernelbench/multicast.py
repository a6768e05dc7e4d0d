"""Which PKB solution files use NVLink multicast, which must never run on the machines this project uses.

A program that creates multicast objects (cuMulticastCreate, NVLS, PTX `multimem.*`) can put a shared
host's GPUs out of service, so such files are skipped before anything runs them, with the line that gave
them away. The test is textual and deliberately broad: a file that only mentions multicast in a comment or
in a fallback it never takes is skipped too (read, never imported: the files are candidate code).

Under emulation (ranks sharing a GPU) a narrower rule holds, `emulation_reason`: multicast is emulated
without multicast (docs/emulation.md), so a file runs there when every multimem instruction in its
strings is one harness.emulation.multimem_rewrite rewrites, it builds them only through torch's inline
extensions (where the rewrite happens), and it names no multicast object or NVLS switch.

Standard library only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

from harness.emulation import multimem_rewrite

# The words that give multicast away, as the device machines' notes name them (case-insensitive).
MULTICAST_TERMS = ("multicast", "multimem", "nvls", "cuMulticast")
_PATTERN = re.compile("|".join(re.escape(t) for t in MULTICAST_TERMS), re.IGNORECASE)


def multicast_reason(source: str | Path) -> str | None:
    """One line saying why a file (a path, or its text) must not run here, or None when it mentions none
    of MULTICAST_TERMS."""
    text = Path(source).read_text(errors="replace") if isinstance(source, Path) else source
    for number, line in enumerate(text.splitlines(), 1):
        m = _PATTERN.search(line)
        if m:
            snippet = line[max(0, m.start() - 30):m.end() + 50].strip()
            return (f"uses NVLink multicast ('{m.group(0)}' at line {number}: {snippet!r}); "
                    "multicast must not run on these machines")
    return None


# Under emulation: what the build hook cannot reach (runtime compilers, raw PTX modules) and what no rewrite
# turns into unicast (multicast objects, NVLS switches).
_RUNTIME_COMPILERS = re.compile(r"nvrtc|RawModule|RawKernel|cuModuleLoad|cupy", re.IGNORECASE)
_MULTICAST_OBJECTS = re.compile(r"cuMulticast\w*|cudaMulticast\w*|nvls", re.IGNORECASE)


def _text(source: str | Path) -> str:
    return Path(source).read_text(errors="replace") if isinstance(source, Path) else source


def _line_with(text: str, pattern: re.Pattern[str]) -> tuple[int, str, str] | None:
    for number, line in enumerate(text.splitlines(), 1):
        m = pattern.search(line)
        if m:
            return number, m.group(0), line.strip()[:100]
    return None


def _strings(text: str) -> list[tuple[int, str]]:
    """(line, value) of every string constant of a Python source, f-string pieces included."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def emulation_reason(source: str | Path) -> str | None:
    """Under emulation: one line saying why a file that uses multicast still cannot run (naming the
    construct), or None when it may: it names no multicast term, or the rewrite handles all of it."""
    text = _text(source)
    if multicast_reason(text) is None:
        return None
    found = _line_with(text, _MULTICAST_OBJECTS)
    if found:
        number, word, line = found
        return f"uses NVLink multicast objects ('{word}' at line {number}: {line!r}), which are never emulated"
    mentions_multimem = "multimem" in text.lower()
    runtime = _line_with(text, _RUNTIME_COMPILERS) if mentions_multimem else None
    if runtime:
        number, word, _ = runtime
        return (f"uses multimem with a runtime compiler ('{word}' at line {number}): the emulation rewrites "
                "multimem only in torch's inline extensions")
    for at, value in _strings(text):
        if "multimem" not in value:
            continue
        result = multimem_rewrite.rewrite(value)
        if not result.complete:
            first = result.unrewritable[0]
            return (f"uses multimem the emulation cannot rewrite ({first.construct[:80]!r}, line {first.line} of "
                    f"the string at line {at}: {first.why})")
    return None


def split_multicast(paths: Iterable[Path]) -> tuple[list[Path], dict[Path, str]]:
    """(files that may run, {file: why it is skipped}) in the order given."""
    runnable: list[Path] = []
    skipped: dict[Path, str] = {}
    for path in paths:
        reason = multicast_reason(Path(path))
        if reason is None:
            runnable.append(Path(path))
        else:
            skipped[Path(path)] = reason
    return runnable, skipped
