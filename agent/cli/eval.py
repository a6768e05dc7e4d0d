"""`pkb eval`: score one candidate file on one problem with the full harness protocol."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from agent.cli import emulation, sandbox_gate
from agent.cli.common import CliError, candidate_file, check_out_path, console, escape, existing_file, plain
from agent.cli.options import add_source_argument
from agent.rundir import write_out_text
from harness.common.flags import is_emulated, timing_note
from harness.emulation import layout

if TYPE_CHECKING:
    from harness.records.results import EvalResult


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("eval", help="evaluate a candidate solution file on one problem")
    p.add_argument("--problem", required=True, help="problem name, or PKB id with --source pkb:PATH (required)")
    add_source_argument(p)
    p.add_argument("--solution", required=True, type=candidate_file,
                   help="candidate file defining solution(*inputs) (required)")
    p.add_argument("--world-size", type=int, default=2, help="ranks (processes; on cuda one GPU each)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (gloo: proves the plumbing) or cuda (timings that mean something)")
    emulation.add_argument(p)
    p.add_argument("--shape", default=None, help="shape name (default: 'small' on cpu, 'default' on cuda)")
    p.add_argument("--trials", type=int, default=5, help="correctness trials (at least 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs (mixed with a secret per evaluation)")
    p.add_argument("--no-timing", action="store_true", help="check correctness only")
    p.add_argument("--fresh-reference", action="store_true",
                   help="time the reference again instead of reusing its cached timing (~/.cache/pkb-agent)")
    p.add_argument("--check-timeout", type=float, default=None, help="seconds the correctness phase may take "
                   "(default: the harness's check limit, longer for a slow reference)")
    p.add_argument("--json", action="store_true", help="print the result record as JSON")
    p.add_argument("--out", default=None, help="also write the result JSON to this file (default: not written)")
    p.set_defaults(handler=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    # What the arguments alone show is said before anything heavy is imported.
    # (--solution and the numeric options were checked as they were parsed: agent.cli.common.Parser)
    solution = existing_file(args.solution, "solution file")
    if args.out:
        check_out_path(args.out)
    # Deferred: the harness imports torch; the parser and `pkb --help` do not need it.
    import torch

    from agent.cli.source import check_shape, check_world_size, one_in, resolve_source
    from harness.config import EvalConfig, TimingConfig
    from harness.evaluate import evaluate
    from harness.launch.sandbox import SandboxUnavailable, probe

    problem = one_in(resolve_source(args.source), args.problem)
    shape = args.shape or ("default" if args.device == "cuda" else "small")
    check_shape(problem, shape)
    check_world_size(problem, args.world_size)
    emulated = layout.is_emulated(args.ranks_per_gpu)
    emulation.check(args.device, args.world_size, args.ranks_per_gpu)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise CliError("--device cuda: no CUDA device is visible on this machine")
        emulation.check(args.device, args.world_size, args.ranks_per_gpu, torch.cuda.device_count())
        if not emulated and torch.cuda.device_count() < args.world_size:
            raise CliError(f"--world-size {args.world_size} needs {args.world_size} GPUs; "
                           f"{torch.cuda.device_count()} visible (or share them: --ranks-per-gpu)")
    # Said once the input is known to be good: a bad argument stays a one-line error, warning or not.
    try:
        sandbox = probe()
    except SandboxUnavailable as err:
        raise CliError(str(err)) from None
    if sandbox.backend == "none":  # one file a person chose: scored anyway, never silently
        print(f"pkb eval: warning: the candidate runs unsandboxed ({sandbox.reason}); "
              f"install bubblewrap ({sandbox_gate.INSTALL}) for the sandbox", file=sys.stderr)
    config = EvalConfig(trials=args.trials, seed=args.seed, skip_timing=args.no_timing,
                        use_reference_cache=not args.fresh_reference,
                        timing=TimingConfig.for_device(args.device), **layout.eval_config_fields(args.ranks_per_gpu))
    if args.check_timeout:
        config.limits.check_s = args.check_timeout
    if not args.json:
        where = f"{args.device}, {args.ranks_per_gpu} ranks per GPU, emulated" if emulated else args.device
        console.print(plain(f"evaluating {solution} on {problem.name} (shape {shape}, W={args.world_size}, {where})"))
    result = evaluate(problem, solution, world_size=args.world_size, device=args.device, shape=shape, config=config)
    text = result.model_dump_json(indent=2)
    if args.out:
        try:
            write_out_text(Path(args.out), text)
        except OSError as err:
            raise CliError(f"cannot write {args.out}: {err.strerror or err}") from None
    if args.json:  # every character beyond ASCII as \uXXXX: nothing a terminal obeys (C1, U+202E) comes through
        print(json.dumps(json.loads(text), indent=2, ensure_ascii=True))
    else:
        render(result, ranks_per_gpu=args.ranks_per_gpu)
    return 0 if result.correct else 1


def render(result: EvalResult, ranks_per_gpu: int = 1) -> None:
    color = "green" if result.correct else "red"
    console.print(f"verdict: [{color}]{escape(result.verdict)}[/{color}]")
    if result.failure:
        f = result.failure
        where = ", ".join(x for x in (f"rank {f.rank}" if f.rank is not None else "",
                                      f"trial {f.trial}" if f.trial is not None else "",
                                      f"phase {f.phase}" if f.phase else "") if x)
        console.print(plain(f"{f.message}" + (f"  ({where})" if where else "")))
        if f.evidence:
            console.print(plain(f.evidence), highlight=False)
    if result.flags:
        console.print(plain(f"flags: {', '.join(result.flags)}"))
    emulated = layout.is_emulated(ranks_per_gpu) or is_emulated(result)
    if result.timings and emulated:
        console.print(f"[yellow]{escape(emulation.notice(ranks_per_gpu))}[/yellow]")
    if result.timings:
        table = Table(title=f"timing ({result.timings.candidate.clock}; max over ranks per iteration"
                            f"{'; emulated, not a speedup' if emulated else ''})")
        for col in ("", "median ms", "p10 ms", "p90 ms", "CV", "host median ms", "iters"):
            table.add_column(col)
        for name, t in (("reference", result.timings.reference), ("candidate", result.timings.candidate)):
            table.add_row(name + (" (cached)" if t.cached else ""), f"{t.median_ms:.4f}", f"{t.p10_ms:.4f}",
                          f"{t.p90_ms:.4f}", f"{t.cv:.1%}", f"{t.host_median_ms:.4f}", str(t.iterations))
        console.print(table)
        reference = result.integrity.get("reference_timing") or {}
        if reference and not reference.get("stable", True):
            console.print(plain(f"reference timing unsteady: CV {reference['cv']:.0%} after {reference['attempts']} "
                                f"timing(s), above {reference['cv_max']:.0%}: used here, not cached"))
        if emulated:
            console.print(f"time ratio (emulated, not a speedup): {result.speedup:.3f}x")
        else:
            note = timing_note(result.device)
            console.print(plain(f"speedup: {result.speedup:.3f}x" + (f" ({note})" if note else "")))
    console.print("stages: " + ", ".join(f"{escape(k)} {v:.2f}s" for k, v in result.stages.items()))
    console.print(plain(f"sandbox: {sandbox_line(result.integrity.get('sandbox'))}"))


def sandbox_line(record: object) -> str:
    """What the result's integrity.sandbox says the candidate ran in, in a few words."""
    if not isinstance(record, dict):
        return "not recorded (the evaluation stopped before its ranks started)"
    if record.get("backend") == "bwrap":
        return f"{record.get('version') or 'bubblewrap'} (own PID, user and network namespaces, read-only " \
            "filesystem, writable scratch only)"
    why = record.get("weaker_fallback") or "no reason recorded"
    return f"none: the ranks ran as your user ({why})"
