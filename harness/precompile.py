"""Import a candidate once, outside any process group, so its native builds land in the cache.

Exit 3 when a build failed; 0 otherwise (other import errors are the workers' to judge).
"""

import sys
from pathlib import Path

from harness.candidate import classify_load_error, trimmed_traceback
from harness.failures import COMPILE_ERROR
from harness.problem import import_file, module_name_for


def main() -> int:
    path = Path(sys.argv[1])
    try:
        import_file(path, module_name_for(path, "pkb_precompile"))
    except BaseException as exc:
        if classify_load_error(exc) == COMPILE_ERROR:
            print(trimmed_traceback(exc))
            return 3
        print(f"import raised {type(exc).__name__} (not a build failure; left to the rank workers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
