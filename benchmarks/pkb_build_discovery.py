"""How many builds of a PKB solution set harness.compiling.builds finds ahead of the first call (CPU, nothing built).

    python benchmarks/pkb_build_discovery.py CHECKOUT SOLUTIONS_DIR [SOLUTIONS_DIR ...] [--json OUT]

Each file is imported (in a child process per set, with the checkout's `utils` importable, as the
precompile process does) and its function bodies searched for build calls whose arguments evaluate from
module-level names. Prints, per set: files, files whose every build call was found with its arguments,
build calls found, calls that cannot be made ahead (with reasons), files that failed to import, files
with no build call. Nothing is compiled. Results go in docs/pkb.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def scan_set(checkout: Path, directory: Path) -> dict:
    """Runs in the child: import each file, find its builds."""
    sys.path.insert(0, str(REPO))
    from harness.compiling import builds
    from harness.problems.parallelkernelbench.checkout import ensure_importable
    from harness.problems.problem import import_file, module_name_for

    ensure_importable(checkout.resolve())
    rows = []
    for path in sorted(directory.glob("*.py")):
        row: dict = {"file": path.name}
        try:
            module = import_file(path, module_name_for(path, "pkb_discovery"))
        except BaseException as exc:  # a file that fails at import: its builds are the workers' to meet
            row["import_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rows.append(row)
            continue
        found = builds.find_builds(module, path.read_text(errors="replace"))
        row["calls"] = [{"kind": c.kind, "name": c.name, "function": c.function, "line": c.line,
                         "needs_cuda": c.needs_cuda,
                         "source_chars": sum(len(a) for a in [*c.args, *c.kwargs.values()] if isinstance(a, str))}
                        for c in found.calls]
        row["undiscovered"] = [vars(u) for u in found.undiscovered]
        rows.append(row)
    return {"set": directory.name, "files": rows}


def summarize(result: dict) -> dict:
    rows = result["files"]
    return {
        "set": result["set"], "files": len(rows),
        "files_all_found": sum(1 for r in rows if r.get("calls") and not r.get("undiscovered")),
        "calls_found": sum(len(r.get("calls", [])) for r in rows),
        "calls_not_made": sum(len(r.get("undiscovered", [])) for r in rows),
        "import_errors": sum(1 for r in rows if "import_error" in r),
        "no_build_call": sum(1 for r in rows if "import_error" not in r and not r.get("calls")
                             and not r.get("undiscovered")),
        "not_made": [f"{r['file']}: {u['function']} line {u['line']}: {u['reason']}"
                     for r in rows for u in r.get("undiscovered", [])],
        "failed_imports": [f"{r['file']}: {r['import_error']}" for r in rows if "import_error" in r],
        "without_builds": [r["file"] for r in rows if "import_error" not in r and not r.get("calls")
                           and not r.get("undiscovered")],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("sets", type=Path, nargs="+")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(scan_set(args.checkout, args.sets[0])))
        return 0
    summaries = []
    for directory in args.sets:
        proc = subprocess.run([sys.executable, __file__, "--child", str(args.checkout), str(directory)],
                              capture_output=True, text=True, cwd=str(REPO), timeout=1800,
                              env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
        if proc.returncode != 0:
            print(f"{directory.name}: the scan failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        summary = summarize(json.loads(proc.stdout.strip().splitlines()[-1]))
        summaries.append(summary)
        print(f"{summary['set']}: {summary['files']} files; every build found in {summary['files_all_found']}; "
              f"{summary['calls_found']} build calls found with their arguments; {summary['calls_not_made']} "
              f"cannot be made ahead; {summary['import_errors']} failed to import; "
              f"{summary['no_build_call']} have no build call")
        for line in summary["not_made"] + summary["failed_imports"]:
            print(f"  {line}")
        if summary["without_builds"]:
            print(f"  no build call: {', '.join(summary['without_builds'])}")
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
