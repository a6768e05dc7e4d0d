"""Search against independent sampling at equal budget: the best kernel per problem, over several seeds.

For every seed and strategy, one `pkb search` run (in-process, agent.search.loop.Search) with the
stochastic scripted model (scripted:mutator: edits of the CPU kernel families in agent/search/cpu_kernels,
failures mixed in) and the same number of candidates per problem (--candidates; no patience, no target:
every run evaluates exactly that many). The figure per run and problem is the speedup of the kernel the
search reports: its best trusted kernel, re-scored on fresh seeds (the median of its rescores). A strategy
that finds nothing trusted scores 0 for that problem.

Output: per problem and strategy, the mean over seeds with a bootstrap 95% interval; per problem, how
many seeds the search beat independent sampling on; the mean over seeds and problems of log(search /
independent) with its interval. Runs are kept under --runs-dir and resumed, so an interrupted benchmark
continues where it stopped. Strategies run interleaved within each seed, so slow spells of a shared
machine hit all of them alike.

    python benchmarks/search_vs_independent.py --seeds 0,1,2,3,4 --candidates 16 --out DIR
    python benchmarks/search_vs_independent.py --evaluator tests.search_fakes ...   # the loop only, no harness
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.executors.local import LocalExecutor  # noqa: E402
from agent.report.metrics import bootstrap_mean  # noqa: E402
from agent.scheduler import DeviceScheduler  # noqa: E402
from agent.search.archive import Archive  # noqa: E402
from agent.search.config import Limits, SearchConfig, StrategyConfig  # noqa: E402
from agent.search.layout import SearchDir, create, is_search_dir, load_config  # noqa: E402
from agent.search.loop import Search  # noqa: E402
from agent.search.summary import problem_rows, throughput  # noqa: E402
from harness.problems.registry import load_suite, select  # noqa: E402

CONTROL = "independent"


def run_one(directory: SearchDir, config: SearchConfig, evaluator: Any) -> dict[str, Any]:
    if is_search_dir(directory.path):
        stored = load_config(directory)
        if stored != config:
            raise SystemExit(f"{directory.path} holds another configuration; remove it or pick another --runs-dir")
    else:
        create(directory, config)
    problems = select(load_suite(), config.problems)
    executor = LocalExecutor(DeviceScheduler(config.device, config.world_size))
    started = time.perf_counter()
    search = Search(directory, config, problems, executor=executor,
                    evaluate=getattr(evaluator, "evaluate", None), bound=getattr(evaluator, "bound", None))
    summary = search.run()
    with Archive(directory.archive) as archive:
        rows = problem_rows(archive, config.problems, config.remeasure, config.device)
        stats = throughput(archive, config.world_size)
    return {
        "stop_reason": summary.stop_reason, "seconds_this_call": time.perf_counter() - started,
        "problems": {r.problem: {"reported_speedup": r.reported.speedup if r.reported else None,
                                 "reported_candidate": r.reported.candidate.id if r.reported else None,
                                 "search_best_speedup": r.best.speedup if r.best else None,
                                 "evaluated": r.evaluated, "correct": r.correct, "trusted": r.trusted,
                                 "verdicts": dict(r.verdicts), "rescore_failed": r.rescore_failed}
                     for r in rows},
        "throughput": stats,
    }


def score(entry: dict[str, Any]) -> float:
    value = entry.get("reported_speedup")
    return float(value) if value is not None else 0.0


def analyse(results: dict[str, dict[str, dict[str, Any]]], problems: list[str], strategies: list[str],
            seeds: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"per_problem": {}, "versus_control": {}}
    for p in problems:
        out["per_problem"][p] = {}
        for s in strategies:
            values = [score(results[s][str(seed)]["problems"][p]) for seed in seeds]
            out["per_problem"][p][s] = {"values": values, **bootstrap_mean(values, seed=0).as_dict()}
    for s in strategies:
        if s == CONTROL:
            continue
        wins, logs, per_problem_wins = 0, [], {}
        for p in problems:
            seed_wins = 0
            for seed in seeds:
                a = score(results[CONTROL][str(seed)]["problems"][p])
                b = score(results[s][str(seed)]["problems"][p])
                seed_wins += b > a
                if a > 0 and b > 0:
                    logs.append(math.log(b / a))
            per_problem_wins[p] = seed_wins
            mean_a = sum(score(results[CONTROL][str(x)]["problems"][p]) for x in seeds) / len(seeds)
            mean_b = sum(score(results[s][str(x)]["problems"][p]) for x in seeds) / len(seeds)
            wins += mean_b > mean_a
        interval = bootstrap_mean(logs, seed=0)
        out["versus_control"][s] = {
            "problems_won_on_mean": wins, "problems": len(problems), "seed_wins_per_problem": per_problem_wins,
            "mean_log_ratio": interval.as_dict(),
            "geomean_ratio": {k: math.exp(v) for k, v in interval.as_dict().items() if k in ("mean", "low", "high")},
        }
    return out


def markdown(analysis: dict[str, Any], problems: list[str], strategies: list[str], seeds: list[int]) -> str:
    lines = ["| problem | " + " | ".join(f"{s}: mean [95% CI]" for s in strategies) + " |",
             "|---|" + "---|" * len(strategies)]
    for p in problems:
        cells = []
        for s in strategies:
            e = analysis["per_problem"][p][s]
            cells.append(f"{e['mean']:.2f}x [{e['low']:.2f}, {e['high']:.2f}]")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    lines.append("")
    for s, v in analysis["versus_control"].items():
        g = v["geomean_ratio"]
        wins = ", ".join(f"{p} {n}/{len(seeds)}" for p, n in v["seed_wins_per_problem"].items())
        lines.append(f"- {s} vs {CONTROL}: higher mean on {v['problems_won_on_mean']} of {v['problems']} problems; "
                     f"seeds won per problem: {wins}; geometric-mean ratio {g['mean']:.2f}x "
                     f"[{g['low']:.2f}, {g['high']:.2f}]")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", default="all_reduce,all_gather,reduce_scatter")
    parser.add_argument("--strategies", default="independent,islands,best_first")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--candidates", type=int, default=16, help="per problem, every strategy")
    parser.add_argument("--model", default="scripted:mutator")
    parser.add_argument("--shape", default="small")
    parser.add_argument("--phase-timeout", type=float, default=15.0)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--timing-iters", type=int, default=100, help="timed iterations per side (CPU default: 10)")
    parser.add_argument("--cached-reference", action="store_true",
                        help="time the reference once per seed (default: beside every candidate, since a shared "
                             "machine's speed drifts)")
    parser.add_argument("--evaluator", default=None,
                        help="a module with evaluate() (and bound()) to use instead of the harness")
    parser.add_argument("--runs-dir", default="runs/bench-search")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    problems = args.problems.split(",")
    strategies = args.strategies.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    if CONTROL not in strategies:
        raise SystemExit(f"--strategies must include the control, {CONTROL}")
    evaluator = importlib.import_module(args.evaluator) if args.evaluator else None
    tag = "fake" if evaluator else "harness"
    results: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in strategies}
    started = time.time()
    for seed in seeds:
        for strategy in strategies:
            config = SearchConfig(model=args.model, problems=problems, shape=args.shape, seed=seed,
                                  phase_timeout_s=args.phase_timeout, strategy=StrategyConfig(name=strategy),
                                  fresh_reference=not args.cached_reference, timing_iters=args.timing_iters,
                                  per_problem=Limits(candidates=args.candidates), window=args.window)
            directory = SearchDir(Path(args.runs_dir) / f"{tag}-{strategy}-s{seed}-n{args.candidates}")
            results[strategy][str(seed)] = run_one(directory, config, evaluator)
            best = {p: round(score(v), 3) for p, v in results[strategy][str(seed)]["problems"].items()}
            print(f"seed {seed} {strategy:12s} {best}  ({time.time() - started:.0f} s so far)", flush=True)
    analysis = analyse(results, problems, strategies, seeds)
    text = markdown(analysis, problems, strategies, seeds)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        record = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.node(),
                  "cpus": os.cpu_count(), "load_average": os.getloadavg(), "argv": sys.argv,
                  "evaluator": args.evaluator or "harness", "results": results, "analysis": analysis}
        (out / f"search_vs_independent-{tag}.json").write_text(json.dumps(record, indent=2, default=str))
        (out / f"search_vs_independent-{tag}.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
