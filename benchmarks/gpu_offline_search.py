"""An offline kernel search on one GPU (issue 30): `pkb search --model scripted:mutator` (no API key, the
expert CUDA kernels' tunables mutated) at W = 2 with both ranks on the GPU, for a fixed time, then how busy
the GPU was and how many candidates it judged per GPU-hour. Ends by itself.

    setsid nohup python benchmarks/gpu_offline_search.py --out .search-out --minutes 12 > /dev/null 2>&1 &
    # ... later, in another command: cat .search-out/search.md; cp -r .search-out $OUT/
    python benchmarks/gpu_offline_search.py --out /tmp/s --device cpu --minutes 2   # the dry run on CPU

Two figures of busy: `held` is the search's own (the fraction of wall time an evaluation held the GPU,
agent.search.summary.throughput), `sm` the mean of nvidia-smi's utilization.gpu sampled every half
second (kernels running). Writes OUT/search.json and OUT/search.md; the search folder is OUT/runs/offline.
Needs what `pkb search` needs (pydantic, structlog, tenacity, langgraph, langchain-core, rich, tiktoken,
cupy for the experts' NVRTC builds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.search.archive import Archive  # noqa: E402
from agent.search.summary import throughput  # noqa: E402
from benchmarks.budgeted_child import Segments, run_for  # noqa: E402
from harness.emulation.layout import gpus_needed  # noqa: E402

# The checkout first; what the caller's path held after it (a GPU machine's carried wheels, say).
REPO_FIRST = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
# The search's segments (one per machine it ran on), kept beside the search folder.
SEGMENTS = "search-segments.json"
PROBLEMS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_reduce_residual_rmsnorm")


class SmSampler:
    """nvidia-smi's utilization.gpu every 500 ms, in a thread, until stopped."""

    def __init__(self) -> None:
        self.values: list[float] = []
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return
        self._proc = subprocess.Popen([smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                       "-lms", "500"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                self.values.append(float(line.split(",")[0]))
            except ValueError:
                continue

    def stop(self) -> float | None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        return sum(self.values) / len(self.values) / 100.0 if self.values else None


def sm_over(segments: list[dict[str, Any]]) -> float | None:
    """nvidia-smi's mean utilization over every segment, each weighted by its samples."""
    samples = sum(int(x.get("sm_samples") or 0) for x in segments if x.get("sm_busy") is not None)
    if not samples:
        return None
    return sum(float(x["sm_busy"]) * int(x["sm_samples"]) for x in segments if x.get("sm_busy") is not None) / samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=12.0, help="the search's wall budget")
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the dry run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true",
                        help="continue the search in OUT/runs (carried from another machine): pkb search counts "
                             "its budget over every session, and busy is taken over every segment")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: the figures of the search in OUT/runs as its last copy holds them (a "
                             "device call that ended before the search did brings back the folder, not the report)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.out / "runs"
    if (args.resume or args.report_only) and not (runs / "offline").is_dir():
        parser.error(f"no search in {runs}")
    if args.report_only:
        segments = json.loads((runs / SEGMENTS).read_text()) if (runs / SEGMENTS).exists() else []
        print(report(args, segments, command=None, exit_code=None,
                     ended=f"report from the folder ({segments[-1]['ended'] if segments else 'no segments'})"))
        return 0
    if args.resume:
        # The stored config is what runs; pkb search refuses config options given again.
        command = [sys.executable, "-m", "agent.cli", "search", "--run-id", "offline", "--runs-dir", str(runs),
                   "--resume", "--no-live"]
    else:
        shutil.rmtree(runs / "offline", ignore_errors=True)
        (args.out / "search.log").unlink(missing_ok=True)
        command = [sys.executable, "-m", "agent.cli", "search", "--model", "scripted:mutator", "--device",
                   args.device, "--world-size", "2", "--problems", *args.problems, "--budget-hours",
                   f"{args.minutes / 60:.4f}", "--seed", str(args.seed), "--runs-dir", str(runs), "--run-id",
                   "offline", "--no-live"]
        if args.device == "cuda":
            command += ["--ranks-per-gpu", "2"]
    runs.mkdir(parents=True, exist_ok=True)
    history = Segments(runs / SEGMENTS, resume=args.resume)
    sampler = SmSampler()
    sampler.start()
    # The budget, and time to finish what is in flight; stopped sooner by our caller, it still writes what it has.
    child = run_for(command, cwd=REPO, log=args.out / "search.log", budget_s=args.minutes * 60 + 300,
                    env={**os.environ, "PYTHONPATH": REPO_FIRST}, on_tick=history.update)
    segment_sm = sampler.stop()
    segments = history.update(child.wall_s, child.ended, sm_busy=segment_sm, sm_samples=len(sampler.values))
    print(report(args, segments, command=command, exit_code=child.returncode, ended=child.ended))
    return 0


def report(args: argparse.Namespace, segments: list[dict[str, Any]], *, command: list[str] | None,
           exit_code: int | None, ended: str) -> str:
    """OUT/search.json and OUT/search.md from the search folder and its segments; the markdown."""
    wall_s = sum(float(x["wall_s"]) for x in segments)
    sm = sm_over(segments)
    runs = args.out / "runs"
    folder = runs / "offline"
    # What the search ran with, from its own record (a report from the folder has no options of its own).
    stored = folder / "search.json"
    config = json.loads(stored.read_text()).get("config", {}) if stored.exists() else {}
    device = config.get("device", args.device)
    ranks_per_gpu = int(config.get("ranks_per_gpu") or (2 if device == "cuda" else 1))
    wall_hours = (config.get("budget") or {}).get("wall_hours")
    minutes = 60 * float(wall_hours) if wall_hours else args.minutes
    stats: dict[str, Any] = {}
    verdicts: dict[str, int] = {}
    if (folder / "archive.sqlite").exists():
        archive = Archive(folder / "archive.sqlite")
        # One evaluation holds the GPUs its ranks need: both ranks share one GPU here (2026-12-02's figure passed 2
        # and halved the busy fraction).
        stats = throughput(archive, gpus_needed(2, ranks_per_gpu))
        for row in archive.rows(("verdict",)):
            verdict = "not judged" if row["verdict"] is None else str(row["verdict"])  # in flight at the end
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
    record = {"command": command, "exit_code": exit_code, "ended": ended, "wall_s": round(wall_s, 1),
              "segments": segments,
              "sm_busy": sm,
              "held_busy": stats.get("busy_fraction"), "candidates": stats.get("candidates"),
              "candidates_per_device_hour": stats.get("candidates_per_device_hour"),
              "candidates_per_hour": stats.get("candidates_per_hour"),
              "seconds_per_candidate": stats.get("seconds_per_candidate"), "verdicts": verdicts}
    (args.out / "search.json").write_text(json.dumps(record, indent=1, default=str))

    def pct(x: float | None) -> str:
        return f"{100 * x:.0f}%" if x is not None else "-"

    per = stats.get("seconds_per_candidate") or {}
    text = "\n".join([
        f"# Offline search, {device}, W = 2{' on one GPU (emulated)' if ranks_per_gpu == 2 else ''}", "",
        "| | |", "|---|---|",
        f"| wall | {wall_s:.0f} s{f' over {len(segments)} segments (resumed)' if len(segments) > 1 else ''} "
        f"(budget {minutes:.1f} min), exit {exit_code}, {ended} |",
        f"| candidates | {stats.get('candidates', 0)} ({', '.join(f'{k} {v}' for k, v in sorted(verdicts.items()))}) |",
        f"| GPU held by an evaluation | {pct(stats.get('busy_fraction'))} |",
        f"| GPU utilization (nvidia-smi, mean) | {pct(sm)} |",
        f"| candidates per device-hour | {stats.get('candidates_per_device_hour') or 0:.0f} |",
        f"| candidates per wall hour | {stats.get('candidates_per_hour') or 0:.0f} |",
        "| seconds per candidate | " + ", ".join(f"{k} {v:.2f}" for k, v in per.items() if v is not None) + " |",
    ]) + "\n"
    (args.out / "search.md").write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
