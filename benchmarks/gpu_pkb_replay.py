"""A PKB recorded set replayed on one GPU with emulated W = 2 (issue 30), in one command with a wall budget:
`pkb run --model replay:SET --source pkb:CHECKOUT --device cuda --world-size 2 --ranks-per-gpu 2 --no-timing
--trials 3 --concurrency C`, stopped at the budget, then a table of verdicts per file beside the
2026-12-01 figures (docs/measurements/pkb-runs.md), and where every infra_error comes from.

    python benchmarks/gpu_pkb_replay.py --checkout .pkb/first \\
        --set .pkb/first/solutions_cuda_bf16_h100_8_openai_gpt-5.5 --out $OUT --concurrency 12 --budget-s 510
    python benchmarks/gpu_pkb_replay.py ... --device cpu --limit 3      # the dry run: the plumbing on CPU

Writes OUT/replay.json (a row per file: verdict, seconds, compile and in-call build seconds, the failure's
first line, the infra_error's cause) and OUT/replay.md, prints the summary last. The run folder is
OUT/runs/replay (docs/run-layout.md). Needs what `pkb run` needs (pydantic, structlog, tenacity, langgraph,
langchain-core, rich, tiktoken: carry their wheels to a GPU machine without them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.report.leases import last_pass_summary  # noqa: E402
from benchmarks.budgeted_child import ChildRun, Segments, run_for  # noqa: E402
from harness.emulation import rewrite_record  # noqa: E402
from harness.problems.parallelkernelbench.multicast import multicast_reason  # noqa: E402

# The replay's segments (one per machine it ran on), kept beside the run folder.
SEGMENTS = "replay-segments.json"
# The checkout first; what the caller's path held after it (a GPU machine's carried wheels, say).
REPO_FIRST = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)

# 2026-12-01, one H200, the same command at --concurrency 8..14 in three batches (issue 30,
# docs/measurements/pkb-runs.md).
BEFORE: dict[str, Any] = {"finished": "74 of 79 (5 unfinished after 16 more minutes; 4 not started)",
          "verdicts": {"correct": 23, "output_mismatch": 12, "runtime_error": 10, "compile_error": 5,
                       "shape_mismatch": 1, "deadlock": 1, "infra_error": 22},
          "infra_error": "5 multicast (right), 17 the one-GPU mode's collectives (gloo)",
          "wall": "about 27 min for 74 files"}

# How an infra_error's message names its cause.
CAUSES = (
    ("multicast (refused: must never run here)", ("multicast", "multimem", "NVLS")),
    ("gloo / emulation collectives", ("gloo", "Gloo", "does not support alltoall", "Bad address",
                                      "Connection closed by peer", "invalid tensor size")),
    ("reference too slow (derived limit)", ("derived from the reference's measured cost", "reference_call_s")),
    ("reference failed", ("the reference raised", "the reference pool", "the reference did not finish")),
    ("environment (package, CUDA)", ("needs the package", "is not installed", "needs CUDA")),
    ("not available in emulation (other)", ("not available in emulation",)),
)


def cause_of(message: str) -> str:
    for cause, needles in CAUSES:
        if any(n in message for n in needles):
            return cause
    return "other: " + message.splitlines()[0][:120] if message else "other"


def run_replay(args: argparse.Namespace, set_dir: Path, runs: Path, history: Segments) -> ChildRun:
    command = [sys.executable, "-m", "agent.cli", "run", "--model", f"replay:{set_dir}",
               "--source", f"pkb:{args.checkout.resolve()}", "--device", args.device, "--world-size", "2",
               "--no-timing", "--trials", "3", "--concurrency", str(args.concurrency),
               "--runs-dir", str(runs), "--run-id", "replay"]
    if args.resume:
        command.append("--resume")
    if args.device == "cuda":
        command += ["--ranks-per-gpu", "2", "--evaluations-per-gpu", str(args.evaluations_per_gpu)]
    print("$", " ".join(command), flush=True)
    # The runner ends its evaluations (and their pools) on SIGTERM, and a resumed run keeps what finished.
    return run_for(command, cwd=REPO, log=args.out / "replay.log", budget_s=args.budget_s,
                   env={**os.environ, "PYTHONPATH": REPO_FIRST}, on_tick=history.update)


def rows_of(run: Path, files: list[str], set_dir: Path) -> list[dict[str, Any]]:
    matches = json.loads((run / "replay_matches.json").read_text()) if (run / "replay_matches.json").exists() else {}
    by_problem = {m.get("problem"): m.get("file") for m in matches.get("files", []) if isinstance(m, dict)}
    rows = []
    seen = set()
    for sample in sorted(run.glob("samples/*/*/*/sample.json")):
        record = json.loads(sample.read_text())
        result_path = sample.parent / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
        failure = result.get("failure") or {}
        message = str(failure.get("message") or record.get("error") or "")
        stages = result.get("stages") or {}
        executor = (result.get("environment") or {}).get("executor") or {}
        row = {"file": by_problem.get(record["problem"], ""), "problem": record["problem"],
               "status": record.get("status"), "verdict": record.get("verdict"),
               "seconds": record.get("wall_s"),
               # the build happens before the GPU lease (agent.executors.local); the compile stage then hits the cache
               "compile_s": executor.get("build_before_lease_s", stages.get("compile")),
               "held_s": executor.get("held_s"),
               "build_in_call_s": stages.get("build_in_call"), "reference_s": stages.get("reference"),
               "check_s": stages.get("check"),  # the calls and the judge's comparisons, with the GPU leased
               "reason": message.splitlines()[0][:200] if message else "",
               "reference_cost": (result.get("integrity") or {}).get("reference_cost"),
               "shared": bool(executor.get("shared")), "judged_again_alone": executor.get("judged_again_alone"),
               # the trusted side's record of builds rewritten for multimem (harness.emulation.rewrite_record)
               "multimem_rewritten": rewrite_record.of_result(result)}
        if row["verdict"] == "infra_error":
            row["cause"] = cause_of(message)
        rows.append(row)
    for row in rows:  # a file that uses NVLink multicast runs here only through the multimem rewrite (issue 48)
        row["multicast"] = bool(row["file"]) and multicast_reason(set_dir / row["file"]) is not None
        seen.add(row["file"])
    for name in files:
        if name not in seen and not any(r["file"] == name for r in rows):
            rows.append({"file": name, "problem": "", "status": "not started", "verdict": None,
                         "multicast": multicast_reason(set_dir / name) is not None})
    return rows


def _seconds(value: Any) -> str:
    return f"{float(value):.1f}" if value is not None else ""


def markdown(rows: list[dict[str, Any]], wall_s: float, finished: bool, args: argparse.Namespace,
             segments: int = 1) -> str:
    done = [r for r in rows if r.get("status") == "finished"]
    verdicts = Counter(r["verdict"] for r in done)
    causes = Counter(r.get("cause") for r in done if r["verdict"] == "infra_error")
    seconds = sorted(float(r["seconds"]) for r in done if r.get("seconds") is not None)
    compile_s = sorted(float(r["compile_s"]) for r in done if r.get("compile_s"))
    again = [r for r in done if r.get("judged_again_alone")]  # the visible shape's result (as every column)

    def median(xs: list[float]) -> str:
        return f"{xs[len(xs) // 2]:.1f}" if xs else "-"

    # The 2026-12-01 column is GPT-5.5's set; another set's table has only its own column.
    before = BEFORE if "openai_gpt-5.5" in args.set.name else None

    def was(text: str) -> str:
        return f" {text} |" if before else ""

    multicast = [r for r in rows if r.get("multicast")]
    multicast_verdicts = Counter(str(r["verdict"] or r.get("status")) for r in multicast)
    lines = [f"# Replay of {args.set.name} on one GPU, emulated W = 2", "",
             f"Command wall: {wall_s:.0f} s"
             f"{f' over {segments} segments (resumed)' if segments > 1 else ''} "
             f"(budget {args.budget_s:.0f} s{' a segment' if segments > 1 else ''}, "
             f"{'finished' if finished else 'stopped before the end'}), concurrency {args.concurrency}, "
             f"evaluations per GPU {args.evaluations_per_gpu}, "
             f"device {args.device}.", "",
             "| | this run |" + was("2026-12-01"), "|---|---|" + ("---|" if before else ""),
             f"| files finished | {len(done)} of {len(rows)} |" + was(before["finished"] if before else ""),
             *[f"| {v} | {verdicts.get(v, 0)} |" + was(str(before["verdicts"].get(v, 0)) if before else "")
               for v in sorted(set(verdicts) | set(before["verdicts"] if before else ()), key=str)],
             f"| infra_error causes | {', '.join(f'{c}: {n}' for c, n in causes.most_common()) or '-'} |"
             + was(before["infra_error"] if before else ""),
             f"| multicast files (rewritten to unicast) | {len(multicast)}: "
             f"{', '.join(f'{v}: {n}' for v, n in multicast_verdicts.most_common()) or '-'} |"
             + was("refused"),
             f"| results whose build was rewritten for multimem | "
             f"{sum(1 for r in rows if r.get('multimem_rewritten'))} |" + was("-"),
             f"| wall | {wall_s:.0f} s |" + was(before["wall"] if before else ""),
             f"| sample wall, median | {median(seconds)} s |" + was("149 s"),
             f"| shared the GPU / judged again alone (same verdict alone) | {sum(1 for r in done if r.get('shared'))}"
             f" / {len(again)} ({sum(1 for r in again if r['judged_again_alone'] == r['verdict'])}) |" + was("-"),
             f"| compile stage, median (p90) | {median(compile_s)} s "
             f"({compile_s[int(0.9 * (len(compile_s) - 1))]:.1f} s) |" + was("-") if compile_s
             else "| compile stage | - |" + was("-"),
             "",
             "| file | multicast | problem | verdict | s | compile s | build in call s | GPU held s | check s "
             "| cause / reason |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (int(r["file"].split("_")[0]) if r["file"][:1].isdigit() else 999,
                                         r["file"])):
        reason = r.get("cause") or r.get("reason") or r.get("status") or ""
        mark = "yes" if r.get("multicast") else ""
        if r.get("multimem_rewritten"):
            mark = f"{mark or 'no'}, rewritten: {rewrite_record.describe(r['multimem_rewritten'])}"
        lines.append(f"| {r['file']} | {mark} | {r['problem']} | {r['verdict'] or r.get('status')} "
                     f"| {r.get('seconds') or ''} "
                     f"| {r.get('compile_s') or ''} | {r.get('build_in_call_s') or ''} | {_seconds(r.get('held_s'))} "
                     f"| {_seconds(r.get('check_s'))} | {str(reason).replace('|', '/')[:140]} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", type=Path, required=True, help="PKB's first commit (holds the sets)")
    parser.add_argument("--set", type=Path, required=True, help="the solution set folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--evaluations-per-gpu", type=int, default=1,
                        help="untimed evaluations that may hold the GPU at once (pkb run's option)")
    parser.add_argument("--budget-s", type=float, default=510.0, help="stop the replay after this many seconds")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the dry run")
    parser.add_argument("--limit", type=int, default=None, help="only the first N files (by number)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the replay in OUT/runs (carried from another machine): finished files are "
                             "kept, and the wall is summed over the segments")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    files = sorted((p.name for p in args.set.glob("*.py")), key=lambda n: (int(n.split("_")[0]), n))
    set_dir = args.set.resolve()
    if args.limit is not None:
        # Staged inside OUT and kept, so a resumed run finds the same path.
        files = files[:args.limit]
        set_dir = (args.out / "set" / args.set.name).resolve()
        set_dir.mkdir(parents=True, exist_ok=True)
        for name in files:
            shutil.copy(args.set / name, set_dir / name)
    runs = args.out / "runs"
    if args.resume and not (runs / "replay").is_dir():
        parser.error(f"--resume: no replay to continue in {runs}")
    if not args.resume:
        shutil.rmtree(runs / "replay", ignore_errors=True)
        (args.out / "replay.log").unlink(missing_ok=True)
    runs.mkdir(parents=True, exist_ok=True)
    history = Segments(runs / SEGMENTS, resume=args.resume)
    child = run_replay(args, set_dir, runs, history)
    segments = history.update(child.wall_s, child.ended)
    wall_s = history.wall_s
    finished = child.ended == "done"
    rows = rows_of(runs / "replay", files, set_dir)
    events = runs / "replay" / "events.jsonl"
    leases = last_pass_summary(events) if events.exists() else []
    (args.out / "replay.json").write_text(json.dumps({
        "wall_s": wall_s, "finished": finished, "segments": segments, "rows": rows, "before": BEFORE,
        "concurrency": args.concurrency,
        "evaluations_per_gpu": args.evaluations_per_gpu, "leases": leases}, indent=1))
    text = markdown(rows, wall_s, finished, args, len(segments))
    if leases:
        text += "\nThe GPU lease (agent.report.leases, from events.jsonl):\n\n" + "".join(f"- {x}\n" for x in leases)
    (args.out / "replay.md").write_text(text)
    print("\n".join(text.splitlines()[:18]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
