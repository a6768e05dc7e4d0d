"""Timed medians of the expert kernels before and after a change of the timing protocol, in one run,
interleaved; the cost of drawing every timed call's inputs anew; the GPU exploits of the timed calls.

    python benchmarks/gpu_protocol_ab.py --base-tree .base --out OUT              # 1 GPU: W=2 emulated
    python benchmarks/gpu_protocol_ab.py --base-tree .base --out OUT --ranks-per-gpu 1   # 2 GPUs, NCCL
    python benchmarks/gpu_protocol_ab.py --base-tree /work/wt/base25 --out /tmp/ab --device cpu --dry-run

`--base-tree` is a copy of the repository at the commit to compare with (4076da7 for issue 25). Two
long-lived worker processes, one importing each tree's harness, evaluate every expert solution of
`problems/*/solutions/` (each tree's own copy) on the same shapes, alternately: per expert the first tree
alternates between rounds, so drift of the machine hits both alike. Reported per expert and tree: the
candidate's and the reference's timed medians over rounds, and the change in percent (the acceptance
line for issue 25: honest medians move by less than 2%), with the spread between rounds of the same tree
beside it (what the machine's noise alone does). Then, in this tree only: what drawing a timed call's
inputs costs on the device (make_inputs into fresh tensors, then the copy into the call's buffers: CUDA
events, median of 20) next to each expert's median; and the tests/exploits/gpu_* candidates of the timed
calls evaluated by both trees (this tree's verdicts against their declared ones).

Writes OUT/protocol_ab.json (after every evaluation, atomically) and OUT/protocol_ab.md, and prints the
tables last. `--device cpu` runs the same machinery on CPU (gloo, the CPU kernel families of
agent/search/cpu_kernels instead of the CUDA experts, the CPU timed-call exploits at `decode`); add
`--dry-run` for one round of two kernels and one exploit, to check the script.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's harness, for the refill measurement made in this process

# (problem, expert file under problems/, shape): one shape per expert where its work is visible in
# emulation, plus the one-shot all-reduce at 64 MiB, where drawing the inputs costs the most. The default
# list keeps the run near 6 minutes; --all-experts adds the other three (about 2 minutes more).
GPU_EXPERTS = [
    ("all_reduce", "collective/solutions/all_reduce__one_shot.py", "1mib"),
    ("all_reduce", "collective/solutions/all_reduce__one_shot.py", "default"),
    ("all_reduce", "collective/solutions/all_reduce__two_shot.py", "1mib"),
    ("all_reduce", "collective/solutions/all_reduce__two_shot_push.py", "1mib"),
    ("all_gather", "collective/solutions/all_gather__pull.py", "decode"),
    ("reduce_scatter", "collective/solutions/reduce_scatter__pull.py", "small"),
    ("all_to_all", "collective/solutions/all_to_all__pull.py", "small"),
    ("all_reduce_residual_rmsnorm", "tensor/solutions/all_reduce_residual_rmsnorm__one_shot.py", "small"),
]
MORE_GPU_EXPERTS = [
    ("all_reduce", "collective/solutions/all_reduce__two_shot_copy_engine.py", "1mib"),
    ("all_gather", "collective/solutions/all_gather__copy_engine.py", "decode"),
    ("all_to_all", "collective/solutions/all_to_all__copy_engine.py", "small"),
]
CPU_EXPERTS = [  # --device cpu: the CPU kernel families stand in for the CUDA experts
    ("all_reduce", "../agent/search/cpu_kernels/all_reduce__cpu_two_shot.py", "small"),
    ("all_gather", "../agent/search/cpu_kernels/all_gather__cpu_push.py", "small"),
]
GPU_EXPLOITS = ["gpu_memo_by_pointer.py", "gpu_memo_by_pointer_1mib.py", "gpu_timed_by_stream_state.py",
                "gpu_side_stream_when_looked.py", "gpu_side_stream.py"]
CPU_EXPLOITS = ["memo_by_pointer.py", "memo_sampled_elements.py", "torch_function_mode_work.py", "transport_hijack.py",
                "int8_when_timed.py", "skip_fraction.py"]

# The worker: one per tree, started with that tree first on sys.path; one JSON request per stdin line,
# one "RESULT {json}" line per evaluation on stdout.
WORKER = r"""
import json, sys, time
from pathlib import Path
from harness.config import EvalConfig, TimingConfig
from harness.evaluate import evaluate
from harness.problems.registry import get, load_suite
suite = load_suite()
print("READY", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    started = time.perf_counter()
    try:
        config = EvalConfig(trials=req["trials"], timing=TimingConfig.for_device(req["device"]),
                            use_reference_cache=False, ranks_per_gpu=req["ranks_per_gpu"])
        r = evaluate(get(suite, req["problem"]), Path(req["candidate"]), world_size=req["world_size"],
                     device=req["device"], shape=req["shape"], config=config)
        t = r.timings
        out = {"verdict": r.verdict, "flags": r.flags, "phase": r.failure.phase if r.failure else None,
               "message": r.failure.message[:300] if r.failure else "",
               "cand_ms": t.candidate.median_ms if t else None, "ref_ms": t.reference.median_ms if t else None,
               "cand_cv": t.candidate.cv if t else None, "ref_cv": t.reference.cv if t else None,
               "cand_host_ms": t.candidate.host_median_ms if t else None,
               "refill_ms": getattr(t.candidate, "refill_median_ms", None) if t else None,
               "judged": r.integrity.get("timed_outputs_judged"), "stages": r.stages}
    except Exception as exc:  # one failed evaluation must not end the run
        out = {"verdict": "harness_exception", "message": f"{type(exc).__name__}: {exc}"[:500]}
    out["wall_s"] = round(time.perf_counter() - started, 2)
    print("RESULT " + json.dumps(out), flush=True)
"""


class TreeWorker:
    """A long-lived process evaluating with one tree's harness."""

    def __init__(self, tree: Path, label: str) -> None:
        # The tree first; what the caller's path held after it (a GPU machine's carried wheels, say).
        path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
               "NVSHMEM_DISABLE_NVLS": "1"}
        self.label = label
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], cwd=tree, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self._read("READY")

    def _read(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        raise RuntimeError(f"the {self.label} worker ended (exit {self.proc.wait()})")

    def evaluate(self, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return dict(json.loads(self._read("RESULT ")))

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def expectation(path: Path) -> dict[str, Any]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EXPECT" for t in node.targets):
            return dict(ast.literal_eval(node.value))
    raise ValueError(f"{path.name} declares no EXPECT")


def refill_cost(problem_name: str, shape_name: str, device: str, repeats: int = 20) -> dict[str, float]:
    """Drawing one rank's inputs of a timed call and copying them into its buffers, as harness.rank.timed
    does before every iteration: device time (CUDA events) and host time, medians."""
    import torch

    from harness.common.seeds import fill_recipe
    from harness.problems.registry import get, load_suite
    from harness.rank import refill

    problem = get(load_suite(), problem_name)
    dev = torch.device(device)
    draw = refill.drawer(problem, problem.shape(shape_name), 0, 2, dev)
    buffers = draw(fill_recipe(1, 0, 0))
    device_ms, host_ms = [], []
    for i in range(repeats + 2):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        buffers, _ = refill.refill(buffers, draw(fill_recipe(1, i + 1, 0)))
        host = (time.perf_counter() - began) * 1e3
        if dev.type == "cuda":
            end.record()
            torch.cuda.synchronize(dev)
            elapsed = start.elapsed_time(end)
        else:
            elapsed = host
        if i >= 2:  # the first draws allocate
            device_ms.append(elapsed)
            host_ms.append(host)
    nbytes = sum(t.numel() * t.element_size() for t in buffers if isinstance(t, torch.Tensor))
    return {"device_ms": statistics.median(device_ms), "host_ms": statistics.median(host_ms), "bytes": nbytes}


def summarise(rows: list[dict[str, Any]], experts: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    out = []
    for problem, rel, shape in experts:
        mine = [r for r in rows if r["expert"] == rel and r["shape"] == shape]
        entry: dict[str, Any] = {"problem": problem, "expert": Path(rel).name, "shape": shape}
        for tree in ("base", "this"):
            runs = [r for r in mine if r["tree"] == tree and r.get("cand_ms")]
            for key in ("cand_ms", "ref_ms"):
                values = [r[key] for r in runs if r.get(key)]
                entry[f"{tree}_{key}"] = statistics.median(values) if values else None
                entry[f"{tree}_{key}_spread_pct"] = (100 * (max(values) - min(values)) / statistics.median(values)
                                                    if len(values) > 1 else None)
            entry[f"{tree}_verdicts"] = sorted({r["verdict"] for r in mine if r["tree"] == tree})
        for key in ("cand_ms", "ref_ms"):
            before, after = entry.get(f"base_{key}"), entry.get(f"this_{key}")
            entry[f"{key}_change_pct"] = 100 * (after - before) / before if before and after else None
        refills = [r["refill_ms"] for r in mine if r["tree"] == "this" and r.get("refill_ms") is not None]
        entry["refill_ms_in_eval"] = statistics.median(refills) if refills else None
        out.append(entry)
    return out


def fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def tables(summary: list[dict[str, Any]], refills: dict[str, Any], exploits: list[dict[str, Any]], unit: float,
           unit_name: str) -> str:
    lines = [f"### Timed medians, before (base tree) and after (this tree), {unit_name}\n",
             f"| expert | shape | cand before | cand after | change % | spread % (before/after) | ref before | "
             f"ref after | ref change % | refill {unit_name} (draw + copy) | verdicts |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    def scaled(value: float | None) -> str:
        return fmt(None if value is None else value * unit)

    for e in summary:
        spread = f"{fmt(e['base_cand_ms_spread_pct'])}/{fmt(e['this_cand_ms_spread_pct'])}"
        refill = refills.get(f"{e['problem']}:{e['shape']}", {})
        lines.append(
            f"| {e['expert']} | {e['shape']} | {scaled(e['base_cand_ms'])} | {scaled(e['this_cand_ms'])} | "
            f"{fmt(e['cand_ms_change_pct'], 2)} | {spread} | {scaled(e['base_ref_ms'])} | {scaled(e['this_ref_ms'])} | "
            f"{fmt(e['ref_ms_change_pct'], 2)} | {scaled(refill.get('device_ms'))} | "
            f"{'/'.join(e['base_verdicts'])} -> {'/'.join(e['this_verdicts'])} |")
    if exploits:
        lines += ["\n### Timed-call exploits, base tree then this tree\n",
                  "| exploit | shape | base: verdict, flags, speedup | this: verdict, flags | expected | ok |",
                  "|---|---|---|---|---|---|"]
        for d in exploits:
            b = d["base"]
            speed = f"{b['ref_ms'] / b['cand_ms']:.1f}x" if b.get("cand_ms") and b.get("ref_ms") else "-"
            lines.append(f"| {d['exploit']} | {d['shape']} | {b['verdict']}, {', '.join(b.get('flags', [])) or '-'}, "
                         f"{speed} | {d['verdict']}, {', '.join(d.get('flags', [])) or '-'} | {d['expected']} | "
                         f"{'yes' if d['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-tree", type=Path, required=True, help="the repository at the commit to compare with")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--ranks-per-gpu", type=int, default=2, help="2: W=2 on one GPU (emulated); 1: one GPU a rank")
    parser.add_argument("--rounds", type=int, default=2, help="evaluations of every expert with every tree")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--only", default=None, help="only experts whose file name contains this")
    parser.add_argument("--all-experts", action="store_true", help="every expert of problems/*/solutions/")
    parser.add_argument("--skip-exploits", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="one round, first expert(s) only (with --device cpu)")
    args = parser.parse_args()
    base = args.base_tree.resolve()
    if not (base / "harness" / "evaluate.py").exists():
        parser.error(f"--base-tree {base} holds no harness/evaluate.py")
    args.out.mkdir(parents=True, exist_ok=True)
    experts = (GPU_EXPERTS + (MORE_GPU_EXPERTS if args.all_experts else [])) if args.device == "cuda" else CPU_EXPERTS
    if args.only:
        experts = [e for e in experts if args.only in e[1]]
    if args.dry_run:
        args.rounds, experts = 1, experts[:2]
    rpg = args.ranks_per_gpu if args.device == "cuda" else 1
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": args.device, "ranks_per_gpu": rpg,
                              "rounds": args.rounds, "base_tree": str(base), "rows": []}
    started = time.time()

    def save() -> None:
        tmp = args.out / "protocol_ab.json.tmp"
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(args.out / "protocol_ab.json")

    # 1. What drawing a timed call's inputs costs (this tree, in this process).
    refills: dict[str, Any] = {}
    for problem, _, shape in experts:
        key = f"{problem}:{shape}"
        if key not in refills:
            try:
                refills[key] = refill_cost(problem, shape, args.device)
            except Exception as exc:  # a missing figure must not end the run
                refills[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print("refill", key, json.dumps(refills[key]), flush=True)
    report["refill"] = refills
    save()

    # 2. Every expert with both trees, alternately.
    workers = {"base": TreeWorker(base, "base"), "this": TreeWorker(ROOT, "this")}
    try:
        for round_no in range(args.rounds):
            for i, (problem, rel, shape) in enumerate(experts):
                order = ("base", "this") if (round_no + i) % 2 == 0 else ("this", "base")
                for tree in order:
                    root = base if tree == "base" else ROOT
                    row = workers[tree].evaluate(problem=problem, candidate=str((root / "problems" / rel).resolve()),
                                                 shape=shape, device=args.device, world_size=2, ranks_per_gpu=rpg,
                                                 trials=args.trials)
                    row.update(tree=tree, round=round_no, problem=problem, expert=rel, shape=shape)
                    report["rows"].append(row)
                    save()
                    print(json.dumps({k: row.get(k) for k in ("round", "tree", "expert", "shape", "verdict",
                                                               "cand_ms", "ref_ms", "refill_ms", "wall_s")}),
                          flush=True)
    finally:
        for w in workers.values():
            w.close()
    summary = summarise(report["rows"], experts)
    report["summary"] = summary

    # 3. The timed-call exploits, with both trees (the base tree's harness evaluates this tree's files).
    exploits: list[dict[str, Any]] = []
    if not args.skip_exploits:
        names = GPU_EXPLOITS if args.device == "cuda" else CPU_EXPLOITS[:1 if args.dry_run else None]
        workers = {"base": TreeWorker(base, "base"), "this": TreeWorker(ROOT, "this")}
        try:
            for name in names:
                path = ROOT / "tests" / "exploits" / name
                expect = expectation(path)
                shape = expect.get("shape", "small")
                entry: dict[str, Any] = {"exploit": name, "shape": shape, "expected": expect["verdict"]}
                for tree in ("base", "this"):
                    r = workers[tree].evaluate(problem=expect["problem"], candidate=str(path), shape=shape,
                                               device=args.device, world_size=2, ranks_per_gpu=rpg, trials=3)
                    entry[tree] = r
                    print(json.dumps({"exploit": name, "tree": tree, **{k: r.get(k) for k in
                                                                        ("verdict", "flags", "phase", "cand_ms",
                                                                         "ref_ms")}}), flush=True)
                r = entry["this"]
                entry.update(verdict=r["verdict"], flags=r.get("flags", []), phase=r.get("phase"))
                entry["ok"] = r["verdict"] == expect["verdict"] and set(expect["flags"]) <= set(r.get("flags", [])) \
                    and ("phase" not in expect or r.get("phase") == expect["phase"])
                exploits.append(entry)
                report["exploits"] = exploits
                save()
        finally:
            for w in workers.values():
                w.close()
    report["wall_s"] = round(time.time() - started, 1)
    save()
    unit, unit_name = (1e3, "µs") if args.device == "cuda" else (1.0, "ms")
    text = tables(summary, refills, exploits, unit, unit_name)
    (args.out / "protocol_ab.md").write_text(f"{report['date']}, {args.device}, ranks_per_gpu={rpg}, "
                                             f"{args.rounds} round(s), {report['wall_s']} s\n\n" + text)
    print("\n" + text)
    moved = [e["expert"] for e in summary if e["cand_ms_change_pct"] is not None and abs(e["cand_ms_change_pct"]) >= 2]
    print(f"honest medians moved by 2% or more: {', '.join(moved) or 'none'}; exploits not as declared: "
          f"{', '.join(d['exploit'] for d in exploits if not d['ok']) or 'none'}; wall {report['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
