"""Every reference of a PKB checkout judged against itself on CPU (the reference file as the candidate), the
ranks on the emulation's host collectives (`pkbhost`, docs/emulation.md), as every CPU evaluation runs them.

    python benchmarks/pkb_references.py CHECKOUT [--world-size 2] [--shape small] [--trials 2] [--timing]
        [--problems 1 2 ...] [--memory-gib 8] [--timeout 900] [--json OUT.json] [--markdown OUT.md]

Each problem runs in a child process through harness.evaluate.evaluate, so one that crashes the harness, runs
out of memory or hangs past --timeout is a row of the table, not the end of the run. Every process of that
child (the ranks included) is held to --memory-gib of address space: PKB's 68 allocates about 13 GiB a
rank even at the small shape, which would otherwise take a shared CPU machine down. A reference that cannot
run here gets its reason: the environment (harness.compiling.requirements.environment_issue, the reason the lead's
evaluate() reports as infra_error once wired), or the verdict and the first line of the failure.

Writes a Markdown table (problem, verdict, seconds, reason) and JSON; results go in docs/measurements/pkb-runs.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The checkout first; what the caller's path held after it (a GPU machine's carried wheels, say).
REPO_FIRST = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)


def judge_one(spec: str, world_size: int, shape: str, trials: int, timing: bool) -> dict[str, Any]:
    """In the child: evaluate one reference against itself; everything the table needs, as JSON."""
    sys.path.insert(0, str(REPO))
    from harness.compiling.requirements import environment_issue
    from harness.config import EvalConfig, TimingConfig
    from harness.evaluate import evaluate
    from harness.problems.registry import load_problem_spec

    problem = load_problem_spec(spec)
    row: dict[str, Any] = {"problem": problem.name,
                           "environment": environment_issue(problem, problem.path, "cpu")}
    config = EvalConfig(trials=trials, skip_timing=not timing, timing=TimingConfig.for_device("cpu"))
    started = time.perf_counter()
    try:
        result = evaluate(problem, problem.path, world_size=world_size, device="cpu", shape=shape, config=config)
    except BaseException as exc:  # the harness itself failed on this problem: that is the finding
        row.update(verdict="harness crash", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    else:
        failure = result.failure
        row.update(verdict=result.verdict, reason=(failure.message.splitlines()[0][:300] if failure else ""),
                   phase=failure.phase if failure else None, flags=result.flags,
                   speedup=result.speedup, stages=result.stages)
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def _limit_memory(gib: float) -> None:
    limit = int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # inherited by the ranks the child starts


def run_one(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--one", spec, "--world-size", str(args.world_size), "--shape", args.shape,
               "--trials", str(args.trials), *(["--timing"] if args.timing else [])]
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, cwd=str(REPO),
                              env={**os.environ, "PYTHONPATH": REPO_FIRST},
                              preexec_fn=lambda: _limit_memory(args.memory_gib), start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        _kill_session(exc)
        return {"problem": spec.rsplit("::", 1)[-1][:-3], "verdict": "benchmark timeout",
                "reason": f"no result within {args.timeout:.0f} s", "seconds": round(time.perf_counter() - started, 1)}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return {"problem": spec.rsplit("::", 1)[-1][:-3], "verdict": "benchmark child died",
                "reason": tail[:300], "seconds": round(time.perf_counter() - started, 1)}
    return json.loads(lines[-1])


def _kill_session(exc: subprocess.TimeoutExpired) -> None:
    """The child leads its own session; a timeout ends it and everything it started (its ranks)."""
    import signal

    proc = getattr(exc, "process", None)
    pid = getattr(proc, "pid", None)
    if pid:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace, checkout: Path) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    head = [f"Checkout {checkout} (commit {args.commit or 'unknown'}), world size {args.world_size}, "
            "host collectives (pkbhost), "
            f"shape {args.shape!r}, {args.trials} trials, timing {'on' if args.timing else 'off'}, "
            f"{args.memory_gib:g} GiB address space per process.", "",
            "Verdicts: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1])), "",
            "| problem | verdict | s | reason | environment_issue |", "|---|---|---|---|---|"]
    for r in rows:
        reason = (r.get("reason") or "").replace("|", "\\|")
        env = (r.get("environment") or "").replace("|", "\\|")
        head.append(f"| {r['problem']} | {r['verdict']} | {r.get('seconds', '')} | {reason} | {env} |")
    return "\n".join(head) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", nargs="?", type=Path)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--shape", default="small")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--problems", nargs="*", default=None, help="PKB ids or stems (default: all)")
    parser.add_argument("--memory-gib", type=float, default=8.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--commit", default=None, help="the checkout's commit, for the table's header")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(judge_one(args.one, args.world_size, args.shape, args.trials, args.timing)))
        return 0
    sys.path.insert(0, str(REPO))
    from harness.problems.parallelkernelbench import checkout

    problems = checkout.list_problems(args.checkout)
    if args.problems:
        wanted = set(args.problems)
        problems = [p for p in problems if p.name in wanted or str(checkout.problem_id(p)) in wanted]
    rows = []
    for problem in problems:
        row = run_one(problem.loader_spec, args)
        rows.append(row)
        print(f"{row['problem']}: {row['verdict']} ({row.get('seconds')} s) {row.get('reason') or ''}"[:240],
              flush=True)
        if args.json:  # kept up to date: a long run can be read while it goes
            args.json.write_text(json.dumps(rows, indent=2) + "\n")
    table = markdown(rows, args, args.checkout.resolve())
    if args.markdown:
        args.markdown.write_text(table)
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
