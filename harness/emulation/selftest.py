"""Exercise the emulation without the harness: W rank processes on the visible GPU(s) under gloo run every
expert solution of problems/*/solutions/ against its problem's reference, and the synchronisation
exploits, which must still misbehave.

    python -m harness.emulation.selftest --world-size 2,4 [--shape small] [--trials 4] [--json out.json]

Each world size gets its own W processes (a FileStore in a temporary folder, NVLink multicast off in
their environment, the emulation installed before anything is loaded). Per case: fresh random inputs per
trial, candidate and reference on equal copies, every rank's outputs compared with the problem's
tolerance; then stress trials with one rank late (a device-side spin), and a short timing loop whose
numbers are emulated latencies, never speedups. Exit status 0 when every expert is correct (or refused
with a reason) and every exploit misbehaved at least once. This is a development tool: verdicts of
record come from harness.evaluate.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, cast

from harness.common.safe_env import SAFE_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPLOITS = ("gpu_race_no_barrier.py", "gpu_stale_epoch.py")
LATE_SPIN_CYCLES = 2_000_000  # about 1 ms at H200 clocks: the stress trials' late rank


# -- the plan (parent side) -------------------------------------------------------------------------
def problem_file(name: str) -> Path:
    found = sorted(REPO_ROOT.glob(f"problems/*/{name}.py"))
    if len(found) != 1:
        raise SystemExit(f"problem {name!r}: {len(found)} files match problems/*/{name}.py")
    return found[0]


def plan_cases(shape: str, only: str | None, exploits: bool) -> list[dict[str, Any]]:
    cases = []
    for path in sorted(REPO_ROOT.glob("problems/*/solutions/*.py")):
        cases.append({"name": path.stem, "kind": "expert", "candidate": str(path),
                      "problem": str(problem_file(path.stem.split("__")[0])), "shape": shape})
    if exploits:
        for name in EXPLOITS:
            path = REPO_ROOT / "tests" / "exploits" / name
            expect = _expectation(path)
            cases.append({"name": path.stem, "kind": "exploit", "candidate": str(path),
                          "problem": str(problem_file(expect["problem"])), "shape": expect.get("shape", shape)})
    return [c for c in cases if only is None or only in c["name"]]


def _expectation(path: Path) -> dict[str, Any]:
    """An exploit's EXPECT dict, read without importing (importing runs the hack)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EXPECT" for t in node.targets):
            return cast(dict[str, Any], ast.literal_eval(node.value))  # every exploit's EXPECT is a dict literal
    raise SystemExit(f"{path} declares no EXPECT")


def run_world(world_size: int, cases: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """W rank processes for all cases; their per-rank reports merged."""
    folder = Path(tempfile.mkdtemp(prefix="pkb-emulation-selftest-"))
    try:
        plan = {"cases": cases, "trials": args.trials, "stress": args.stress, "calls": args.calls,
                "barrier_iters": args.barrier_iters, "seed": args.seed, "ranks_per_gpu": args.ranks_per_gpu}
        (folder / "plan.json").write_text(json.dumps(plan))
        env = {**os.environ, **SAFE_ENV, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        procs = []
        for rank in range(world_size):
            log = open(folder / f"rank{rank}.log", "w")  # closed once the rank has ended
            cmd = [sys.executable, "-m", "harness.emulation.selftest", "--child", "--rank", str(rank),
                   "--world-size", str(world_size), "--folder", str(folder)]
            procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True, cwd=REPO_ROOT), log))
        started = time.perf_counter()
        timed_out = False
        for proc, _ in procs:
            left = args.timeout - (time.perf_counter() - started)
            try:
                proc.wait(timeout=max(left, 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        for proc, log in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
        reports = []
        for rank in range(world_size):
            out = folder / f"rank{rank}.json"
            reports.append(json.loads(out.read_text()) if out.exists() else None)
        logs = {rank: (folder / f"rank{rank}.log").read_text()[-3000:] for rank in range(world_size)}
        return merge(world_size, cases, reports, logs, timed_out, time.perf_counter() - started)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def merge(world_size: int, cases: list[dict[str, Any]], reports: list[Any], logs: dict[int, str],
          timed_out: bool, wall_s: float) -> dict[str, Any]:
    merged = []
    for i, case in enumerate(cases):
        per_rank = [r["cases"][i] if r and i < len(r["cases"]) else None for r in reports]
        merged.append({**case, "ranks": per_rank, "outcome": outcome(case, per_rank)})
    barrier = [r.get("barrier") for r in reports if r]
    troubled = timed_out or any(c["outcome"].startswith(("incomplete", "error")) for c in merged)
    return {"world_size": world_size, "timed_out": timed_out, "wall_s": round(wall_s, 2), "cases": merged,
            "barrier": barrier, "errors": [r.get("error") for r in reports if r and r.get("error")],
            "logs": logs if troubled else {}}


def outcome(case: dict[str, Any], per_rank: list[Any]) -> str:
    if any(r is None for r in per_rank):
        return "incomplete (timeout or crash)"
    if any(r["status"] == "skipped" for r in per_rank):
        return f"skipped: {per_rank[0]['message']}"
    if any(r["status"] == "refused" for r in per_rank):
        return f"refused: {next(r['message'] for r in per_rank if r['status'] == 'refused')}"
    if any(r["status"] == "error" for r in per_rank):
        return f"error: {next(r['message'] for r in per_rank if r['status'] == 'error')}"
    bad = sum(1 for r in per_rank for t in r["trials"] if not t["ok"])
    total = sum(len(r["trials"]) for r in per_rank)
    if case["kind"] == "expert":
        return "correct" if bad == 0 else f"WRONG in {bad} of {total} rank-trials"
    return f"misbehaved in {bad} of {total} rank-trials" if bad else "NOT CAUGHT (always right)"


def passed(result: dict[str, Any]) -> bool:
    for case in result["cases"]:
        if case["kind"] == "expert" and not (case["outcome"] == "correct" or case["outcome"].startswith(
                ("refused", "skipped"))):
            return False
        if case["kind"] == "exploit" and not case["outcome"].startswith("misbehaved"):
            return False
    return not result["timed_out"]


def print_result(result: dict[str, Any]) -> None:
    w = result["world_size"]
    print(f"\nW={w}: {result['wall_s']} s for the whole group{' (TIMED OUT)' if result['timed_out'] else ''}")
    for case in result["cases"]:
        ranks = [r for r in case["ranks"] if r]
        wall = max((r.get("wall_s", 0.0) for r in ranks), default=0.0)
        lat = [r["candidate_ms"] for r in ranks if r.get("candidate_ms") is not None]
        ref = [r["reference_ms"] for r in ranks if r.get("reference_ms") is not None]
        timing = (f"  [emulated latency, not a speedup: candidate {max(lat):.3f} ms, reference {max(ref):.3f} ms]"
                  if lat and ref else "")
        print(f"  {case['kind']:7} {case['name']:45} {case['shape']:8} {case['outcome']}  ({wall:.2f} s){timing}")
    for b in result["barrier"]:
        if b:
            print(f"  barrier round trip, rank {b['rank']}: median {b['median_us']:.1f} us over {b['iters']} "
                  f"(first {b['first_ms']:.2f} ms)")
    for error in result["errors"]:
        print(f"  rank error: {error}")
    for rank, text in result["logs"].items():
        print(f"--- rank {rank} log (tail) ---\n{text}")


# -- one rank (child side) --------------------------------------------------------------------------
def child(rank: int, world_size: int, folder: Path) -> None:
    # Deferred: torch and the emulation's installer are the rank processes'; the parent only plans and reads.
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import FileStore  # torch.distributed's, which mypy sees as not re-exported

    from harness.emulation import install, layout

    plan = json.loads((folder / "plan.json").read_text())
    per_gpu = plan["ranks_per_gpu"] or world_size
    visible = list(range(torch.cuda.device_count()))
    device = torch.device("cuda", layout.rank_gpus(world_size, per_gpu, visible)[rank])
    torch.cuda.set_device(device)
    store = FileStore(str(folder / "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    install()
    report: dict[str, Any] = {"rank": rank, "cases": []}
    try:
        report["barrier"] = barrier_latency(device, plan["barrier_iters"])
        for case in plan["cases"]:
            try:
                report["cases"].append(run_case(case, plan, rank, world_size, device))
            except Exception as err:  # the selftest's own failure: reported, next case
                report["cases"].append({"status": "error", "trials": [],
                                        "message": f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"})
            (folder / f"rank{rank}.json").write_text(json.dumps(report))
    except Exception as err:
        report["error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=6)}"
        raise
    finally:
        (folder / f"rank{rank}.json").write_text(json.dumps(report))
        dist.destroy_process_group()


def barrier_latency(device: Any, iters: int) -> dict[str, Any]:
    """handle.barrier() back to back: what one cross-rank synchronisation costs with ranks time-sliced
    on one GPU (on NVLink it is microseconds)."""
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    buf = symm_mem.empty(1024, dtype=torch.uint8, device=device)
    world = dist.group.WORLD
    assert world is not None  # child() initialised the default group
    handle = symm_mem.rendezvous(buf, world)
    dist.barrier()
    start = time.perf_counter()
    handle.barrier(channel=0)
    torch.cuda.synchronize(device)
    first_ms = (time.perf_counter() - start) * 1e3
    times = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        handle.barrier(channel=1)
        torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e6)
    return {"rank": handle.rank, "iters": iters, "first_ms": first_ms,
            "median_us": statistics.median(times) if times else float("nan")}


def load_module(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_case(case: dict[str, Any], plan: dict[str, Any], rank: int, world_size: int, device: Any) -> dict[str, Any]:
    # Deferred: rank side only (see child).
    import torch
    import torch.distributed as dist

    from harness.emulation.errors import NotAvailableInEmulation

    started = time.perf_counter()
    problem = load_module(case["problem"], f"pkb_selftest_problem_{case['name']}")
    spec = problem.PROBLEM
    if world_size not in spec["world_sizes"]:
        return {"status": "skipped", "message": f"W={world_size} not in {spec['world_sizes']}", "trials": []}
    shape = spec["shapes"][case["shape"]]
    atol, rtol = spec["tolerance"]["atol"], spec["tolerance"]["rtol"]
    result: dict[str, Any] = {"status": "ok", "message": "", "trials": []}
    candidate = None
    try:
        candidate = load_module(case["candidate"], f"pkb_selftest_candidate_{case['name']}")
    except NotAvailableInEmulation as err:
        result.update(status="refused", message=str(err))
    except Exception as err:  # reported, not raised: the other ranks keep going
        result.update(status="error", message=f"import: {type(err).__name__}: {err}")
    if not all_ok(result["status"] == "ok"):
        return result
    assert candidate is not None
    total = plan["trials"] + plan["stress"]
    for trial in range(total):
        late_rank = trial % world_size if trial >= plan["trials"] else None
        inputs = make_inputs(problem, shape, rank, world_size, device, plan["seed"], trial)
        dist.barrier()
        error = None
        got: Any = None
        try:
            if rank == late_rank:
                torch.cuda._sleep(LATE_SPIN_CYCLES)
            got = candidate.solution(*clone(inputs))
            torch.cuda.synchronize(device)
        except NotAvailableInEmulation as err:
            error = ("refused", str(err))
        except Exception as err:
            error = ("error", f"trial {trial}: {type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}")
        if not all_ok(error is None):
            if error:
                result.update(status=error[0], message=error[1])
            else:
                result.update(status="error", message=f"trial {trial}: a peer rank failed")
            return result
        expected = problem.solution(*clone(inputs))
        torch.cuda.synchronize(device)
        ok, message, abs_err = compare(expected, got, atol, rtol)
        result["trials"].append({"trial": trial, "late_rank": late_rank, "ok": ok, "message": message,
                                 "max_abs_err": abs_err})
    result["wall_s"] = time.perf_counter() - started
    if plan["calls"] and all(t["ok"] for t in result["trials"]):
        inputs = make_inputs(problem, shape, rank, world_size, device, plan["seed"], total)
        result["candidate_ms"] = call_latency(candidate.solution, inputs, plan["calls"], device)
        result["reference_ms"] = call_latency(problem.solution, inputs, plan["calls"], device)
    return result


def all_ok(mine: bool) -> bool:
    """Every rank's flag (a host collective between trials, so one rank's failure stops all of them)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([0 if mine else 1], dtype=torch.int32)
    dist.all_reduce(flag)
    return int(flag.item()) == 0


def make_inputs(problem: Any, shape: dict[str, Any], rank: int, world_size: int, device: Any, seed: int,
                trial: int) -> tuple[Any, ...]:
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1_000_003 + trial * 1009 + rank)
    return tuple(problem.make_inputs(shape, rank, world_size, gen, device))


def clone(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(clone(v) for v in value)
    return value


def call_latency(fn: Any, inputs: tuple[Any, ...], calls: int, device: Any) -> float:
    """Median host-measured ms per call, ranks started together: an emulated latency, not a speedup."""
    import torch
    import torch.distributed as dist

    times = []
    for _ in range(calls):
        args = clone(inputs)
        dist.barrier()
        start = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def compare(expected: Any, got: Any, atol: float, rtol: float) -> tuple[bool, str, float]:
    """Same structure, shapes and dtypes; floats within atol + rtol*|expected| (NaN never passes);
    integers and bools exactly."""
    import torch

    exp = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    out = list(got) if isinstance(got, (tuple, list)) else [got]
    if len(exp) != len(out):
        return False, f"{len(out)} outputs, expected {len(exp)}", float("inf")
    worst = 0.0
    for i, (e, g) in enumerate(zip(exp, out)):
        if not isinstance(g, torch.Tensor) or type(g) is not torch.Tensor:
            return False, f"output {i} is {type(g).__name__}, not a plain tensor", float("inf")
        if g.shape != e.shape or g.dtype != e.dtype:
            return False, f"output {i}: {tuple(g.shape)} {g.dtype}, expected {tuple(e.shape)} {e.dtype}", float("inf")
        e64, g64 = e.detach().double().cpu(), g.detach().double().cpu()
        if e.is_floating_point():
            if torch.isnan(g64).any():
                return False, f"output {i} has NaN", float("inf")
            diff = (g64 - e64).abs()
            bad = diff > atol + rtol * e64.abs()
            worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
            if bad.any():
                message = f"output {i}: {int(bad.sum())} of {bad.numel()} values off (max {float(diff.max()):.3g})"
                return False, message, worst
        elif not torch.equal(e.cpu(), g.cpu()):
            return False, f"output {i}: integer values differ", float("inf")
    return True, "", worst


# -- entry point ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", default="2", help="world sizes, comma-separated (e.g. 2,4)")
    parser.add_argument("--shape", default="small", help="shape of the expert cases (exploits use their own)")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--stress", type=int, default=4, help="trials with one rank late, after the ordinary ones")
    parser.add_argument("--calls", type=int, default=10, help="timed calls per correct case (0: none)")
    parser.add_argument("--barrier-iters", type=int, default=50)
    parser.add_argument("--ranks-per-gpu", type=int, default=0, help="default: every rank on the first GPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="cases whose name contains this")
    parser.add_argument("--no-exploits", action="store_true")
    parser.add_argument("--timeout", type=float, default=540.0, help="seconds per world size")
    parser.add_argument("--json", default=None, help="write every result here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.rank, int(args.world_size), Path(args.folder))
        return 0
    cases = plan_cases(args.shape, args.only, not args.no_exploits)
    results = []
    ok = True
    for world_size in (int(w) for w in args.world_size.split(",")):
        result = run_world(world_size, cases, args)
        print_result(result)
        ok = ok and passed(result)
        results.append(result)
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv[1:], "results": results}, indent=1))
    print("\nselftest " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
