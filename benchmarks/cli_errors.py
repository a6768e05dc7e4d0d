"""How fast `pkb` answers a usage error: seconds from start to exit for the mistakes a newcomer makes first.

Each case runs `python -m agent.cli ARGS` in a fresh interpreter from the checkout (PYTHONPATH set to it), as
typing `pkb ARGS` does, `--repeats` times; the script records the exit code, the lines on stderr and the
wall seconds (median and max). Two baselines give the floor: a bare interpreter (`python -c pass`) and
`import torch` (what an answer costs that waits for the harness). The load average is printed with them: on a
shared machine the medians move with it.

    python benchmarks/cli_errors.py --repeats 5 [--out DIR]

Writes results.json and results.md into --out when given; prints the table. CPU only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GOOD = "tests/candidates/correct_shared_memory.py"  # relative: the commands run in the checkout


def cases(empty: Path) -> list[tuple[str, list[str]]]:
    """(name, argv) of every usage error timed; `empty` is an empty file."""
    return [
        ("report of a missing folder", ["report", "missing-dir"]),
        ("eval of an empty solution file", ["eval", "--solution", str(empty)]),
        ("eval of an empty file, with a problem", ["eval", "--problem", "all_reduce", "--solution", str(empty)]),
        ("run with a mistyped option", ["run", "--modle", "x"]),
        ("eval --trials 1", ["eval", "--trials", "1"]),
        ("run --trials 1", ["run", "--model", "scripted:x", "--trials", "1"]),
        ("eval of a missing file", ["eval", "--problem", "all_reduce", "--solution", "/no/such/file.py"]),
        ("a mistyped command", ["rnu"]),
        ("eval --device cud", ["eval", "--problem", "all_reduce", "--solution", GOOD, "--device", "cud"]),
    ]


def timed(argv: list[str]) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=600, check=False)
    return time.perf_counter() - started, proc.returncode, proc.stderr.strip()


def measure(argv: list[str], repeats: int) -> dict[str, Any]:
    runs = [timed(argv) for _ in range(repeats)]
    seconds = [s for s, _, _ in runs]
    _, code, stderr = runs[-1]
    return {"median_s": round(statistics.median(seconds), 3), "max_s": round(max(seconds), 3), "exit_code": code,
            "stderr_lines": len(stderr.splitlines()), "stderr": stderr[-300:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    for name, argv in (("baseline: python -c pass", [sys.executable, "-c", "pass"]),
                       ("baseline: import torch", [sys.executable, "-c", "import torch"])):
        rows.append({"case": name, "command": " ".join(argv[1:]), **measure(argv, args.repeats)})
    with tempfile.TemporaryDirectory() as folder:
        empty = Path(folder) / "empty.py"
        empty.write_text("")
        for name, argv in cases(empty):
            shown = " ".join("empty.py" if a == str(empty) else a for a in argv)
            rows.append({"case": name, "command": f"pkb {shown}",
                         **measure([sys.executable, "-m", "agent.cli", *argv], args.repeats)})
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "python": platform.python_version(),
              "cpus": os.cpu_count(), "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
              "repeats": args.repeats, "rows": rows}
    table = ["| case | command | median s | max s | exit code | stderr lines |", "|---|---|---|---|---|---|"]
    table += [f"| {r['case']} | `{r['command']}` | {r['median_s']:.2f} | {r['max_s']:.2f} | {r['exit_code']} | "
              f"{r['stderr_lines']} |" for r in rows]
    text = "\n".join(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / "results.md").write_text(text + "\n")
    print(f"load average {result['load_average'][0]} before, {result['load_average'][1]} after; "
          f"{args.repeats} repeats; python {result['python']}, {result['cpus']} CPUs")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
