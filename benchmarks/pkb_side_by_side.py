"""This harness and PKB's own, side by side, on PKB's recorded solutions and on a checkout's references.

    python benchmarks/pkb_side_by_side.py --first /work/pkb/first --head /work/pkb/head --world-size 2 \
        --per-set 20 --out OUTDIR [--sets DIR ...] [--problems 1,2_allgather,...] [--references N] \
        [--harness both|ours|pkb] [--trials 5] [--pkb-trials 5] [--shape default] [--timeout-s 900] \
        [--spread 3] [--spread-repeats 3] [--seed 0]
    python benchmarks/pkb_side_by_side.py --render OUTDIR/pkb_side_by_side.json   # Markdown again from the JSON

For each solution set (default: the three recorded cuda sets of the first public commit, GPT-5.5, Claude
Opus 4.7 and Gemini 3 Pro), every file is paired with its reference (harness.problems.parallelkernelbench.solutions);
files that are unmatched or use NVLink multicast (harness.problems.parallelkernelbench.multicast: they must not run
on these machines) are skipped with their reason, and --per-set files are drawn from the rest (a seeded
sample, --seed). The references of the current checkout (--head) are judged against themselves the same
way (--references of them). Each candidate is scored by this harness (harness.evaluate.evaluate, the
checkout's problem through --source-style loading, harness.problems.parallelkernelbench.checkout) and by PKB's own
(harness.problems.parallelkernelbench.own_harness.score_with_pkb: the checkout's run_local.py under torchrun), at
the same world size, shape, tolerance and trial count; harness.problems.parallelkernelbench.rules names the rule
behind every difference. Then --spread kernels that both harnesses found
correct are timed --spread-repeats more times by each, for the spread of PKB's speedups against ours.

Writes OUTDIR/pkb_side_by_side.json (every row: both full verdicts, wall times, the comparison; rewritten
after each candidate) and OUTDIR/pkb_side_by_side.md: verdict agreement per set and overall, every
disagreement with its rule, wall time per candidate in each harness, pass@1 and fast_1@1 of each sample
under each harness, and the timing spread. Needs --world-size GPUs (CUDA); --harness pkb needs torch only.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shlex
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.problems.parallelkernelbench import checkout as pkb_checkout  # noqa: E402
from harness.problems.parallelkernelbench import solutions as pkb_solutions  # noqa: E402
from harness.problems.parallelkernelbench.multicast import multicast_reason  # noqa: E402
from harness.problems.parallelkernelbench.own_harness import score_with_pkb  # noqa: E402
from harness.problems.parallelkernelbench.rules import compare, load_rules  # noqa: E402
from harness.problems.problem import Problem  # noqa: E402

RECORDED_SETS = ("solutions_cuda_bf16_h100_8_openai_gpt-5.5", "solutions_cuda_bf16_h100_8_anthropic_claude-opus-4-7",
                 "solutions_cuda_bf16_h100_8_google_gemini-3-pro-preview")
JSON_NAME, MD_NAME = "pkb_side_by_side.json", "pkb_side_by_side.md"


# -- choosing the candidates ------------------------------------------------------------------------
def wanted(problem: Problem, problems: set[str] | None) -> bool:
    """--problems holds stems and/or ids; None: every problem."""
    if problems is None:
        return True
    pid = pkb_checkout.problem_id(problem)
    return problem.name in problems or (pid is not None and str(pid) in problems)


def plan(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(candidates to run, files skipped with their reason). Candidates carry group, set, file, path,
    checkout, problem and how the file was matched."""
    rng = random.Random(args.seed)
    problems = {p.strip() for p in args.problems.split(",")} if args.problems else None
    todo: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    if args.head and args.references != 0:
        eligible = []
        for problem in pkb_checkout.suite(args.head):
            if not wanted(problem, problems):
                continue
            reason = multicast_reason(problem.path)
            if reason:
                skipped.append({"group": "references", "file": problem.path.name, "reason": reason})
                continue
            eligible.append(problem)
        count = len(eligible) if args.references is None or args.references < 0 else min(args.references, len(eligible))
        for problem in sorted(rng.sample(eligible, count), key=lambda p: (pkb_checkout.problem_id(p) or 0, p.name)):
            todo.append({"group": "references", "set": "reference", "file": problem.path.name,
                         "path": str(problem.path), "checkout": str(args.head), "problem": problem.name,
                         "match": "the reference itself"})
    for directory in args.sets:
        info = pkb_solutions.solution_set_info(directory) or {}
        group = info.get("model", directory.name)
        eligible_rows = []
        for match in pkb_solutions.match_solution_set(args.first, directory):
            path = directory / match.file
            if match.problem is None:
                skipped.append({"group": group, "file": match.file, "reason": f"unmatched: {match.reason}"})
                continue
            problem = next(p for p in pkb_checkout.suite(args.first) if p.name == match.problem)
            if not wanted(problem, problems):
                continue
            reason = multicast_reason(path)
            if reason:
                skipped.append({"group": group, "file": match.file, "reason": reason})
                continue
            eligible_rows.append({"group": group, "set": directory.name, "file": match.file, "path": str(path),
                                  "checkout": str(args.first), "problem": match.problem,
                                  "match": f"{match.status}: {match.reason}"})
        count = min(args.per_set, len(eligible_rows))
        chosen = rng.sample(eligible_rows, count)
        todo.extend(sorted(chosen, key=lambda r: (int(r["file"].split("_", 1)[0]), r["file"])))
    return todo, skipped


# -- running both harnesses -------------------------------------------------------------------------
def run_ours(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Our verdict as the EvalResult's JSON, plus wall_s; a harness crash is its own row (infra_error)."""
    from harness.config import EvalConfig, TimingConfig
    from harness.evaluate import evaluate

    problem = next(p for p in pkb_checkout.suite(row["checkout"]) if p.name == row["problem"])
    # This harness as `pkb eval` runs it: its own phase limits, not --timeout-s (which bounds PKB's runs).
    config = EvalConfig(trials=args.trials, seed=args.seed, timing=TimingConfig.for_device(args.device))
    started = time.perf_counter()
    try:
        result = evaluate(problem, Path(row["path"]), world_size=args.world_size, device=args.device,
                          shape=args.shape, config=config)
    except Exception as exc:  # the harness itself failed on this file: the finding is the row
        return {"verdict": "infra_error", "correct": False, "flags": [], "speedup": None, "fast_eligible": False,
                "failure": {"verdict": "infra_error", "message": f"harness crash: {type(exc).__name__}: {exc}"[:1500],
                            "phase": "harness"},
                "wall_s": round(time.perf_counter() - started, 2)}
    record = result.model_dump(mode="json")
    record["wall_s"] = round(time.perf_counter() - started, 2)
    return record


def run_pkb(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    base_shape = pkb_checkout.SHAPES[args.shape]["base_shape"]
    tolerance = pkb_checkout.PRECISIONS[pkb_checkout.DEFAULT_PRECISION].tolerance  # the sets are bf16
    verdict = score_with_pkb(row["checkout"], row["path"], row["problem"], args.world_size, device=args.device,
                             timeout_s=args.timeout_s, trials=args.pkb_trials, base_shape=base_shape,
                             atol=tolerance, rtol=tolerance,
                             extensions_dir=args.extensions_cache)
    return verdict.as_dict()


def judge(row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    row = dict(row)
    if args.harness in ("both", "ours"):
        row["ours"] = run_ours(row, args)
    if args.harness in ("both", "pkb"):
        row["pkb"] = run_pkb(row, args)
    if row.get("ours") and row.get("pkb"):
        row["comparison"] = compare(row["ours"], row["pkb"]).as_dict()
    return row


def spread(doc: dict[str, Any], args: argparse.Namespace, write: Any) -> None:
    """--spread kernels both harnesses found correct and timed, each timed --spread-repeats more times by
    each harness (the recorded solutions first, one per problem), into doc["spread"]."""
    if args.spread <= 0 or args.harness != "both":
        return
    chosen: list[dict[str, Any]] = []
    for row in sorted(doc["rows"], key=lambda r: r["group"] == "references"):
        ours, pkb = row.get("ours") or {}, row.get("pkb") or {}
        if ours.get("correct") and pkb.get("correct") and ours.get("speedup") and pkb.get("speedup") \
                and row["problem"] not in {c["problem"] for c in chosen}:
            chosen.append(row)
        if len(chosen) == args.spread:
            break
    for row in chosen:
        entry: dict[str, Any] = {"group": row["group"], "file": row["file"], "problem": row["problem"],
                                 "ours": [], "pkb": [], "ours_wall_s": [], "pkb_wall_s": []}
        doc["spread"].append(entry)
        for _ in range(args.spread_repeats):
            ours = run_ours(row, args)
            entry["ours"].append(ours.get("speedup") if ours.get("correct") else None)
            entry["ours_wall_s"].append(ours.get("wall_s"))
            pkb = run_pkb(row, args)
            entry["pkb"].append(pkb.get("speedup") if pkb.get("correct") else None)
            entry["pkb_wall_s"].append(pkb.get("wall_s"))
            write()


# -- the report -------------------------------------------------------------------------------------
def _rate(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.0f}%)" if d else "0/0"


def _stats(values: list[float | None]) -> dict[str, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"n": 0, "median": None, "min": None, "max": None, "spread": None}
    med = statistics.median(vals)
    return {"n": len(vals), "median": med, "min": min(vals), "max": max(vals),
            "spread": (max(vals) - min(vals)) / med if med else None}


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    rows = doc["rows"]
    groups: dict[str, dict[str, Any]] = {}
    for row in rows:
        g = groups.setdefault(row["group"], {"run": 0, "judged": 0, "agree": 0, "ours_correct": 0, "ours_fast": 0,
                                             "pkb_correct": 0, "pkb_fast": 0, "skipped": 0})
        g["run"] += 1
        ours, pkb, cmp = row.get("ours"), row.get("pkb"), row.get("comparison")
        if ours:
            g["ours_correct"] += bool(ours.get("correct"))
            g["ours_fast"] += bool(ours.get("correct") and ours.get("fast_eligible") and (ours.get("speedup") or 0) > 1)
        if pkb:
            g["pkb_correct"] += bool(pkb.get("correct"))
            g["pkb_fast"] += bool(pkb.get("correct") and (pkb.get("speedup") or 0) > 1)
        if cmp and cmp["judged"]:
            g["judged"] += 1
            g["agree"] += bool(cmp["agree"])
    for skip in doc["skipped"]:
        groups.setdefault(skip["group"], {"run": 0, "judged": 0, "agree": 0, "ours_correct": 0, "ours_fast": 0,
                                          "pkb_correct": 0, "pkb_fast": 0, "skipped": 0})["skipped"] += 1
    judged = sum(g["judged"] for g in groups.values())
    agree = sum(g["agree"] for g in groups.values())
    walls = {h: [r[h]["wall_s"] for r in rows if r.get(h) and r[h].get("wall_s") is not None] for h in ("ours", "pkb")}
    return {"groups": groups, "judged": judged, "agree": agree,
            "agreement_rate": agree / judged if judged else None,
            "wall_s": {h: _stats(v) | {"total": sum(v)} for h, v in walls.items()}}


def render(doc: dict[str, Any]) -> str:
    s = doc["summary"] = summary(doc)
    book = load_rules()
    out = [f"# This harness and PKB's own, side by side (W = {doc['world_size']})", "",
           f"{doc['date']}, {doc['machine']}; shape `{doc['shape']}`, our trials {doc['trials']}, PKB's trials "
           f"{doc['pkb_trials']}, time limit {doc['timeout_s']:g} s a run; harness: {doc['harness']}.", "",
           "    " + doc["command"], ""]
    rate = s["agreement_rate"]
    out += [f"Verdict agreement (correct or not), over candidates both harnesses judged: "
            f"**{_rate(s['agree'], s['judged'])}**" + ("" if rate is not None else " (none judged by both)"), "",
            "| group | run | skipped | judged by both | agree | ours: correct / fast | PKB: correct / fast |",
            "|---|---|---|---|---|---|---|"]
    for name, g in s["groups"].items():
        out.append(f"| {name} | {g['run']} | {g['skipped']} | {g['judged']} | {_rate(g['agree'], g['judged'])} | "
                   f"{g['ours_correct']} / {g['ours_fast']} | {g['pkb_correct']} / {g['pkb_fast']} |")
    out += ["", "pass@1 and fast_1@1 above are of the sample run, one attempt a file, at this world size (PKB "
            "published its figures at W = 8).", ""]
    diffs = [(row, d) for row in doc["rows"] if row.get("comparison") for d in row["comparison"]["differences"]]
    out += ["## Every difference, with its rule", ""]
    if diffs:
        out += ["| group | file | problem | ours | PKB | kind | rule | why |", "|---|---|---|---|---|---|---|---|"]
        for row, d in diffs:
            c = row["comparison"]
            ours_text = c["ours_verdict"] + (f" {c['ours_speedup']:.2f}x" if c["ours_speedup"] else "")
            pkb_text = f"{c['pkb_verdict']} ({c['pkb_outcome']})" + (
                f" {c['pkb_speedup']:.2f}x" if c["pkb_speedup"] else "")
            also = f" (also: {', '.join(d['also'])})" if d["also"] else ""
            out.append(f"| {row['group']} | {row['file']} | {row['problem']} | {ours_text} | {pkb_text} | "
                       f"{d['kind']} | `{d['rule']}`{also} | {d['explain']} |")
    else:
        out.append("None.")
    used = sorted({d["rule"] for _, d in diffs} - {"unexplained"})
    if used:
        out += ["", "The rules that made a difference here (harness/problems/parallelkernelbench/rules.json):", ""]
        out += [f"- `{rid}`: {book.explain(rid)}" for rid in used]
    out += ["", "## Every candidate", "", "| group | file | problem | ours | s | PKB | s | agree |",
            "|---|---|---|---|---|---|---|---|"]
    for row in doc["rows"]:
        ours, pkb, c = row.get("ours") or {}, row.get("pkb") or {}, row.get("comparison")
        o = ours.get("verdict", "-") + (f" {ours['speedup']:.2f}x" if ours.get("speedup") else "")
        p = pkb.get("verdict", "-") + (f" {pkb['speedup']:.2f}x" if pkb.get("speedup") else "")
        agree = "-" if not c else ("yes" if c["agree"] else "**no**") + ("" if c["judged"] else " (not judged)")
        out.append(f"| {row['group']} | {row['file']} | {row['problem']} | {o} | {ours.get('wall_s', '-')} | {p} | "
                   f"{pkb.get('wall_s', '-')} | {agree} |")
    w = s["wall_s"]
    out += ["", "Wall time per candidate (s): " + "; ".join(
        f"{h}: median {v['median']:.1f}, min {v['min']:.1f}, max {v['max']:.1f}, total {v['total']:.0f} over {v['n']}"
        for h, v in w.items() if v["n"]), ""]
    if doc.get("spread"):
        out += ["## The same kernels timed again by each harness", "",
                "| file | problem | ours: speedups | spread | PKB: speedups | spread | PKB / ours (medians) |",
                "|---|---|---|---|---|---|---|"]
        for e in doc["spread"]:
            so, sp = _stats(e["ours"]), _stats(e["pkb"])
            ratio = sp["median"] / so["median"] if so["median"] and sp["median"] else None
            fmt = lambda xs: ", ".join("-" if x is None else f"{x:.3f}" for x in xs)  # noqa: E731
            pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
            out.append(f"| {e['file']} | {e['problem']} | {fmt(e['ours'])} | {pct(so['spread'])} | {fmt(e['pkb'])} | "
                       f"{pct(sp['spread'])} | {'-' if ratio is None else f'{ratio:.3f}'} |")
        out += ["", "spread: (max - min) / median of one harness's speedups of one kernel.", ""]
    if doc["skipped"]:
        out += ["## Skipped", "", "| group | file | reason |", "|---|---|---|"]
        out += [f"| {k['group']} | {k['file']} | {k['reason']} |" for k in doc["skipped"]]
    return "\n".join(out) + "\n"


def machine() -> str:
    try:
        import torch

        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        where = f"{len(gpus)} x {gpus[0]}" if gpus else "no GPU"
        return f"{platform.node()}, {where}, torch {torch.__version__}, Python {platform.python_version()}"
    except Exception as exc:  # only a description: never stop a run for it
        return f"{platform.node()} ({type(exc).__name__})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first", type=Path, help="checkout of the recorded sets (PKB's first public commit)")
    parser.add_argument("--head", type=Path, help="checkout whose references are judged against themselves")
    parser.add_argument("--sets", type=Path, nargs="*", default=None,
                        help="solution sets (default: the three recorded cuda sets under --first)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--per-set", type=int, default=20, help="files drawn from each set")
    parser.add_argument("--references", type=int, default=None,
                        help="references of --head judged (default: as many as --per-set; -1: all; 0: none)")
    parser.add_argument("--problems", default=None, help="comma-separated stems or ids: only these problems")
    parser.add_argument("--harness", choices=("both", "ours", "pkb"), default="both")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="default", choices=sorted(pkb_checkout.SHAPES))
    parser.add_argument("--trials", type=int, default=5, help="our correctness trials (at least 2)")
    parser.add_argument("--pkb-trials", type=int, default=5, help="PKB's trials (run_local --trials)")
    parser.add_argument("--timeout-s", type=float, default=900.0,
                        help="limit of one PKB run (this harness keeps its own phase limits)")
    parser.add_argument("--extensions-cache", type=Path, default=None,
                        help="torch extensions cache PKB's runs share (default: a cold build every run)")
    parser.add_argument("--spread", type=int, default=3, help="kernels timed again by each harness")
    parser.add_argument("--spread-repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--render", type=Path, default=None, help="only write the Markdown of this JSON again")
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        args.render.with_name(MD_NAME).write_text(render(saved))
        print(args.render.with_name(MD_NAME))
        return 0
    if args.out is None or (args.first is None and args.head is None):
        parser.error("--out and at least one of --first / --head are needed")
    if args.sets is None:
        args.sets = [args.first / name for name in RECORDED_SETS] if args.first else []
    if args.sets and args.first is None:
        parser.error("--sets need --first (the checkout they were recorded against)")
    if args.references is None:
        args.references = args.per_set
    if args.device == "cuda":
        import torch

        if torch.cuda.device_count() < args.world_size:
            parser.error(f"--world-size {args.world_size} needs that many GPUs; {torch.cuda.device_count()} visible")
    args.out.mkdir(parents=True, exist_ok=True)
    todo, skipped = plan(args)
    doc: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"), "machine": machine(),
        "command": " ".join(shlex.quote(a) for a in ["python", "benchmarks/pkb_side_by_side.py",
                                                      *(sys.argv[1:] if argv is None else argv)]),
        "world_size": args.world_size, "shape": args.shape, "trials": args.trials, "pkb_trials": args.pkb_trials,
        "timeout_s": args.timeout_s, "harness": args.harness, "seed": args.seed, "rows": [], "skipped": skipped,
        "spread": [],
    }

    def write() -> None:
        (args.out / JSON_NAME).write_text(json.dumps(doc, indent=1, default=str))
        (args.out / MD_NAME).write_text(render(doc))

    print(f"{len(todo)} candidates, {len(skipped)} files skipped", flush=True)
    for i, row in enumerate(todo, 1):
        done = judge(row, args)
        doc["rows"].append(done)
        write()
        ours, pkb = done.get("ours") or {}, done.get("pkb") or {}
        print(f"[{i}/{len(todo)}] {row['group']} {row['file']}: ours {ours.get('verdict', '-')} "
              f"({ours.get('wall_s', '-')} s), PKB {pkb.get('verdict', '-')}/{pkb.get('outcome', '-')} "
              f"({pkb.get('wall_s', '-')} s) {pkb.get('message', '')[:160]}", flush=True)
    spread(doc, args, write)
    write()
    print(args.out / MD_NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
