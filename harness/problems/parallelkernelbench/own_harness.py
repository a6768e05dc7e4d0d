"""PKB's own harness as a second scorer: one solution judged by the checkout's run_local.py.

`score_with_pkb(checkout, solution, problem, world_size)` runs what `python run_local.py --mode eval
--measure-perf` does in the checkout (per trial: a torchrun job of the reference, then one of the
solution, each rank saving its outputs; then PKB's own comparison and speedup), at the world size given,
and returns PKB's verdict and speedup as a PkbVerdict. Nothing of PKB is imported here and none of its
code is copied: the scripts run as they are, in a child process, and only their output is read.

How it runs, and why:
- in a temporary folder: run_local.py writes its staging under <its own folder>/logs, so the checkout's
  run_local.py, scripts/, utils/ and reference/ are copied there first (the checkout is never written),
  and the solution is copied in under the reference's stem, which PKB's run_local requires
  (`<stem>_<backend>.py`; recorded sets use older names);
- `torchrun` is a shim for `<this python> -m torch.distributed.run`, so the ranks use the interpreter and
  torch that run the rest (a `torchrun` elsewhere on PATH may be another one);
- a time limit around the whole evaluation (PKB has none: a hung kernel would wait forever), and every
  process it started ended afterwards, torchrun's own session included (harness.launch.contained_run);
- NVLink multicast off in every process (harness.common.safe_env.SAFE_ENV), extension and Triton caches inside the
  folder, the same dtype, base shape and tolerances passed explicitly (the first public commit's
  run_local defaults to float32 and 1e-5, the head's to bf16 and 1e-2);
- `--download` into the folder, so each rank's perf JSON is read too (PKB prints only the max over ranks).

PKB's verdict, read from its `PKB_EVAL_JSON:` line and its per-trial lines (parse_pkb_output), keeps
PKB's own words (`outcome`: match, tensor_mismatch, solution_failed, ...) and says the same in this
project's verdict vocabulary (`verdict`), so the two harnesses can be compared
(harness.problems.parallelkernelbench.rules).

Standard library only at import (the multicast switches are read from harness.launch.pool when a run starts): it
runs on machines without this project's other dependencies.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.common import hostile_files
from harness.common.safe_env import SAFE_ENV
from harness.launch.contained_run import RunOutcome, run_contained
from harness.launch.sandbox import clean_environment
from harness.records.redaction import redact_bytes

# What the checkout's run_local.py needs beside itself (reference/ is read by the input generator too).
CHECKOUT_PARTS = ("run_local.py", "scripts", "utils", "reference")
EVAL_JSON_PREFIX = "PKB_EVAL_JSON:"
DEFAULT_TIMEOUT_S = 1800.0
KEEP_BYTES, KEEP_FILES = 8 << 30, 100_000  # what `keep_dir` takes of PKB's logs and outputs at most
# PKB's per-trial line, as utils/run_utils.py prints it: "  trial 0: match | ref 1.234 ms | cuda 0.5 ms |
# speedup 2.47x" (the timing part only with --measure-perf; a mismatch puts its first error in between).
_TRIAL_RE = re.compile(r"^\s*trial (\d+): (match|mismatch)\b(.*)$")
_PERF_RE = re.compile(r"\| ref ([0-9.eE+-]+) ms \| (\S+) ([0-9.eE+-]+) ms \| speedup ([0-9.eE+-]+)x\s*$")
_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")
# What PKB's solution job said when its build failed, or its file could not be used as a solution.
_BUILD_FAILED = re.compile(r"Error building extension|ninja: build stopped|nvcc fatal", re.IGNORECASE)
_NO_SOLUTION = re.compile(r"AssertionError: 'solution' not found")
_SHAPE_WORDS = re.compile(r"tensor shape ref|sequence length ref|dict keys differ")

# PKB's outcome -> this project's verdict (harness.common.failures.Verdict). Outcomes are PKB's trial `result`
# words, plus four of ours: solution_failed / reference_failed (PKB's no_artifacts, split by which job
# failed), time_limit (our limit around PKB's run) and no_verdict (run_local printed no PKB_EVAL_JSON).
OUTCOME_VERDICTS = {
    "match": "correct",
    "tensor_mismatch": "output_mismatch",  # shape_mismatch when PKB's message is about shapes
    "path_mismatch": "output_mismatch",
    "load_error": "runtime_error",
    "missing_artifacts": "runtime_error",
    "solution_failed": "runtime_error",  # compile_error / api_error from the solution job's stderr
    "reference_failed": "infra_error",
    "harness_environment": "infra_error",
    "interrupted": "infra_error",
    "time_limit": "timeout",
    "no_verdict": "infra_error",
}


@dataclass
class TrialReport:
    """One PKB trial: its result word, and its timing where measured (ms, max over ranks, per PKB)."""

    trial: int
    result: str
    reference_ms: float | None = None
    solution_ms: float | None = None
    speedup: float | None = None
    reference_rank_ms: list[float] = field(default_factory=list)  # each rank's mean, from its perf JSON
    solution_rank_ms: list[float] = field(default_factory=list)
    error: str = ""


@dataclass
class PkbVerdict:
    """PKB's judgement of one solution. `speedup` is the median of the trials' speedups (PKB prints one per
    trial and aggregates them nowhere in its scripts)."""

    problem: str
    world_size: int
    correct: bool
    verdict: str  # this project's vocabulary (OUTCOME_VERDICTS)
    outcome: str  # PKB's own word for the first trial that was not a match (or "match")
    message: str
    failing_job: str | None = None  # "reference" or "solution" when a job produced no outputs
    speedup: float | None = None
    trials: list[TrialReport] = field(default_factory=list)
    wall_s: float = 0.0
    returncode: int | None = None
    timed_out: bool = False
    leftover_processes: int = 0  # processes still alive after run_local returned, then ended
    command: list[str] = field(default_factory=list)
    stdout_tail: str = ""
    stderr_tail: str = ""

    @property
    def speedups(self) -> list[float]:
        return [t.speedup for t in self.trials if t.speedup is not None]

    @property
    def fast(self) -> bool:
        return self.correct and self.speedup is not None and self.speedup > 1.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- parsing PKB's output ---------------------------------------------------------------------------
def eval_payload(stdout: str) -> dict[str, Any] | None:
    """The last `PKB_EVAL_JSON:` document run_local printed, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(EVAL_JSON_PREFIX):
            try:  # the solution ran in that process and could print too: parsed strictly
                value = hostile_files.strict_json(line[len(EVAL_JSON_PREFIX):], "PKB's verdict line")
            except hostile_files.HostileFile:
                return None
            return value if isinstance(value, dict) else None
    return None


def trial_lines(stdout: str) -> dict[int, tuple[bool, float | None, float | None, float | None]]:
    """{trial: (matched, reference ms, solution ms, speedup)} from PKB's per-trial lines."""
    found: dict[int, tuple[bool, float | None, float | None, float | None]] = {}
    for line in stdout.splitlines():
        m = _TRIAL_RE.match(line)
        if not m:
            continue
        perf = _PERF_RE.search(m.group(3))
        ref = sol = speed = None
        if perf:
            ref, sol, speed = float(perf.group(1)), float(perf.group(3)), float(perf.group(4))
        found[int(m.group(1))] = (m.group(2) == "match", ref, sol, speed)
    return found


def exception_line(text: str) -> str:
    """The exception line that ends the first Python traceback in `text` (torchrun's own launcher error,
    which follows every rank failure, is skipped), else run_local's first `Error: ...` line, else the last
    non-empty line."""
    inside = False
    lines_in = [_RANK_PREFIX.sub("", raw) for raw in text.splitlines()]
    for i, line in enumerate(lines_in):
        if line.startswith("Traceback (most recent call last):"):
            inside = True
            continue
        if inside and line and not line[0].isspace():
            if not line.startswith("torch.distributed.elastic"):
                # A message may go on over indented lines (pybind's "incompatible function arguments" lists
                # the signatures it takes): kept up to the first blank or unindented line.
                more = []
                for follow in lines_in[i + 1:]:
                    if not follow.strip() or not follow[0].isspace():
                        break
                    more.append(follow.strip())
                return " ".join([line.strip(), *more])[:500]
            inside = False
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith("Error:")), None)
    return (said or (lines[-1] if lines else ""))[:500]


def _job_text(job: Any) -> str:
    if not isinstance(job, dict):
        return ""
    return "\n".join(str(job.get(k) or "") for k in ("outputs_stderr", "outputs_stdout", "elastic_error_files"))


def _failed_job_verdict(trial: dict[str, Any]) -> tuple[str, str, str, str]:
    """(outcome, verdict, failing job, message) of a trial whose reference or solution job left no outputs."""
    ref_ok = trial.get("reference_returncode") == 0 and bool(trial.get("reference_artifact_names"))
    if not ref_ok:
        text = _job_text(trial.get("reference_job"))
        return "reference_failed", "infra_error", "reference", f"PKB's reference job failed: {exception_line(text)}"
    text = _job_text(trial.get("solution_job"))
    line = exception_line(text)
    if _NO_SOLUTION.search(text):
        return "solution_failed", "api_error", "solution", f"PKB could not load a solution(): {line}"
    if _BUILD_FAILED.search(text) or line.startswith("SyntaxError"):
        return "solution_failed", "compile_error", "solution", f"PKB's solution job failed to build: {line}"
    return "solution_failed", "runtime_error", "solution", f"PKB's solution job failed: {line}"


def _rank_means(perf_root: Path | None, job: str, trial: int) -> list[float]:
    """Each rank's mean time (PKB's wall_time_ms) from rank_<r>_perf.json of a downloaded trial."""
    if perf_root is None:
        return []
    folder = perf_root / job / f"trial_{trial}"
    means: list[tuple[int, float]] = []
    for path in folder.glob("rank_*_perf.json"):
        m = re.match(r"rank_(\d+)_perf\.json$", path.name)
        try:  # written where the solution ran unsandboxed: read as hostile (no link, no FIFO, bounded, strict)
            if m:
                means.append((int(m.group(1)), float(hostile_files.read_json(path, 1 << 20)["wall_time_ms"])))
        except (OSError, ValueError, KeyError, TypeError, hostile_files.HostileFile):
            continue
    return [v for _, v in sorted(means)]


def parse_pkb_output(stdout: str, stderr: str, returncode: int | None, *, problem: str = "", world_size: int = 0,
                     timed_out: bool = False, perf_root: Path | None = None, backend: str = "cuda",
                     timeout_s: float | None = None) -> PkbVerdict:
    """PKB's verdict from what `run_local.py --mode eval` printed (and, where `perf_root` is the downloaded
    logs/problem_<stem> folder, each rank's perf JSON)."""
    payload = eval_payload(stdout)
    lines = trial_lines(stdout)
    trials: list[TrialReport] = []
    outcome, verdict, failing, message = "match", "correct", None, ""
    if payload is not None:
        for t in payload.get("trials") or []:
            if not isinstance(t, dict):
                continue
            number = int(t.get("trial", len(trials)))
            result = str(t.get("result", "unknown"))
            _, ref_ms, sol_ms, speed = lines.get(number, (False, None, None, None))
            errors = (t.get("compare") or {}).get("errors") or []
            report = TrialReport(trial=number, result=result, reference_ms=ref_ms, solution_ms=sol_ms, speedup=speed,
                                 reference_rank_ms=_rank_means(perf_root, "reference", number),
                                 solution_rank_ms=_rank_means(perf_root, backend, number),
                                 error=str(errors[0])[:500] if errors else "")
            trials.append(report)
            if outcome != "match" or result == "match":
                continue
            if result == "no_artifacts":
                outcome, verdict, failing, message = _failed_job_verdict(t)
            else:
                outcome = result if result in OUTCOME_VERDICTS else "tensor_mismatch"
                verdict = OUTCOME_VERDICTS[outcome]
                if result == "harness_environment":
                    message = f"PKB: harness failure: {t.get('harness_hint', '')}"
                elif result == "interrupted":
                    message = "PKB's run was interrupted"
                else:
                    if outcome == "tensor_mismatch" and _SHAPE_WORDS.search(report.error):
                        verdict = "shape_mismatch"
                    message = f"PKB, trial {number}: {report.error or result}"
        if payload.get("all_ok") and not trials:
            outcome, verdict, message = "no_verdict", "infra_error", "PKB reported success without any trial"
    else:  # no verdict line (killed, or run_local failed early): the trials it printed before that
        trials = [TrialReport(trial=n, result="match" if ok else "mismatch", reference_ms=r, solution_ms=s, speedup=v)
                  for n, (ok, r, s, v) in sorted(lines.items())]
    if timed_out:
        outcome, verdict, failing = "time_limit", "timeout", None
        limit = f" of {timeout_s:g} s" if timeout_s is not None else ""
        message = f"PKB's run did not finish within the time limit{limit} (PKB itself has none); every process ended"
    elif payload is None:
        outcome, verdict = "no_verdict", "infra_error"
        message = f"run_local.py printed no {EVAL_JSON_PREFIX} line (exit {returncode}): " \
                  f"{exception_line(stderr) or exception_line(stdout)}"
    correct = verdict == "correct" and bool(payload and payload.get("all_ok")) and returncode == 0
    if verdict == "correct" and not correct:
        if payload and payload.get("all_ok"):
            # Fail closed: a success counts only with run_local's exit code 0; the solution ran in that run
            outcome, verdict = "no_verdict", "runtime_error"
            message = f"PKB reported all_ok but run_local.py exited with code {returncode}"
        else:
            outcome, verdict, message = "no_verdict", "infra_error", "PKB's trials matched but it did not report all_ok"
    speeds = [t.speedup for t in trials if t.speedup is not None]
    return PkbVerdict(problem=problem, world_size=world_size, correct=correct, verdict=verdict, outcome=outcome,
                      message=message[:1500], failing_job=failing,
                      speedup=statistics.median(speeds) if correct and speeds else None, trials=trials,
                      returncode=returncode, timed_out=timed_out, stdout_tail=stdout[-4000:],
                      stderr_tail=stderr[-4000:])


# -- running it ---------------------------------------------------------------------------------------
def problem_stem(checkout: Path, problem: Any) -> str:
    """The reference stem PKB knows a problem by: a Problem of that checkout (its name), a reference path,
    a stem, or a number (the first reference/<n>_*.py, as PKB's own resolver takes it)."""
    name = getattr(problem, "name", None)
    if isinstance(name, str) and hasattr(problem, "origin"):
        if problem.origin != "pkb":
            raise ValueError(f"{name} is this suite's problem, not one of a PKB checkout")
        stem = name
    elif isinstance(problem, Path):
        stem = problem.stem
    else:
        stem = str(problem).strip().removesuffix(".py")
        if stem.isdigit():
            matches = sorted((checkout / "reference").glob(f"{stem}_*.py"))
            if not matches:
                raise ValueError(f"{checkout}: no reference/{stem}_*.py")
            stem = matches[0].stem
    if not (checkout / "reference" / f"{stem}.py").is_file():
        raise ValueError(f"{checkout}: no reference/{stem}.py")
    return stem


def stage_checkout(checkout: Path, dest: Path) -> Path:
    """Copy what run_local.py needs into dest (never the solution sets, logs or caches)."""
    missing = [p for p in CHECKOUT_PARTS if not (checkout / p).exists()]
    if missing:
        raise ValueError(f"{checkout} is not a PKB checkout with its own harness: missing {', '.join(missing)}")
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "logs", "traces")
    for part in CHECKOUT_PARTS:
        src = checkout / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=ignore)
        else:
            shutil.copy2(src, dest / part)
    return dest


def torchrun_shim(folder: Path, python: str) -> Path:
    """A `torchrun` that is `python -m torch.distributed.run`, in folder/bin (returned)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "torchrun"
    shim.write_text(f'#!/bin/sh\nexec "{python}" -m torch.distributed.run "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


def pkb_command(python: str, stage: Path, stem: str, backend: str, solutions: Path, world_size: int, *,
                trials: int, base_shape: Sequence[int], dtype: str, atol: float, rtol: float, measure_perf: bool,
                logs: Path) -> list[str]:
    """run_local.py's command line for one evaluation, every setting explicit."""
    m, n = (int(base_shape[0]), int(base_shape[1])) if len(base_shape) >= 2 else (int(base_shape[0]),) * 2
    command = [python, str(stage / "run_local.py"), "--nproc-per-node", str(world_size), "--mode", "eval",
               "--problem", stem, "--solution", backend, "--solutions-dir", str(solutions), "--trials", str(trials),
               "--m", str(m), "--n", str(n), "--dtype", dtype, "--atol", repr(atol), "--rtol", repr(rtol),
               "--logs-dir", str(logs), "--download"]
    if measure_perf:
        command.append("--measure-perf")
    return command


def _backend_of(solution: Path) -> str:
    m = re.search(r"_(cuda|triton|parallelkittens)\.py$", solution.name)
    return m.group(1) if m else "cuda"


def safe_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every process of PKB's run gets: multicast off (harness.common.safe_env.SAFE_ENV)."""
    return {**(dict(os.environ) if base is None else base), **SAFE_ENV}


def score_with_pkb(checkout: str | Path, solution: str | Path, problem: Any, world_size: int, *,
                   device: str = "cuda", timeout_s: float = DEFAULT_TIMEOUT_S, trials: int = 5,
                   base_shape: Sequence[int] = (1024, 1024), dtype: str = "bfloat16", atol: float = 1e-2,
                   rtol: float = 1e-2, measure_perf: bool = True, backend: str | None = None,
                   gpus: Sequence[int] | None = None, extensions_dir: str | Path | None = None,
                   python: str = sys.executable, keep_dir: str | Path | None = None) -> PkbVerdict:
    """Judge `solution` on `problem` (a Problem of `checkout`, a stem, an id or a reference path) with the
    checkout's own run_local.py at `world_size` ranks, within `timeout_s` seconds. `extensions_dir`: a
    torch extensions cache to reuse between calls (default: one inside the temporary folder, so every
    build is cold). `keep_dir`: copy PKB's logs and outputs there. Never raises for what the solution
    does; ValueError for a checkout or problem that does not exist."""
    root = Path(checkout).resolve()
    stem = problem_stem(root, problem)
    solution = Path(solution).resolve()
    if not solution.is_file():
        raise ValueError(f"{solution}: no such solution file")
    if device != "cuda":
        return PkbVerdict(problem=stem, world_size=world_size, correct=False, verdict="infra_error",
                          outcome="no_verdict", message="PKB's own harness runs on CUDA only (NCCL and cuda:<rank> "
                                                        "are hard-coded in its scripts/worker.py)")
    backend = backend or _backend_of(solution)
    folder = Path(tempfile.mkdtemp(prefix="pkb-own-"))
    try:
        stage = stage_checkout(root, folder / "checkout")
        solutions = folder / "solutions"
        solutions.mkdir()
        shutil.copyfile(solution, solutions / f"{stem}_{backend}.py")
        logs = folder / "logs"
        # The solution runs unsandboxed in PKB's ranks: the harness's secrets stay out of their environment.
        env = safe_env(clean_environment(dict(os.environ), None))
        env.update({
            "PATH": f"{torchrun_shim(folder, python)}{os.pathsep}{env.get('PATH', '')}",
            "TORCH_EXTENSIONS_DIR": str(Path(extensions_dir).resolve() if extensions_dir else folder / "ext"),
            "TRITON_CACHE_DIR": str(folder / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        })
        env.pop("PYTHONPATH", None)  # the ranks import the staged checkout's utils, nothing of ours
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        command = pkb_command(python, stage, stem, backend, solutions, world_size, trials=trials,
                              base_shape=base_shape, dtype=dtype, atol=atol, rtol=rtol, measure_perf=measure_perf,
                              logs=logs)
        run: RunOutcome = run_contained(command, timeout_s=timeout_s, cwd=stage, env=env, log_dir=folder / "run")
        verdict = parse_pkb_output(run.stdout, run.stderr, run.returncode, problem=stem, world_size=world_size,
                                   timed_out=run.timed_out, perf_root=logs / f"problem_{stem}", backend=backend,
                                   timeout_s=timeout_s)
        verdict.wall_s = round(run.wall_s, 3)
        verdict.leftover_processes = len(run.leftovers)
        verdict.command = command
        if run.survivors:
            verdict.message += f" (processes {run.survivors} could not be ended)"
        if keep_dir is not None:
            keep = Path(keep_dir)
            keep.mkdir(parents=True, exist_ok=True)
            for sub in ("run", "logs"):  # written where the solution ran: no link followed, bounded, redacted
                if (folder / sub).is_dir() and not (folder / sub).is_symlink() and not (keep / sub).exists():
                    try:
                        with hostile_files.Folder.open(folder / sub) as kept:
                            hostile_files.copy_tree_out(kept, keep / sub, max_bytes=KEEP_BYTES, max_files=KEEP_FILES,
                                                        transform=lambda data: redact_bytes(data, same_length=True))
                    except hostile_files.HostileFile as err:
                        verdict.message += f" (PKB's {sub}/ not kept: {err})"
        return verdict
    finally:
        shutil.rmtree(folder, ignore_errors=True)
