"""Import a candidate once, outside any process group, so its native builds land in the cache.

    python -m harness.precompile CANDIDATE [--problem LOADER_SPEC]

The problem is loaded first, as the rank worker does: for a PKB checkout that puts its `utils` package
on the import path, which PKB solutions import before anything else. Exit 3 when a build failed; 0
otherwise (other import errors, and a problem that does not load, are the workers' to judge).
"""

import argparse
import sys
from pathlib import Path

from harness.candidate import classify_load_error, trimmed_traceback
from harness.failures import COMPILE_ERROR
from harness.problem import import_file, load_problem_spec, module_name_for


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pkb-agent precompile (started by harness.compile)")
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--problem", default=None, help="the problem's loader spec")
    args = parser.parse_args(argv)
    if args.problem:
        try:
            load_problem_spec(args.problem)
        except Exception as exc:
            print(f"the problem did not load ({type(exc).__name__}: {exc}); importing the candidate anyway")
    try:
        import_file(args.candidate, module_name_for(args.candidate, "pkb_precompile"))
    except BaseException as exc:
        if classify_load_error(exc) == COMPILE_ERROR:
            print(trimmed_traceback(exc))
            return 3
        print(f"import raised {type(exc).__name__} (not a build failure; left to the rank workers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
