"""Every distinct candidate of a run, scored by the final scorer (`pkb rescore RUN`).

The tools' verdicts are what the agent knew, on the tools' seed and the visible shape. To draw how a sample
really improved turn by turn, each distinct candidate file (by sha256, within a sample) is scored the way
the final scoring scores the submitted file: the visible shape on scoring_seed(seed), then, if correct, the
problem's held-out shapes on their own seeds. It is one round of agent.remeasure, the function the search's
re-measurement and `pkb rescore` of a search run (agent.search.rescore) call too, so every rescored figure
is measured one way: a fresh bench (the reference timed beside it), and what the timing was worth said
(`timing`; an emulated one has no speedup). The answers go into the sample's rescored.json, written after
each candidate, so a killed rescore continues where it stopped; agent.report.trajectories draws them
beside the tools' evidence.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import final_scoring, remeasure
from agent.executors.interface import as_evaluate
from agent.executors.local import LocalExecutor
from agent.final_scoring import EvaluateFn
from agent.run_config import RunConfig
from agent.rundir import FINISHED, RESCORED_FILE, RunLayout, SampleLayout, read_json, write_json_atomic
from agent.scheduler import DeviceScheduler
from harness.problems.problem import Problem

__all__ = ["RESCORED_FILE", "RescoreSummary", "rescore_run", "rescore_sample"]


@dataclass
class RescoreSummary:
    samples: int = 0
    candidates: int = 0  # candidate files seen
    scored: int = 0  # distinct sources scored by this call
    reused: int = 0  # already in rescored.json, or the same source as another candidate of the sample
    missing_problems: list[str] = field(default_factory=list)


def rescore_sample(folder: Path, problem: Problem, config: RunConfig, evaluate: EvaluateFn,
                   summary: RescoreSummary, lock: threading.Lock,
                   progress: Callable[[str], None] | None = None) -> None:
    files = SampleLayout(folder)
    path = files.rescored_json
    previous = read_json(path)
    done: dict[str, Any] = dict((previous or {}).get("candidates") or {}) if isinstance(previous, dict) else {}
    by_sha = {v["sha256"]: v for v in done.values() if isinstance(v, dict) and "sha256" in v}
    eval_config = config.eval_config()
    for file in files.candidate_files():
        rel = file.relative_to(folder).as_posix()
        sha = hashlib.sha256(file.read_bytes()).hexdigest()
        with lock:
            summary.candidates += 1
        if rel in done or sha in by_sha:  # scored before, or the same source as a candidate scored here
            if rel not in done:
                done[rel] = {**by_sha[sha], "path": rel, "same_source_as": by_sha[sha]["path"]}
            with lock:
                summary.reused += 1
            continue
        measured = remeasure.remeasure(
            problem, file, evaluate=evaluate, config=eval_config, seeds=[final_scoring.scoring_seed(eval_config.seed)],
            world_size=config.world_size, device=config.device, shape=config.shape,
            held_out_seed=lambda _seed, i: final_scoring.held_out_seed(eval_config.seed, i))
        r = measured.rounds[0]
        entry = {"path": rel, "sha256": sha, "correct": r.correct, "correct_visible": r.correct_visible,
                 "held_out_correct": r.held_out_correct, "verdict": r.verdict, "speedup": r.speedup,
                 "fast_eligible": r.fast_eligible, "timing": r.timing, "seed": r.seed, "held_out": r.held_out,
                 "remeasured": measured.record()}
        done[rel] = by_sha[sha] = entry
        write_json_atomic(path, {"scorer": "final (visible shape on the scoring seed, then held-out shapes)",
                                 "candidates": done})
        with lock:
            summary.scored += 1
        if progress is not None:
            progress(f"{folder.relative_to(folder.parents[3])} {rel}: {entry['verdict']}")
    write_json_atomic(path, {"scorer": "final (visible shape on the scoring seed, then held-out shapes)",
                             "candidates": done})


def rescore_run(run: RunLayout, config: RunConfig, problems: dict[str, Problem], *, concurrency: int = 1,
                scheduler: DeviceScheduler | None = None,
                progress: Callable[[str], None] | None = None) -> RescoreSummary:
    """Every finished sample's distinct candidates, scored by the final scorer (module docstring)."""
    summary = RescoreSummary()
    scheduler = scheduler or DeviceScheduler(config.device, config.world_size, ranks_per_gpu=config.ranks_per_gpu)
    evaluate = as_evaluate(LocalExecutor(scheduler))
    lock = threading.Lock()
    jobs = []
    for sample in run.sample_dirs():
        folder = sample.path
        record = sample.record() or {}
        if record.get("status") != FINISHED:
            continue
        problem = problems.get(str(record.get("problem")))
        if problem is None:
            summary.missing_problems.append(str(record.get("problem")))
            continue
        summary.samples += 1
        jobs.append((folder, problem))
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for future in [pool.submit(rescore_sample, f, p, config, evaluate, summary, lock, progress) for f, p in jobs]:
            future.result()
    return summary
