"""Edit -> verdict: an agent-like sequence through the real agent loop, a candidate then edits to its kernel only.

    python -m benchmarks.edit_verdict [--device cuda|cpu] [--problems all_reduce all_gather] [--edits 5]
        [--shape NAME] [--world-size 2] [--ranks-per-gpu 2] [--out DIR] [--warm-cache]
    python -m benchmarks.edit_verdict --read OUT/runs [--problems ...]   # the table of runs already made

For each problem a scripted model (agent/scripted.py) calls check(v0), check(v1) ... check(vN), then submits vN,
through `python -m agent.cli run --condition agent:check` (one run per problem, one after the other, so no
build or GPU is shared). v0..vN come from one template in benchmarks/edit_candidates/ with only a constant of the
kernel's body changed (`$unroll`: an unroll factor on CUDA, a chunk size in the CPU dry run), never hand copies:
every version computes the same result. On CUDA the candidates are load_inline in the split layout the task prompt
recommends (cuda_sources without torch headers, the torch wrapper in cpp_sources), on symmetric memory.

From each run's files (events.jsonl: a check's call starts at the model reply that asked for it and ends at its
`tool` event; candidates/NNN.json: the check's result, with stages.compile and integrity.builds) the benchmark
takes per check: the wall (call -> answer), the compile stage's seconds, the builds' cache marks (`cache`: the
whole build from the compile cache; `binding_cache`: the binding unit from the object cache, where the build
record carries it) and the verdict. It prints a markdown table and writes OUT/edit_verdict.json: per problem the
first build's wall and the edits' walls, the median edit -> verdict over all edits, and whether every verdict was
correct. `--device cpu` is a dry run of the plumbing (PyTorch-only candidates, shape small).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import string
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.records.cache_dir import ENV_VAR as CACHE_ENV
from tools.build_note import binding_marks, build_records

TEMPLATES = Path(__file__).with_name("edit_candidates")
# problem -> template, per device: the CUDA pair on symmetric memory, and the dry run's PyTorch-only pair.
CANDIDATES = {
    "cuda": {"all_reduce": "all_reduce.py.template", "all_gather": "all_gather.py.template"},
    "cpu": {"all_reduce": "cpu_all_reduce.py.template", "all_gather": "cpu_all_gather.py.template"},
}
# The kernel-body constant of v0, v1, ...: each version differs from the last, and all compute the same result.
VARIANTS = (1, 2, 4, 8, 3, 6, 5, 7)
CONDITION = "agent:check"
TARGET_S = 20.0  # issue 48: median edit -> verdict on one GPU
DEFAULT_SHAPE = {"cuda": "decode", "cpu": "small"}  # decode: both problems have it, and a check stays short


@dataclass
class Check:
    """One check call of the sequence, as its run's files record it."""

    step: int  # 0: the first build; k: the k-th edit
    wall_s: float  # the model's reply asking for the call -> the tool's answer
    compile_s: float | None  # the evaluation's compile stage
    build_cache: str | None  # the compile stage's own cache: "hit" (this very source built before) or "miss"
    binding_cache: str | None  # the binding unit from the object cache ("hit", "miss", ...), where recorded
    verdict: str | None
    correct: bool


def versions(template: str, count: int) -> list[str]:
    """v0 .. v{count-1} of a candidate: the template with its kernel constant taken from VARIANTS in turn."""
    if not 1 <= count <= len(VARIANTS):
        raise ValueError(f"between 1 and {len(VARIANTS)} versions (a first build and up to {len(VARIANTS) - 1} edits)")
    return [string.Template(template).substitute(unroll=value) for value in VARIANTS[:count]]


def script_steps(sources: list[str]) -> list[list[Any]]:
    """The scripted model's steps: check every version in turn, then submit the last."""
    return [["tool", "check", {"source": s}] for s in sources] + [["tool", "submit", {"source": sources[-1]}]]


def run_id(problem: str) -> str:
    return f"edit-verdict-{problem}"


def run_command(problem: str, script: Path, runs_dir: Path, args: argparse.Namespace) -> list[str]:
    place = ["--device", args.device, "--world-size", str(args.world_size)]
    if args.device == "cuda":
        place += ["--ranks-per-gpu", str(args.ranks_per_gpu)]
    return [sys.executable, "-m", "agent.cli", "run", "--model", f"scripted:{script}", "--condition", CONDITION,
            "--problems", problem, *place, "--shape", args.shape, "--no-timing", "--runs-dir", str(runs_dir),
            "--run-id", run_id(problem)]


def run_problem(problem: str, args: argparse.Namespace) -> int:
    """One agent run of the sequence on `problem`; its output lands in OUT/<problem>.log. Returns its exit code."""
    template = (TEMPLATES / CANDIDATES[args.device][problem]).read_text()
    script = args.out / f"{problem}.script.json"
    script.write_text(json.dumps(script_steps(versions(template, args.edits + 1))))
    runs_dir = args.out / "runs"
    shutil.rmtree(runs_dir / run_id(problem), ignore_errors=True)  # a new sequence, not a resumed one
    log_path = args.out / f"{problem}.log"
    with tempfile.TemporaryDirectory(prefix="edit-verdict-cache-") as cache, open(log_path, "w") as log:
        # A cache of its own (builds, binding units): the first build is cold even where these sources were
        # built before, e.g. a second run on the same machine.
        env = dict(os.environ) if args.warm_cache else {**os.environ, CACHE_ENV: cache}
        return subprocess.run(run_command(problem, script, runs_dir, args), stdout=log, stderr=subprocess.STDOUT,
                              env=env, check=False).returncode


def _time(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00"))


def _events(path: Path, problem: str) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a torn line of a killed run
        if isinstance(event, dict) and event.get("problem") == problem and "timestamp" in event:
            events.append(event)
    return events


def binding_mark(builds: Any) -> str | None:
    """The binding unit's cache marks (tools.build_note reads them defensively: the field may be missing)."""
    return "+".join(binding_marks(builds)) or None


def build_mark(builds: Any) -> str | None:
    """The compile stage's own cache marks: "hit" (this very source built before) or "miss"."""
    marks = sorted({b["cache"] for b in build_records(builds) if isinstance(b.get("cache"), str)})
    return "+".join(marks) or None


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def check_record(step: int, wall_s: float, record: dict[str, Any]) -> Check:
    """A Check from the tool's saved record (candidates/NNN.json: the answer's `data`, the EvalResult within)."""
    data = _object(record.get("data"))
    result = _object(data.get("result"))
    stages, integrity = _object(result.get("stages")), _object(result.get("integrity"))
    compile_s = stages.get("compile")
    builds = integrity.get("builds")
    executor = _object(_object(result.get("environment")).get("executor"))
    if executor.get("builds"):  # on a GPU: the build made before the lease (the stage within it found it cached)
        compile_s, builds = executor.get("build_before_lease_s"), executor["builds"]
    return Check(step=step, wall_s=round(wall_s, 3),
                 compile_s=float(compile_s) if isinstance(compile_s, (int, float)) else None,
                 build_cache=build_mark(builds), binding_cache=binding_mark(builds),
                 verdict=data.get("verdict") if isinstance(data.get("verdict"), str) else None,
                 correct=data.get("correct") is True)


def read_checks(runs_dir: Path, problem: str) -> list[Check]:
    """Every check call of `problem`'s run, in order: its wall from events.jsonl, the rest from its record."""
    run = runs_dir / run_id(problem)
    sample = run / "samples" / problem / CONDITION / "0"
    checks: list[Check] = []
    asked: datetime | None = None
    for event in _events(run / "events.jsonl", problem):
        if event.get("event") == "model_reply":
            asked = _time(event) if event.get("tool_calls") == ["check"] else None
        elif event.get("event") == "tool" and event.get("tool") == "check" and asked is not None:
            name = Path(str(event.get("candidate") or "")).with_suffix(".json").name
            record_path = sample / "candidates" / name
            record = json.loads(record_path.read_text()) if name and record_path.is_file() else {}
            checks.append(check_record(len(checks), (_time(event) - asked).total_seconds(),
                                       record if isinstance(record, dict) else {}))
            asked = None
    return checks


def final_verdict(runs_dir: Path, problem: str) -> str | None:
    path = runs_dir / run_id(problem) / "samples" / problem / CONDITION / "0" / "sample.json"
    if not path.is_file():
        return None
    verdict = json.loads(path.read_text()).get("verdict")
    return verdict if isinstance(verdict, str) else None


def summarize(checks: dict[str, list[Check]], finals: dict[str, str | None]) -> dict[str, Any]:
    """Per problem the first build's wall and the edits' walls; over all edits the median edit -> verdict."""
    problems: dict[str, Any] = {}
    edits: list[float] = []
    for problem, calls in checks.items():
        walls = [c.wall_s for c in calls[1:]]
        edits += walls
        problems[problem] = {
            "first_build_s": calls[0].wall_s if calls else None,
            "edit_walls_s": walls,
            "median_edit_s": statistics.median(walls) if walls else None,
            "all_correct": bool(calls) and all(c.correct for c in calls),
            "final_verdict": finals.get(problem),
            "checks": [asdict(c) for c in calls],
        }
    median = statistics.median(edits) if edits else None
    return {"problems": problems, "edits": len(edits), "median_edit_s": median, "target_s": TARGET_S,
            "met": median is not None and median <= TARGET_S
            and all(p["all_correct"] for p in problems.values())}


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def table(summary: dict[str, Any]) -> str:
    lines = ["| problem | step | wall s | compile s | build cache | binding unit | verdict |",
             "|---|---|---|---|---|---|---|"]
    for problem, found in summary["problems"].items():
        for c in found["checks"]:
            step = "first build" if c["step"] == 0 else f"edit {c['step']}"
            lines.append(f"| {problem} | {step} | {_cell(c['wall_s'])} | {_cell(c['compile_s'])} | "
                         f"{_cell(c['build_cache'])} | {_cell(c['binding_cache'])} | {_cell(c['verdict'])} |")
    firsts = ", ".join(f"{p} {_cell(f['first_build_s'])} s" for p, f in summary["problems"].items())
    setting = f" ({summary['device']}, shape {summary['shape']})" if "device" in summary else ""
    lines += ["", f"median edit -> verdict over {summary['edits']} edits{setting}: {_cell(summary['median_edit_s'])} s "
              f"(target <= {TARGET_S:g} s: {'met' if summary['met'] else 'not met'}); first build: {firsts}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--problems", nargs="+", default=["all_reduce", "all_gather"],
                        choices=sorted(CANDIDATES["cuda"]))
    parser.add_argument("--edits", type=int, default=5)
    parser.add_argument("--shape", default=None, help="default: decode on cuda, small on cpu")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--ranks-per-gpu", type=int, default=2, help="with --device cuda (default 2: one GPU)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/edit-verdict"))
    parser.add_argument("--warm-cache", action="store_true",
                        help="use this machine's build cache (default: an empty one per problem: a cold first build)")
    parser.add_argument("--read", type=Path, default=None, metavar="RUNS_DIR",
                        help="only read the runs already in RUNS_DIR (no run)")
    args = parser.parse_args(argv)
    args.shape = args.shape or DEFAULT_SHAPE[args.device]
    args.out.mkdir(parents=True, exist_ok=True)
    runs_dir = args.read or args.out / "runs"
    codes: dict[str, int] = {}
    for problem in args.problems:
        if args.read is None:
            codes[problem] = run_problem(problem, args)
    checks = {p: read_checks(runs_dir, p) for p in args.problems}
    summary = summarize(checks, {p: final_verdict(runs_dir, p) for p in args.problems})
    summary.update(device=args.device, shape=args.shape, world_size=args.world_size, exit_codes=codes,
                   ranks_per_gpu=args.ranks_per_gpu if args.device == "cuda" else None)
    (args.out / "edit_verdict.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary))
    complete = all(len(checks[p]) == args.edits + 1 for p in args.problems) or args.read is not None
    return 0 if complete and not any(codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
