"""Edit -> built: a candidate's CUDA extension built cold, then after edits to its kernel body only.

    python -m benchmarks.edit_build CANDIDATE.py [--edits 5] [--baseline 1] [--work DIR]
        [--extra-include DIR] [--extra-ldflags FLAGS] [--cuda-home DIR]

CANDIDATE is a PKB solution whose module-level CUDA_SRC is what it hands to compile_cuda_extension (PKB's
recorded sets: `CUDA_SRC` built with cpp_sources="" and TORCH_CUDA_ARCH_LIST=9.0, as its helper does). Each
build runs in a fresh extension folder, as every evaluation's build does (harness.compiling.compile), with
torch's load_inline and harness.compiling.split_build installed: the first build fills the binding-unit
cache (cold), each edit (a constant added to the first __global__ function's body) takes the binding unit
from it. `--baseline N` also times N edits built by torch's own ninja runner (both units), the cost an edit
has without the split. Prints one JSON object: every build's wall and its split report.

On a machine whose torch is a CPU build (no CUDA_HOME, no cuBLAS/cuSPARSE headers, no libtorch_cuda),
`--cuda-home`, `--extra-include` (stub headers) and `--extra-ldflags` (stub libraries) let the build run;
nothing is loaded (a CUDA extension cannot load without CUDA), only built.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.compiling import split_build
from harness.compiling.build_cache import ObjectCache

KERNEL = re.compile(r"__global__[^{;]*\{")


def edited(source: str, n: int) -> str:
    """`source` with a constant added at the top of its first kernel's body (an edit to the kernel only)."""
    match = KERNEL.search(source)
    if match is None:
        raise SystemExit("no __global__ function in the CUDA source")
    line = f"\n    volatile int pkb_edit_constant = {n}; (void)pkb_edit_constant;\n"
    return source[:match.end()] + line + source[match.end():]


def cuda_source(candidate: Path) -> str:
    """The module-level string constant CUDA_SRC, read without importing the file."""
    for node in ast.parse(candidate.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CUDA_SRC" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    raise SystemExit(f"{candidate} has no string constant CUDA_SRC")


def build_once(name: str, source: str, folder: Path, args: argparse.Namespace) -> float:
    from torch.utils import cpp_extension

    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    # As in a fresh process (each evaluation's build is one): torch would otherwise name an edited source
    # name_v1, name_v2, ... in this one, and the name is part of the binding unit's flags.
    cpp_extension.JIT_EXTENSION_VERSIONER.entries.clear()
    started = time.perf_counter()
    try:
        cpp_extension.load_inline(name, cpp_sources="", cuda_sources=source, extra_cuda_cflags=["-O3"],
                                  extra_include_paths=args.extra_include, extra_ldflags=args.extra_ldflags.split(),
                                  with_cuda=True, verbose=False)
    except ImportError:
        pass  # built, but a CUDA extension cannot load where torch has no CUDA
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--edits", type=int, default=5)
    parser.add_argument("--baseline", type=int, default=1, help="edits built by torch's own runner")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--extra-include", action="append", default=[])
    parser.add_argument("--extra-ldflags", default="")
    parser.add_argument("--cuda-home", default=None)
    args = parser.parse_args(argv)
    from torch.utils import cpp_extension

    if args.cuda_home and cpp_extension.CUDA_HOME is None:
        cpp_extension.CUDA_HOME = args.cuda_home
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")  # as PKB's compile_cuda_extension sets it
    work = args.work or Path(tempfile.mkdtemp(prefix="edit-build-"))
    cache = ObjectCache(work / "binding-cache")
    shutil.rmtree(cache.root, ignore_errors=True)
    source = cuda_source(args.candidate.resolve())
    name = "edit_build_" + re.sub(r"\W", "_", args.candidate.stem)
    builds: list[dict[str, Any]] = []
    split_build.install(cache, writable=True)
    try:
        for n in range(args.edits + 1):
            folder = work / f"split-{n}"
            shutil.rmtree(folder, ignore_errors=True)
            before = len(split_build.REPORTS)
            wall = build_once(name, edited(source, n) if n else source, folder, args)
            report = split_build.REPORTS[before].as_dict() if len(split_build.REPORTS) > before else {}
            builds.append({"build": "cold" if n == 0 else f"edit {n}", "runner": "split", "wall_s": round(wall, 2),
                           **report})
            print(json.dumps(builds[-1]), file=sys.stderr, flush=True)
    finally:
        split_build.uninstall()
    for n in range(1, args.baseline + 1):
        folder = work / f"torch-{n}"
        shutil.rmtree(folder, ignore_errors=True)
        wall = build_once(name, edited(source, 100 + n), folder, args)
        builds.append({"build": f"edit {n}", "runner": "torch", "wall_s": round(wall, 2)})
        print(json.dumps(builds[-1]), file=sys.stderr, flush=True)
    edits = [b["wall_s"] for b in builds if b["runner"] == "split" and b["build"] != "cold"]
    torch_edits = [b["wall_s"] for b in builds if b["runner"] == "torch"]
    print(json.dumps({"candidate": args.candidate.name, "cold_s": builds[0]["wall_s"],
                      "edit_median_s": statistics.median(edits) if edits else None,
                      "torch_edit_median_s": statistics.median(torch_edits) if torch_edits else None,
                      "load_average": os.getloadavg(), "cpus": os.cpu_count(), "builds": builds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
