"""What a trusted rank does for an evaluation: draw inputs, run the reference, write both as files, time
the reference. Rank side; only ever in pools that never load candidate code.

Files land in the folder the request names (the harness's private folder for this evaluation, which no
sandbox can see): `in-<trial>-r<rank>.pt` (inputs, torch.save with process groups as GroupRefs: they go
to the candidate's rank with the call that uses them), `exp-<trial>-r<rank>.bin` (the reference's
output, for the judge), `after-<trial>-r<rank>.bin` (the reference's inputs after its call, written only
when the reference modifies them), and the same for timing's input sets (`set-`, `fresh-`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harness.common import failures, integrity, messages, seeds
from harness.rank import refill, transport
from harness.rank.calls import clone_tree, fingerprint, leaves, same_bytes
from harness.rank.candidate import trimmed_traceback
from harness.rank.timed import TimedSession, agree_min, input_sets_needed, l2_and_free

if TYPE_CHECKING:
    from harness.problems.problem import Problem
    from harness.rank.worker import Worker


def _fail(verdict: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "verdict": verdict, "message": message[:1500], **extra}


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def probe_inputs(worker: Worker, problem: Problem, shape: dict[str, Any], seed: int,
                 rank: int | None = None) -> tuple[Any, ...]:
    """The precision probe's inputs of `rank`: its ordinary draw with the main tensors replaced."""
    rank = worker.rank if rank is None else rank
    base = worker.inputs(problem, shape, seed, integrity.PROBE_TRIAL, rank)
    gen = torch.Generator(device=worker.device)
    gen.manual_seed(integrity.probe_seed(seed, rank))
    return integrity.precision_probe_inputs(base, problem.dtype, gen)


def _probe_validity(worker: Worker, problem: Problem, shape: dict[str, Any], seed: int, expected: Any) -> str | None:
    """None when the reference is itself exact enough on the probe inputs (it matches the oracle within
    half the tolerance), else why the probe cannot judge this problem."""
    from harness.common.compare import compare_outputs  # trusted rank: no candidate code here

    if problem.oracle is None:
        return "the problem has no oracle"
    everyone = [_to_cpu(probe_inputs(worker, problem, shape, seed, r)) for r in range(worker.world_size)]
    try:
        oracle = problem.oracle(shape, worker.world_size, everyone)[worker.rank]
    except Exception as exc:
        return f"the oracle failed on probe inputs: {type(exc).__name__}: {exc}"[:300]
    result = compare_outputs(oracle, _to_cpu(expected), problem.atol / 2, problem.rtol / 2)
    return None if result["ok"] else f"the reference is not exact on probe inputs: {result['message']}"[:300]


def _write_expected(path: Path, out: Any) -> None:
    try:
        transport.write_tree(path, out)
    except transport.UnsupportedValue as err:
        raise ReferenceOutputError(f"the reference's output cannot be compared: {err}") from None


class ReferenceOutputError(RuntimeError):
    pass


def _run_reference(worker: Worker, problem: Problem, inputs: tuple[Any, ...], folder: Path,
                   stem: str, save_inputs: bool = True) -> dict[str, Any]:
    """Save the inputs and their fingerprint (unless the candidate's rank draws them itself), run the
    reference on a copy, save its output (and its inputs if it changed them)."""
    before = fingerprint(inputs) if save_inputs else None
    groups = transport.save_inputs(folder / f"in-{stem}-r{worker.rank}.pt", inputs) if save_inputs else []
    theirs = clone_tree(inputs)
    out = problem.solution(*theirs)
    worker.sync()
    _write_expected(folder / f"exp-{stem}-r{worker.rank}.bin", out)
    mutated = not same_bytes(inputs, theirs)
    if mutated:
        transport.write_tree(folder / f"after-{stem}-r{worker.rank}.bin",
                             [t for t in leaves(theirs) if isinstance(t, torch.Tensor)])
    return {"fingerprint": before, "mutated": mutated, "groups": [list(g.ranks) if g.ranks is not None else None
                                                                  for g in groups], "out": out}


def trials(worker: Worker, req: messages.RefTrials) -> dict[str, Any]:
    """Op "ref_trials": every correctness trial of the schedule on this rank, in the order given. Every
    rank runs every trial whatever happens, so collectives stay matched; the first failure is reported."""
    problem = worker.problem(req.problem)
    shape = problem.shape(req.shape)
    seed = req.seed
    folder = Path(req.dir)
    done, failure = [], None
    for trial in req.trials:
        tid, kind = trial.id, trial.kind
        began = time.perf_counter()
        try:
            if kind == "probe":
                inputs = probe_inputs(worker, problem, shape, seed)
            else:
                inputs = worker.inputs(problem, shape, seed, tid)
            info = _run_reference(worker, problem, inputs, folder, str(tid))
            out = info.pop("out")
            if kind == "probe":
                info["probe_note"] = _probe_validity(worker, problem, shape, seed, out)
            del out
        except ReferenceOutputError as err:
            failure = failure or _fail(failures.INFRA_ERROR, f"rank {worker.rank}, trial {tid}: {err}")
            continue
        except Exception as exc:
            failure = failure or _fail(failures.INFRA_ERROR, f"rank {worker.rank}: the reference raised "
                                       f"{type(exc).__name__} in trial {tid}: {exc}", evidence=trimmed_traceback(exc))
            continue
        done.append({"id": tid, **info, "seconds": time.perf_counter() - began})
    return failure or {"ok": True, "trials": done}


def timing_sets(worker: Worker, req: messages.RefSets) -> dict[str, Any]:
    """Op "ref_sets": how many rotated input sets timing needs (one pass over them exceeds 3x L2), and the
    expected outputs of the calls the harness will judge. Where a rank can draw its inputs from a recipe
    (harness.rank.refill) every timed call gets new contents, so what is saved is the judged calls' outputs
    (`t<trial>` files; no inputs are written: the candidate's ranks draw their own). Where it cannot (inputs
    holding process groups or modules), the rotated and fresh sets are saved with their outputs, as files
    the candidate's ranks load (`set<k>`, `fresh<j>`)."""
    problem = worker.problem(req.problem)
    shape = problem.shape(req.shape)
    seed, base = req.seed, req.trial_base
    folder = Path(req.dir)
    try:
        first = worker.inputs(problem, shape, seed, base)
        set_bytes = transport.tree_nbytes(first)
        l2_bytes, free_bytes = l2_and_free(worker.device)
        wanted = input_sets_needed(set_bytes, l2_bytes, req.config, free_bytes) \
            if worker.device.type == "cuda" else int(req.config.get("min_input_sets", 2))
        n_sets = agree_min(wanted, worker.device)
        why_not = refill.not_refillable(first) if req.refill else "refill is off"
        if agree_min(int(why_not is None), worker.device):  # every rank must choose alike
            return _judged_outputs(worker, problem, shape, req, n_sets, set_bytes, l2_bytes)
        sets = [first] + [worker.inputs(problem, shape, seed, base + i) for i in range(1, n_sets)]
        fresh = [worker.inputs(problem, shape, seed, base + integrity.FRESH_TRIAL_OFFSET + j)
                 for j in range(req.fresh)]
        prints, mutated, groups = [], False, []
        named = [*((f"set{i}", s) for i, s in enumerate(sets)), *((f"fresh{j}", s) for j, s in enumerate(fresh))]
        for stem, inputs in named:
            info = _run_reference(worker, problem, inputs, folder, stem)
            del info["out"]
            prints.append(info["fingerprint"])
            mutated = mutated or info["mutated"]
            groups += info["groups"]
    except ReferenceOutputError as err:
        return _fail(failures.INFRA_ERROR, f"rank {worker.rank}, timing inputs: {err}")
    except Exception as exc:
        return _fail(failures.INFRA_ERROR, f"rank {worker.rank}: the reference raised {type(exc).__name__} on "
                                           f"timing inputs: {exc}", evidence=trimmed_traceback(exc))
    worker.timing_sets = (sets, fresh)
    worker.timing_draw = None
    return {"ok": True, "refill": False, "why_not": why_not, "input_sets": n_sets, "set_bytes": set_bytes,
            "l2_bytes": l2_bytes, "fingerprints": prints, "mutated": mutated, "groups": groups}


def _judged_outputs(worker: Worker, problem: Problem, shape: dict[str, Any], req: messages.RefSets, n_sets: int,
                    set_bytes: int, l2_bytes: int) -> dict[str, Any]:
    """The reference's outputs of every call the harness will judge, drawn from the same recipes the
    candidate's ranks will get; the rotated sets' first contents for the reference's own timing."""
    seed, base, folder = req.seed, req.trial_base, Path(req.dir)
    draw = refill.drawer(problem, shape, worker.rank, worker.world_size, worker.device)
    mutated = False
    for judged in req.judged:
        trial = judged.trial
        inputs = draw(seeds.fill_recipe(seed, trial, worker.rank, judged.probe))
        info = _run_reference(worker, problem, inputs, folder, f"t{trial}", save_inputs=False)
        del info["out"], inputs
        mutated = mutated or info["mutated"]
    worker.timing_sets = ([draw(seeds.fill_recipe(seed, base + k, worker.rank)) for k in range(n_sets)], [])
    worker.timing_draw = draw
    return {"ok": True, "refill": True, "input_sets": n_sets, "set_bytes": set_bytes, "l2_bytes": l2_bytes,
            "mutated": mutated, "groups": []}


def time_begin(worker: Worker, req: messages.RefTimeBegin) -> dict[str, Any]:
    """Timing of the reference on the sets ref_sets drew, every call's inputs drawn anew from the recipes the
    requests bring where ref_sets found that possible (its outputs are dropped: the judged ones were saved)."""
    if worker.timing_sets is None:
        return _fail(failures.INFRA_ERROR, "time_begin before ref_sets")
    problem = worker.problem(req.problem)
    sets, fresh = worker.timing_sets
    # What a candidate's rank does around each timed call, done here too, so that the harness's clock sees
    # the same per-request work on both sides: the collective monitor's watch, the plain-data check of the
    # output, the guard's checks after every request (harness.rank.worker.serve; never judged here).
    if not worker.guard.captured:
        worker_module = sys.modules[type(worker).__module__]
        worker.guard.capture(extra=[("worker", worker_module), ("worker.Worker", worker_module.Worker),
                                    *((f"problem {spec}", p.module) for spec, p in worker.problems.items())])
    solution = worker.monitor.watch(problem.solution, lambda: True)
    worker.timing = TimedSession(solution, sets, fresh if req.fresh else [], worker.device,
                                 plain=transport.describe_unsupported, clone=req.clone_inputs,
                                 draw=worker.timing_draw)
    return {"ok": True, "input_sets": len(sets)}


def validate(worker: Worker, req: messages.Validate) -> dict[str, Any]:
    """Op "validate": the distributed reference against the single-process oracle, over several trials.
    Every trial runs on every rank even after a failure, so the ranks' collectives stay matched."""
    from harness.common.compare import compare_outputs, same_values  # trusted rank: no candidate code here

    problem = worker.problem(req.problem)
    shape = problem.shape(req.shape)
    oracle = problem.oracle
    if oracle is None:  # loading checked it is there; every rank sees the same problem, so all return here
        return _fail(failures.INFRA_ERROR, "the problem has no oracle")
    worst = 0.0
    failure: dict[str, Any] | None = None
    for trial in range(req.trials):
        mine = worker.inputs(problem, shape, req.seed, trial)
        out = problem.solution(*clone_tree(mine))
        worker.sync()
        # Every rank's inputs, drawn on this device (a CUDA generator's stream differs from the CPU's),
        # then handed to the oracle on the CPU.
        everyone = [_to_cpu(worker.inputs(problem, shape, req.seed, trial, r)) for r in range(worker.world_size)]
        expected = oracle(shape, worker.world_size, everyone)
        if failure is not None:
            continue
        if len(expected) != worker.world_size:
            failure = _fail(failures.INFRA_ERROR, f"oracle returned {len(expected)} outputs for "
                                                  f"{worker.world_size} ranks")
            continue
        result = compare_outputs(expected[worker.rank], _to_cpu(out), problem.atol, problem.rtol)
        if not result["ok"]:
            failure = _fail(result["verdict"], f"reference disagrees with oracle on rank {worker.rank}, "
                                               f"trial {trial}: {result['message']}", trial=trial)
        elif not same_values(mine, worker.inputs(problem, shape, req.seed, trial)):
            failure = _fail(failures.OUTPUT_MISMATCH, "make_inputs is not reproducible from the seed", trial=trial)
        else:
            worst = max(worst, result.get("max_abs_err", 0.0))
    return failure or {"ok": True, "max_abs_err": worst}
