"""Build a candidate's native code once, outside any process group, so the rank workers find it cached.

    python -m harness.compiling.precompile CANDIDATE [--problem LOADER_SPEC]

The problem is loaded first, as the rank worker does: for a PKB checkout that puts its `utils` package
on the import path, which PKB solutions import before anything else. Then the candidate is imported
(builds at its top level happen then), and the builds its functions would make on their first call
(harness.compiling.builds: load_inline, cpp_extension.load, PKB's compile_cuda_extension, CuPy) are made now, with
the same arguments, so the extension lands in the cache under the same name and source hash.

Output: a line per build, then, last, one result line the compile stage parses strictly:
    PKB_PRECOMPILE_RESULT {"status": "ok" | "build_failed" | "import_failed",
     "builds": [{"name", "kind", "function", "line", "seconds", "ok", ["skipped"], ["error"]}],
     "undiscovered": N, "not_made": [{"kind", "function", "line", "reason"}], "import": "ok" | "..."}
`ok` is null for a build skipped (a CUDA build where torch has no CUDA). Exit 3 with "build_failed" when a
build failed in the compiler; 0 with "ok", or with "import_failed" when the import raised something other
than a build failure (the workers judge that; nothing is cached). Anything else (no result line, another
exit code, output after the result line) is a failure of the candidate's import: harness.compiling.compile fails
closed. The candidate runs in this process and could print a result line of its own: a forged "ok" only
skips the build ahead of time, and its ranks then build (or fail) inside their first call.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.common.failures import COMPILE_ERROR
from harness.compiling.builds import BuildOutcome, Undiscovered, build_ahead
from harness.emulation.build_hook import rewrite_builds_of
from harness.problems.problem import import_file, module_name_for
from harness.problems.registry import load_problem_spec
from harness.rank.candidate import classify_load_error, trimmed_traceback

BUILD_FAILED = 3
RESULT_MARKER = "PKB_PRECOMPILE_RESULT "
OK_STATUS, BUILD_FAILED_STATUS, IMPORT_FAILED_STATUS = "ok", "build_failed", "import_failed"
STATUS_EXIT = {OK_STATUS: 0, BUILD_FAILED_STATUS: BUILD_FAILED, IMPORT_FAILED_STATUS: 0}


def summary(outcomes: list[BuildOutcome], undiscovered: list[Undiscovered], imported: str,
            status: str) -> dict[str, Any]:
    return {"status": status, "builds": [o.as_dict() for o in outcomes], "undiscovered": len(undiscovered),
            "not_made": [vars(u) for u in undiscovered], "import": imported}


def report(result: dict[str, Any]) -> int:
    """Print the result line (last) and return the exit code that goes with its status."""
    print(RESULT_MARKER + json.dumps(result, default=str), flush=True)
    return STATUS_EXIT[result["status"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pkb-agent precompile (started by harness.compiling.compile)")
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--problem", default=None, help="the problem's loader spec")
    args = parser.parse_args(argv)
    if not args.candidate.is_absolute() or not args.candidate.is_file():
        print(f"precompile: {args.candidate} is not an absolute path to a file")  # no result line: a failure
        return 2
    if args.problem:
        try:
            load_problem_spec(args.problem)
        except Exception as exc:
            print(f"the problem did not load ({type(exc).__name__}: {exc}); importing the candidate anyway")
    # Multimem is rewritten into unicast accesses before torch builds it, as in emulated ranks (docs/emulation.md).
    rewrite_builds_of(args.candidate.read_text(errors="replace"))
    try:
        module = import_file(args.candidate, module_name_for(args.candidate, "pkb_precompile"))
    except BaseException as exc:
        if classify_load_error(exc) == COMPILE_ERROR:
            print(trimmed_traceback(exc))
            return report(summary([], [], "a build at import failed", BUILD_FAILED_STATUS))
        print(f"import raised {type(exc).__name__} (not a build failure; left to the rank workers)")
        return report(summary([], [], f"raised {type(exc).__name__}", IMPORT_FAILED_STATUS))
    source = args.candidate.read_text(errors="replace")
    outcomes, undiscovered = build_ahead(module, source)
    failed = False
    for o in outcomes:
        if o.ok:
            print(f"built {o.name} ({o.kind}, called in {o.function} line {o.line}) in {o.seconds:.1f} s")
        elif o.ok is None:
            print(f"skipped {o.name} ({o.kind}, called in {o.function} line {o.line}): {o.skipped}")
        elif o.exception is not None and classify_load_error(o.exception) == COMPILE_ERROR:
            failed = True
            print(f"build of {o.name} ({o.kind}, called in {o.function} line {o.line}) failed after "
                  f"{o.seconds:.1f} s:\n{o.error}")
        else:  # not the compiler: the first call would raise the same, and the workers judge that
            print(f"calling {o.kind} for {o.name} (in {o.function} line {o.line}) raised, not in the compiler: "
                  f"{o.error.splitlines()[0] if o.error else ''}")
    for u in undiscovered:
        print(f"not built ahead: {u.kind} in {u.function} line {u.line}: {u.reason}")
    return report(summary(outcomes, undiscovered, "ok", BUILD_FAILED_STATUS if failed else OK_STATUS))


if __name__ == "__main__":
    sys.exit(main())
