"""How long Ctrl-C takes to stop `pkb run` (CPU): seconds from SIGINT to the resume line, and to the process's end.

Each repetition starts `pkb run --model replay:DIR` on 20 queued samples of all_reduce: the first a correct
kernel, the other 19 a candidate that computes for 200 s per call (its correctness check alone would take the
whole 120 s limit). Once the first sample is finished and the second one's ranks are running, SIGINT is sent;
the script records when the line with the resume command appeared and when the process ended, how many
samples had finished, and whether any process of the run (anything whose command line names the run's private
temporary folder) was left.

    python benchmarks/interrupt_latency.py --out /tmp/interrupt --repeats 3

Writes results.json and results.md into --out and prints the table last. CPU only, no GPU needed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CANDIDATES = REPO / "tests" / "candidates"
RESUME_MARK = "continue with: pkb run"


def mentioning(text: str) -> list[int]:
    """PIDs of live processes (not this one) whose command line names `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" and text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def finished(run_dir: Path) -> int:
    count = 0
    for path in (run_dir / "samples").glob("*/*/*/sample.json"):
        try:
            count += json.loads(path.read_text()).get("status") == "finished"
        except (OSError, ValueError):
            continue
    return count


def one(work: Path, index: int) -> dict[str, Any]:
    solutions = work / f"solutions{index}" / "all_reduce"
    solutions.mkdir(parents=True)
    (solutions / "s00.py").write_text((CANDIDATES / "correct_all_gather_sum.py").read_text())
    for i in range(1, 20):
        (solutions / f"s{i:02d}.py").write_text((CANDIDATES / "computes_for_long.py").read_text())
    private = work / f"tmp{index}"
    private.mkdir()
    runs = work / f"runs{index}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(private)}
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli.run", "--model", f"replay:{solutions.parent}",
                             "--runs-dir", str(runs), "--run-id", "bench", "--trials", "2", "--no-timing"],
                            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in proc.stdout or []))
    reader.start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if finished(runs / "bench") >= 1 and mentioning(str(private)):
            break
        time.sleep(0.1)
    time.sleep(1.0)  # the second sample's ranks are computing
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=300)
    ended = time.monotonic()
    reader.join(timeout=10)
    said_at = next((t for t, line in lines if "pkb: interrupted" in line), None)
    resume_at = next((t for t, line in lines if RESUME_MARK in line), None)
    left = mentioning(str(private))
    return {"seconds_to_first_line": None if said_at is None else round(said_at - sent, 3),
            "seconds_to_resume_line": None if resume_at is None else round(resume_at - sent, 3),
            "seconds_to_exit": round(ended - sent, 3), "returncode": proc.returncode,
            "finished_samples": finished(runs / "bench"), "queued_samples": 20,
            "processes_left": len(left), "folders_left": len(list(private.iterdir()))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for results.json and results.md")
    parser.add_argument("--repeats", type=int, default=3, help="runs interrupted (default 3)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pkb-interrupt-") as tmp:
        rows = [one(Path(tmp), i) for i in range(args.repeats)]
    exits = [r["seconds_to_exit"] for r in rows]
    summary = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.node(),
               "cpus": os.cpu_count(), "load_average": os.getloadavg(), "command": " ".join(sys.argv),
               "runs": rows, "median_seconds_to_exit": statistics.median(exits), "max_seconds_to_exit": max(exits)}
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    head = ("run", "to 'interrupted' s", "to resume line s", "to exit s", "exit code", "finished of 20",
            "processes left", "folders left")
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows):
        table.append(f"| {i} | {r['seconds_to_first_line']} | {r['seconds_to_resume_line']} | "
                     f"{r['seconds_to_exit']} | {r['returncode']} | "
                     f"{r['finished_samples']} | {r['processes_left']} | {r['folders_left']} |")
    text = "\n".join([f"Ctrl-C of `pkb run` (20 queued samples, CPU), {summary['date']}, {summary['cpus']} CPUs, "
                      f"load {summary['load_average'][0]:.1f}", "", *table, ""])
    (out / "results.md").write_text(text)
    print(text)
    return 0 if all(r["returncode"] == 130 and not r["processes_left"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
