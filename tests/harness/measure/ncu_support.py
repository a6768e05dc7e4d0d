"""A stand-in for Nsight Compute's `ncu`, for CPU tests of the driver (harness.measure.ncu) and of `pkb profile`:
it records its arguments, runs the rank it wraps, writes a report, and on `--import` prints a CSV the test chose."""

from __future__ import annotations

import stat
import sys
import textwrap
from pathlib import Path

import pytest

from harness.measure import ncu as nsight

FAKE_NCU = textwrap.dedent('''\
    #!{python}
    """Stands in for ncu: records its arguments, runs the application, writes a report; --import prints CSV."""
    import json, os, subprocess, sys

    args = sys.argv[1:]
    if "--import" in args:
        sys.stdout.write(open(os.environ["PKB_TEST_FAKE_NCU_CSV"]).read())
        sys.exit(0)
    with open(os.environ["PKB_TEST_FAKE_NCU_ARGS"], "a") as f:
        f.write(json.dumps(args) + "\\n")
    valued = {{"--target-processes", "--replay-mode", "--cache-control", "--clock-control", "--profile-from-start",
              "--launch-count", "--kernel-name-base", "--kernel-name", "--metrics", "--export"}}
    i = 0
    while i < len(args) and args[i].startswith("--"):
        i += 2 if args[i] in valued else 1
    print('==PROF== Profiling "one_shot_all_reduce" - 0: 0%....50%....100% - 1 pass', flush=True)
    code = subprocess.call(args[i:], close_fds=False)  # the worker needs the pool's pipes
    open(args[args.index("--export") + 1], "w").write("report")
    sys.exit(code)
    ''')


def fake_ncu(folder: Path, csv_text: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in installed as harness.measure.ncu's `ncu`, printing `csv_text` on import; returns the file
    where each launch's arguments are recorded (one JSON list a line)."""
    fake = folder / "ncu"
    fake.write_text(FAKE_NCU.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    (folder / "raw.csv").write_text(csv_text)
    monkeypatch.setenv("PKB_TEST_FAKE_NCU_CSV", str(folder / "raw.csv"))
    monkeypatch.setenv("PKB_TEST_FAKE_NCU_ARGS", str(folder / "args.jsonl"))
    monkeypatch.setattr(nsight, "ncu_path", lambda: str(fake))
    return folder / "args.jsonl"
