"""Validating problems: each distributed reference, under gloo, against its single-process oracle.

One pool per world size serves every problem; a problem that fails or hangs costs a pool restart, not
the run. Each problem is validated at the shape asked for and at that shape's held-out counterpart
(PROBLEM["held_out"], the shape only the final scoring uses), a row each. Problems from a
ParallelKernelBench checkout have no oracle: validate_without_oracle checks what can be checked without
one (the reference, judged as a candidate against itself).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.common import failures
from harness.config import EvalConfig, Limits
from harness.evaluate import evaluate
from harness.launch.pool import Hang, PoolError, RankPool
from harness.problems.contract_checks import input_issues, metadata_issues
from harness.problems.parallelkernelbench import input_report
from harness.problems.problem import Problem
from harness.problems.registry import UnknownProblem, discover, select


@dataclass
class Validation:
    problem: str
    category: str
    world_size: int
    ok: bool
    verdict: str
    message: str
    seconds: float
    shape: str = ""


def shapes_to_check(problem: Problem, shape: str) -> list[str]:
    """The shape asked for and its held-out counterparts (the final scoring runs those too)."""
    return [shape, *problem.held_out_shapes(shape)]


def validate_problems(
    problems: Sequence[Problem],
    world_sizes: Sequence[int],
    *,
    shape: str = "small",
    trials: int = 3,
    seed: int = 0,
    timeout: float = 60.0,
    on_result: Callable[[Validation], None] | None = None,
) -> list[Validation]:
    pkb = [p for p in problems if p.origin == "pkb"]
    results: list[Validation] = []
    if pkb:
        results += validate_without_oracle(pkb, world_sizes, shape=shape, trials=trials, seed=seed, timeout=timeout,
                                           on_result=on_result)
        problems = [p for p in problems if p.origin != "pkb"]

    def record(v: Validation) -> None:
        results.append(v)
        if on_result:
            on_result(v)

    for world_size in world_sizes:
        pool: RankPool | None = None
        try:
            for problem in problems:
                if not problem.supports(world_size):
                    continue
                for name in shapes_to_check(problem, shape):
                    pool = _validate_one(pool, problem, name, world_size, seed, trials, timeout, record)
        except PoolError as err:
            record(Validation("*", "*", world_size, False, failures.INFRA_ERROR, str(err), 0.0))
        finally:
            if pool is not None:
                pool.close()
    return results


def _validate_one(pool: RankPool | None, problem: Problem, shape: str, world_size: int, seed: int, trials: int,
                  timeout: float, record: Callable[[Validation], None]) -> RankPool | None:
    """One problem at one shape and W against its oracle; returns the pool to go on with (None: restart)."""
    started = time.perf_counter()

    def done(ok: bool, verdict: str, message: str) -> None:
        record(Validation(problem.name, problem.category, world_size, ok, verdict, message,
                          time.perf_counter() - started, shape))

    issues = metadata_issues(problem) + input_issues(problem, shape, world_size, seed)
    if issues:
        done(False, "contract", "; ".join(issues))
        return pool
    if pool is None:
        pool = RankPool(world_size, "cpu").start()
    request = {"op": "validate", "problem": problem.loader_spec, "shape": shape, "seed": seed, "trials": trials}
    try:
        replies = pool.request(request, timeout=timeout)
    except Hang as hang:
        failed = [r for r in hang.replies.values() if not r.get("ok")]
        if not failed:
            pool.kill()
            done(False, failures.DEADLOCK, str(hang))
            return None
        # A rank failed and its peers were left waiting: the failure is the finding, not a hang.
        replies = [*failed, *(r for r in hang.replies.values() if r.get("ok"))]
    bad = sorted((r for r in replies if not r.get("ok")), key=lambda r: r.get("rank", 0))
    if bad:
        pool.kill()  # a rank that failed mid-collective leaves the group unusable
        first = bad[0]
        message = first.get("message", "")
        if first.get("evidence"):
            message += "\n" + first["evidence"]
        done(False, first.get("verdict", failures.INFRA_ERROR), message)
        return None
    worst = max(r.get("max_abs_err", 0.0) for r in replies)
    done(True, "ok", f"max abs err {worst:.3g}")
    return pool


def validate_without_oracle(
    problems: Sequence[Problem],
    world_sizes: Sequence[int],
    *,
    shape: str = "small",
    trials: int = 3,
    seed: int = 0,
    timeout: float = 60.0,
    on_result: Callable[[Validation], None] | None = None,
) -> list[Validation]:
    """Validate ParallelKernelBench problems under gloo: they have no oracle, so each reference is judged as a candidate
    against itself by the full harness (harness.evaluate, no timing): it loads, runs on every rank, and
    agrees with itself on `trials` fresh inputs under the rules a PKB solution is held to. The message
    says so, and what happened to the inputs."""
    results: list[Validation] = []
    for w in world_sizes:
        for problem, name in ((p, n) for p in problems for n in shapes_to_check(p, shape)):
            if not problem.supports(w):
                continue
            started = time.perf_counter()
            notes = input_report.probe_inputs(problem, name, w, seed)
            config = EvalConfig(trials=max(2, trials), seed=seed, skip_timing=True,
                                limits=Limits(check_s=timeout, reference_s=max(timeout, 120.0)))
            result = evaluate(problem, problem.path, world_size=w, device="cpu", shape=name, config=config)
            if result.correct:
                rules = "; ".join(result.integrity.get("rules", {}).values())
                message = "; ".join([f"no oracle (PKB problem): the reference judged correct against itself on "
                                     f"{config.trials} trials ({rules})", *notes])
                verdict = "ok"
            else:
                assert result.failure is not None
                verdict, message = result.verdict, f"the reference against itself: {result.failure.message}"
                if result.failure.evidence:
                    message += "\n" + result.failure.evidence
            v = Validation(problem.name, problem.category, w, result.correct, verdict, message,
                           time.perf_counter() - started, name)
            results.append(v)
            if on_result:
                on_result(v)
    return results


def parse_world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"world sizes must be integers separated by commas, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"world sizes must be positive, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    """Plain-text entry point (`python -m harness.validate`); `pkb problems validate` is the rich one."""
    parser = argparse.ArgumentParser(description="Validate problem references against their oracles")
    parser.add_argument("selection", nargs="*", help="problem names, globs or categories")
    parser.add_argument("--world-size", default="2,4")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    suite, malformed = discover()
    for err in malformed:
        print(f"MALFORMED {err}", flush=True)
    try:
        problems = select(suite, args.selection)
        sizes = parse_world_sizes(args.world_size)
    except (UnknownProblem, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    def show(v: Validation) -> None:
        status = "PASS" if v.ok else "FAIL"
        print(f"{status} W={v.world_size} {v.problem:40s} {v.shape:18s} {v.seconds:6.2f}s  {v.verdict}: {v.message}",
              flush=True)

    started = time.perf_counter()
    results = validate_problems(problems, sizes, trials=args.trials, seed=args.seed, on_result=show)
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed in {time.perf_counter() - started:.1f} s")
    return 1 if failed or malformed else 0


if __name__ == "__main__":
    sys.exit(main())
