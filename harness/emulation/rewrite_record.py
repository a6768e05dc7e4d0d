"""Whether a candidate's builds were rewritten for multimem, as the trusted side records it in the result.

The build hook (harness.emulation.build_hook) writes a CUDA source that names multimem rewritten into the
build folder, as torch's `<extension>/cuda.cu`: the rewrite's prelude (multimem_rewrite.prelude(), one fixed
text) first, then the candidate's code with each emulated instruction replaced by a block that starts with
`/* pkb-emulated <opcode> */`. The trusted side reads those files after the build, from a folder it holds
open (the compile stage's cache entry, the ranks' extension folder once they are gone), as hostile files:
no link followed, size-capped, the opcode parsed strictly. A source that does not start with the exact
prelude is not a rewritten one.

Where the build failed and no folder was kept, `of_source` says what the rewrite does to the CUDA strings
of the candidate's source (the precompile step rewrote exactly those before building).

The record, `integrity.emulation.multimem_rewritten` (docs/emulation.md):

    {"files": N, "instructions": {opcode: count}, "builds": [extension names], "seen_in": "builds" | "source"}

Counts are what the files say (the candidate's code follows the prelude, and a comment of its own could add
to a count): the record tells a reader that a result ran rewritten code, it is no verdict.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.common.hostile_files import Folder, HostileFile
from harness.emulation import multimem_rewrite

SOURCE_NAME = "cuda.cu"  # where load_inline writes a build's CUDA source (torch.utils.cpp_extension)
SOURCE_CAP = 16 << 20  # bytes of one source read; a larger one is not counted
MAX_BUILDS = 256  # extension folders looked at in one folder
MAX_NAMES = 32  # extension names kept in the record
SEEN_IN_BUILDS, SEEN_IN_SOURCE = "builds", "source"
_MARK = re.compile(r"/\* pkb-emulated (multimem\.[a-z0-9_:.]+) \*/ const unsigned long long pkb_mc_a = ")


def instructions_in(text: str) -> Counter[str] | None:
    """The instructions a rewritten source emulates (opcode -> count), or None when `text` is not one."""
    if not text.startswith(multimem_rewrite.prelude()):
        return None
    found: Counter[str] = Counter()
    for m in _MARK.finditer(text):
        if not isinstance(multimem_rewrite.parse_opcode(m.group(1)), str):
            found[m.group(1)] += 1
    return found


def rewritten_builds(folder: Folder, skip: Iterable[str] = ()) -> dict[str, Counter[str]]:
    """{extension name: its instructions} of every build under `folder` (an extensions root: one folder per
    extension) whose CUDA source was written rewritten; names in `skip` are not looked at. A source that
    cannot be read as a plain, capped file is not counted (nothing of it is believed)."""
    skipped = set(skip)
    out: dict[str, Counter[str]] = {}
    names = sorted(name for name, kind in folder.entries() if kind == "dir" and name not in skipped)
    for name in names[:MAX_BUILDS]:
        try:
            with folder.sub(name) as build:
                text = build.read_bytes(SOURCE_NAME, SOURCE_CAP).decode("utf-8", errors="replace")
        except HostileFile:
            continue
        found = instructions_in(text)
        if found is not None:
            out[name] = found
    return out


def record(builds: Mapping[str, Counter[str]], seen_in: str = SEEN_IN_BUILDS) -> dict[str, Any] | None:
    """The result's record of rewritten builds, or None when there was none."""
    if not builds:
        return None
    total: Counter[str] = Counter()
    for found in builds.values():
        total.update(found)
    return {"files": len(builds), "instructions": dict(sorted(total.items())),
            "builds": sorted(builds)[:MAX_NAMES], "seen_in": seen_in}


def of_folder(folder: Folder | None, entry: Path | None) -> dict[str, Any] | None:
    """The record of the builds in `folder` (the ranks' extension folder, held open since before they
    started: what they built and loaded), else in the cache entry `entry` (no rank started); None when no
    build there was rewritten or the folder cannot be listed."""
    try:
        if folder is not None:
            return record(rewritten_builds(folder))
        if entry is not None:
            with Folder.open(entry) as opened:
                return record(rewritten_builds(opened))
    except (OSError, HostileFile):
        pass
    return None


def of_source(source: str) -> dict[str, Any] | None:
    """What the precompile step's rewrite does to the CUDA strings of a candidate's Python source: one
    entry per string it rewrites (named by the string's line), or None when it rewrites none."""
    if "multimem" not in source:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    builds: dict[str, Counter[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "multimem" in node.value:
            result = multimem_rewrite.rewrite(node.value)
            if result.complete and result.changed:  # a source the rewrite cannot handle was built as written
                builds[f"string at line {node.lineno}"] = result.rewritten
    return record(builds, SEEN_IN_SOURCE)


def of_result(result: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The record in a stored result (result.json), or None when its builds were not rewritten."""
    integrity = (result or {}).get("integrity")
    emulation = integrity.get("emulation") if isinstance(integrity, Mapping) else None
    found = emulation.get("multimem_rewritten") if isinstance(emulation, Mapping) else None
    return dict(found) if isinstance(found, Mapping) else None


def describe(found: Mapping[str, Any]) -> str:
    """One line: "2 files, 6 instructions (multimem.ld_reduce...: 4, multimem.st...: 2)"."""
    instructions = found.get("instructions")
    counts = ({str(k): v for k, v in instructions.items() if isinstance(v, int)}
              if isinstance(instructions, Mapping) else {})
    listed = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    head = f"{found.get('files', '?')} file(s), {sum(counts.values())} instruction(s)"
    return f"{head} ({listed})" if listed else head
