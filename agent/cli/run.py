"""`pkb run`: run a model (or replay solution files) on problems under one or more conditions, k samples each.

    pkb run --model openai:gpt-5.4 --condition zero-shot,agent --problems collective --samples 3
    pkb run --model openai:my-model --base-url http://localhost:8000/v1 --condition agent:check+compile ...
    pkb run --model replay:solutions/ --problems all_reduce            # scores files, no API key
    pkb run --run-id ID --resume                                       # continues a killed run
    pkb run ... --executor ray --ray-address HEAD:6379                 # evaluations on a Ray cluster (docs/ray.md)
    pkb run --model openai:gpt-5.5 --reasoning-effort high ...         # reasoning settings (docs/models.md)
    pkb run --model anthropic:claude-haiku-4-5 --thinking-budget 16000 ...

Everything lands in runs/<id>/ (docs/run-layout.md). With --resume the run's stored config is used; an
option given again must agree with it; the executor is not part of the run, so a run started on one resumes
on the other. Bad input is one line and exit code 2; a run that ends with
unfinished samples (provider outages, internal errors) exits 1 and says how to continue it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent import cli_emulation, cli_source
from agent.budgets import Budget
from agent.cli_common import CliError, check_shape, console, err_console
from agent.conditions import REPLAY, Condition, ConditionError, parse_conditions
from agent.context import DEFAULT_SHARE
from agent.executors import RayExecutor, add_executor_arguments, executor_from_args
from agent.model_table import ModelTableError
from agent.providers import ModelSpec, ProviderError, make_chat_model, parse_model_spec
from agent.replay import ReplayError, ReplaySet, load_replay
from agent.rundir import RunDir, write_json_atomic
from agent.runner import RunConfig, RunError, Runner, RunSummary, create_run, load_run_config
from agent.scheduler import DeviceScheduler, SchedulerError
from agent.usage import PriceTable, PriceTableError, load_price_table
from harness import metrics
from harness.emulation import layout
from harness.flags import is_emulated
from harness.problem import Problem

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# (option, RunConfig field): options that, given with --resume, must agree with the stored run.
RESUME_CHECKED = (("--model", "model"), ("--condition", "conditions"), ("--samples", "samples"),
                  ("--problems", "problems"), ("--source", "source"), ("--device", "device"),
                  ("--world-size", "world_size"), ("--ranks-per-gpu", "ranks_per_gpu"), ("--shape", "shape"),
                  ("--seed", "seed"), ("--trials", "trials"),
                  ("--base-url", "base_url"), ("--prices", "prices"), ("budgets", "budgets"),
                  ("--temperature", "temperature"), ("--max-reply-tokens", "max_reply_tokens"),
                  ("--no-timing", "skip_timing"), ("--no-guide", "guide_in_prompt"), ("--api-key-env", "api_key_env"),
                  ("--reasoning-effort", "reasoning_effort"), ("--thinking-budget", "thinking_budget"),
                  ("--models", "models"), ("--context-window", "context_window"), ("--context-share", "context_share"),
                  ("--no-prompt-cache", "prompt_cache"))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a model on problems under conditions (or replay solution files)",
                       description="Run samples of a model on problems; everything goes to runs/<id>/.")
    add_arguments(p)
    p.set_defaults(handler=cmd_run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="openai:MODEL, anthropic:MODEL, replay:DIR or scripted:FILE.json")
    p.add_argument("--condition", action="append", default=None,
                   help="zero-shot, agent, agent:<tool>+<tool> (comma-separated or repeated; default zero-shot)")
    p.add_argument("--tools", default=None, help="tools of a plain `agent` condition, comma-separated")
    p.add_argument("--problems", nargs="+", default=None,
                   help="names, globs, categories (default: all; replay: the problems the directory solves)")
    p.add_argument("--source", default=None, help="pkb:PATH to run a ParallelKernelBench checkout's problems")
    p.add_argument("--samples", type=int, default=None,
                   help="samples per problem and condition (default 1; replay: every file, at most this many)")
    p.add_argument("--run-id", default=None, help="the run's folder name under --runs-dir (default: time + model)")
    p.add_argument("--resume", action="store_true", help="continue the run --run-id: finished samples are kept")
    p.add_argument("--concurrency", type=int, default=1, help="samples run at once (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default cpu")
    p.add_argument("--world-size", type=int, default=None, help="ranks (default 2)")
    cli_emulation.add_argument(p, default=None)
    p.add_argument("--shape", default=None, help="shape name (default: 'small' on cpu, 'default' on cuda)")
    p.add_argument("--base-url", default=None, help="an OpenAI-compatible server (vLLM, SGLang, Together, ...)")
    p.add_argument("--api-key-env", default=None, help="the environment variable holding the API key")
    p.add_argument("--budget-turns", type=int, default=None, help=f"model calls per sample (default "
                   f"{Budget().max_turns}; 0: no limit)")
    p.add_argument("--budget-tokens", type=int, default=None, help="input and output tokens per sample, each")
    p.add_argument("--budget-input-tokens", type=int, default=None)
    p.add_argument("--budget-output-tokens", type=int, default=None)
    p.add_argument("--budget-cost", type=float, default=None, help="dollars per sample (needs the model's price)")
    p.add_argument("--budget-wall", type=float, default=None, help=f"seconds per sample (default "
                   f"{Budget().max_wall_s:g}; 0: no limit)")
    p.add_argument("--budget-gpu", type=float, default=None, help="GPU seconds per sample")
    p.add_argument("--prices", default=None, help="price table JSON (default: the packaged agent/prices.json)")
    p.add_argument("--trials", type=int, default=None, help="correctness trials of each evaluation (default 5)")
    p.add_argument("--seed", type=int, default=None, help="the tools' seed; the final scoring uses a fresh one")
    p.add_argument("--no-timing", action="store_true", help="check correctness only (no speedups)")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the model's)")
    p.add_argument("--max-reply-tokens", type=int, default=None, help="output-token limit of one model reply")
    p.add_argument("--reasoning-effort", default=None,
                   help="reasoning effort (OpenAI reasoning_effort; Anthropic adaptive thinking's effort, or a "
                        "thinking budget from the model table for budget models): e.g. low, medium, high")
    p.add_argument("--thinking-budget", type=int, default=None,
                   help="Anthropic extended thinking's budget_tokens (models that take a budget; at least 1024)")
    p.add_argument("--models", default=None, help="model table JSON (default: the packaged agent/models.json)")
    p.add_argument("--context-window", type=int, default=None,
                   help="the model's context window in tokens (default: the model table's; unknown: not managed)")
    p.add_argument("--context-share", type=float, default=None,
                   help="shorten old candidates once a request passes this share of the window (default 0.5)")
    p.add_argument("--no-prompt-cache", action="store_true",
                   help="send no Anthropic cache breakpoints (to measure what caching saves)")
    p.add_argument("--no-guide", action="store_true",
                   help="leave the programming guide out of the prompt (a condition with the guide tool has it)")
    p.add_argument("--model-retries", type=int, default=5, help="attempts per model call on 429/5xx (default 5)")
    p.add_argument("--runs-dir", default="runs", help="where runs go (default ./runs)")
    add_executor_arguments(p)


# -- config -----------------------------------------------------------------------------------------
def _model_text(text: str) -> str:
    """The canonical model string: replay and script paths made absolute, so a resume works from anywhere."""
    try:
        spec = parse_model_spec(text)
    except ProviderError as err:
        raise CliError(str(err)) from None
    if spec.provider == "replay" or (spec.provider == "scripted" and spec.name.endswith(".json")):
        return f"{spec.provider}:{Path(spec.name).expanduser().resolve()}"
    return spec.text


def _budget(args: argparse.Namespace) -> dict[str, Any] | None:
    """The budget the options ask for, None when no budget option was given."""
    given = {"max_turns": args.budget_turns, "max_input_tokens": args.budget_input_tokens,
             "max_output_tokens": args.budget_output_tokens, "max_cost_usd": args.budget_cost,
             "max_wall_s": args.budget_wall, "max_gpu_s": args.budget_gpu}
    if args.budget_tokens is not None:
        for key in ("max_input_tokens", "max_output_tokens"):
            given[key] = given[key] if given[key] is not None else args.budget_tokens
    if all(v is None for v in given.values()):
        return None
    for key, value in given.items():
        if value is not None and value < 0:
            raise CliError(f"budget {key} must be positive (0: no limit), got {value}")
    budget = Budget().as_dict()
    budget.update({k: (None if v == 0 else v) for k, v in given.items() if v is not None})
    return Budget.from_dict(budget).as_dict()


def _conditions(args: argparse.Namespace, spec: ModelSpec) -> list[Condition]:
    if spec.provider == "replay":
        if args.tools or any(c.strip() not in ("", REPLAY) for item in args.condition or [] for c in item.split(",")):
            raise CliError("replay:DIR scores existing files: --condition and --tools do not apply")
        return [Condition(REPLAY)]
    try:
        conditions = parse_conditions(args.condition or ["zero-shot"], args.tools)
    except ConditionError as err:
        raise CliError(str(err)) from None
    if any(c.kind == REPLAY for c in conditions):
        raise CliError("the replay condition needs --model replay:DIR")
    return conditions


def _problems(source: str | None, selection: Sequence[str] | None) -> list[Problem]:
    return cli_source.select_in(cli_source.resolve_source(source), selection)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    if not args.model:
        raise CliError("--model is required (openai:MODEL, anthropic:MODEL, replay:DIR or scripted:FILE.json)")
    model = _model_text(args.model)
    spec = parse_model_spec(model)
    conditions = _conditions(args, spec)
    device = args.device or "cpu"
    if args.samples is not None and args.samples < 1:
        raise CliError(f"--samples must be at least 1, got {args.samples}")
    trials = args.trials if args.trials is not None else 5
    if args.context_window is not None and args.context_window < 1:
        raise CliError(f"--context-window must be positive, got {args.context_window}")
    if args.context_share is not None and not 0 < args.context_share <= 1:
        raise CliError(f"--context-share must be in (0, 1], got {args.context_share}")
    if trials < 2:
        raise CliError("--trials must be at least 2 (a stale answer only shows on the second call)")
    return RunConfig(
        model=model,
        conditions=[c.name for c in conditions],
        samples=args.samples if (args.samples is not None or spec.provider == "replay") else 1,
        problems=[],  # filled once the source is read
        source=args.source,
        device=device,
        world_size=args.world_size if args.world_size is not None else 2,
        ranks_per_gpu=args.ranks_per_gpu if args.ranks_per_gpu is not None else 1,
        shape=args.shape or ("default" if device == "cuda" else "small"),
        budgets=_budget(args) or Budget().as_dict(),
        seed=args.seed if args.seed is not None else 0,
        trials=trials,
        skip_timing=args.no_timing,
        base_url=args.base_url,
        api_key_env=args.api_key_env,
        prices=str(Path(args.prices).resolve()) if args.prices else None,
        model_attempts=args.model_retries,
        guide_in_prompt=not args.no_guide,
        temperature=args.temperature,
        max_reply_tokens=args.max_reply_tokens,
        reasoning_effort=args.reasoning_effort,
        thinking_budget=args.thinking_budget,
        models=str(Path(args.models).resolve()) if args.models else None,
        context_window=args.context_window,
        context_share=args.context_share if args.context_share is not None else DEFAULT_SHARE,
        prompt_cache=not args.no_prompt_cache,
    )


def check_resume_args(args: argparse.Namespace, stored: RunConfig, run_dir: RunDir) -> None:
    """Options given with --resume must agree with the stored run (the stored config is what runs)."""
    given: dict[str, Any] = {
        "model": _model_text(args.model) if args.model else None,
        "conditions": ([c.name for c in _conditions(args, parse_model_spec(_model_text(args.model or stored.model)))]
                       if (args.condition or args.tools) else None),
        "samples": args.samples, "source": args.source, "device": args.device, "world_size": args.world_size,
        "ranks_per_gpu": args.ranks_per_gpu,
        "shape": args.shape, "seed": args.seed, "trials": args.trials, "base_url": args.base_url,
        "prices": str(Path(args.prices).resolve()) if args.prices else None, "budgets": _budget(args),
        "problems": ([p.name for p in _problems(stored.source, args.problems)] if args.problems else None),
        "temperature": args.temperature, "max_reply_tokens": args.max_reply_tokens,
        "skip_timing": True if args.no_timing else None, "guide_in_prompt": False if args.no_guide else None,
        "api_key_env": args.api_key_env, "reasoning_effort": args.reasoning_effort,
        "thinking_budget": args.thinking_budget, "models": str(Path(args.models).resolve()) if args.models else None,
        "context_window": args.context_window, "context_share": args.context_share,
        "prompt_cache": False if args.no_prompt_cache else None,
    }
    for option, key in RESUME_CHECKED:
        value = given[key]
        if value is not None and value != getattr(stored, key):
            option = "--budget-*" if key == "budgets" else option
            raise CliError(f"--resume: run {run_dir.path.name} was started with {key} {getattr(stored, key)!r}, "
                           f"not {value!r}; leave {option} out to continue it, or start a new run")


def default_run_id(model: str) -> str:
    spec = parse_model_spec(model)
    name = Path(spec.name).name if spec.provider in ("replay", "scripted") else spec.name
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{spec.provider}-{name}").strip("-")[:60]
    return f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{slug}"


# -- checks before anything is written --------------------------------------------------------------
def _select_problems(config: RunConfig, selection: Sequence[str] | None, replay_dir: Path | None,
                     ) -> tuple[list[Problem], list[str], ReplaySet | None]:
    """The problems to run, the names of selected ones left out (no such world size), and the replay set."""
    source = cli_source.resolve_source(config.source)
    replay = None
    if replay_dir is not None:
        try:
            replay = load_replay(replay_dir, source)
        except ReplayError as err:
            raise CliError(str(err)) from None
    if config.problems:  # a resumed run: exactly the problems it started with
        chosen = cli_source.select_in(source, config.problems)
    elif selection:
        chosen = cli_source.select_in(source, selection)
    elif replay is not None:
        chosen = [p for p in source if p.name in set(replay.problems)]
    else:
        chosen = list(source)
    usable = [p for p in chosen if p.supports(config.world_size)]
    if not usable:
        raise CliError(f"no selected problem supports world size {config.world_size}")
    for p in usable:
        check_shape(p, config.shape)
    return usable, [p.name for p in chosen if p not in usable], replay


def _check_device(config: RunConfig, executor: str = "local") -> DeviceScheduler | None:
    """This node's scheduler; None for a Ray run, whose driver needs no devices (the cluster is checked when the
    executor is built)."""
    if config.world_size < 1:
        raise CliError(f"--world-size must be at least 1, got {config.world_size}")
    cli_emulation.check(config.device, config.world_size, config.ranks_per_gpu)
    if executor != "local":
        if layout.is_emulated(config.ranks_per_gpu):
            raise CliError("--ranks-per-gpu runs on this machine's GPUs: leave --executor at local")
        return None
    if config.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise CliError("--device cuda: no CUDA device is visible on this machine")
    try:
        return DeviceScheduler(config.device, config.world_size, ranks_per_gpu=config.ranks_per_gpu)
    except SchedulerError as err:
        raise CliError(str(err)) from None


def _check_model(config: RunConfig) -> PriceTable:
    spec = parse_model_spec(config.model)
    try:
        prices = load_price_table(config.prices)
    except PriceTableError as err:
        raise CliError(str(err)) from None
    if spec.is_chat_model:
        try:  # builds the client: an unknown provider, a bad URL, a missing key or reasoning settings the model
            # refuses stop here, before any work
            models = config.model_table()
            make_chat_model(spec, base_url=config.base_url, api_key_env=config.api_key_env,
                            temperature=config.temperature, max_output_tokens=config.max_reply_tokens,
                            reasoning=config.reasoning, models=models)
        except (ProviderError, ModelTableError) as err:
            raise CliError(str(err)) from None
    if config.budget.max_cost_usd is not None and prices.price(spec.text) is None:
        raise CliError(f"--budget-cost: the price table {prices.source} has no price for {spec.text}; "
                       "pass --prices FILE with one")
    return prices


# -- the command ------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    if args.concurrency < 1:
        raise CliError(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.model_retries < 1:
        raise CliError(f"--model-retries must be at least 1, got {args.model_retries}")
    if args.resume and not args.run_id:
        raise CliError("--resume needs --run-id (the folder name under --runs-dir)")
    if args.run_id and not RUN_ID.match(args.run_id):
        raise CliError(f"--run-id {args.run_id!r}: use letters, digits, '.', '_' and '-' (no '/')")
    if args.resume:
        run_dir = RunDir(Path(args.runs_dir) / args.run_id)
        try:
            config = load_run_config(run_dir)
        except RunError as err:
            raise CliError(str(err)) from None
        check_resume_args(args, config, run_dir)
    else:
        config = config_from_args(args)
        run_dir = RunDir(Path(args.runs_dir) / (args.run_id or default_run_id(config.model)))
        if run_dir.run_json.exists():
            raise CliError(f"run {run_dir.path} already exists; add --resume to continue it, or pick another --run-id")
    spec = parse_model_spec(config.model)
    replay_dir = Path(spec.name) if spec.provider == "replay" else None
    problems, skipped, replay = _select_problems(config, args.problems, replay_dir)
    config = config.model_copy(update={"problems": [p.name for p in problems]})
    scheduler = _check_device(config, args.executor)
    prices = _check_model(config)
    # Last of the checks (it may start or join a cluster); an unreachable cluster is one line, nothing written.
    executor = executor_from_args(args, device=config.device, world_size=config.world_size, scheduler=scheduler)
    try:
        if skipped:  # said once every check has passed, so that bad input stays one line
            print(f"pkb: skipping problem(s) without world size {config.world_size}: {', '.join(skipped)}",
                  file=sys.stderr)
        if not args.resume:
            try:
                create_run(run_dir, config, prices)
            except RunError as err:
                raise CliError(str(err)) from None
        if replay is not None and replay.matches:
            _account_for_replay(replay, run_dir)
        runner = Runner(run_dir, config, problems, concurrency=args.concurrency, prices=prices, replay=replay,
                        scheduler=scheduler, executor=executor)
        if isinstance(executor, RayExecutor):
            print(f"pkb: evaluations go to the Ray cluster ({len(executor.nodes)} node(s), room for "
                  f"{executor.capacity(config.world_size, config.device)} at once)", file=sys.stderr)
        summary = _run_with_progress(runner, len(runner.plan()))
    finally:
        executor.close()
    _print_summary(summary, run_dir, config.ranks_per_gpu)
    if summary.fatal:
        raise CliError(f"{summary.fatal} (run {run_dir.path.name}: {len(summary.records)} of {summary.total} "
                       "samples finished; --resume continues it)")
    return 0 if summary.complete else 1


def _account_for_replay(replay: ReplaySet, run_dir: RunDir) -> None:
    """Say which files of a PKB solution set were not paired with a problem (and which were paired by name
    although their solution() differs from the reference's), and keep the whole accounting in the run."""
    write_json_atomic(run_dir.replay_matches, replay.matches_record())
    unmatched = replay.unmatched
    odd = [m for m in replay.matches if m.matched and m.signature.startswith("differs")]
    if unmatched:
        print(f"pkb: {len(unmatched)} of {len(replay.matches)} file(s) in {replay.directory} match no problem "
              "and are not scored:", file=sys.stderr)
        for m in unmatched:
            print(f"  {m.line()}", file=sys.stderr)
    for m in odd:
        print(f"pkb: note: {m.line()}; {m.signature}", file=sys.stderr)
    print(f"pkb: how each file was matched: {run_dir.replay_matches}", file=sys.stderr)


class _Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = self.correct = self.fast = self.tokens = 0
        self.cost = 0.0
        self.cost_known = True

    def add(self, record: dict[str, Any]) -> str:
        with self.lock:
            self.done += 1
            self.correct += bool(record.get("correct"))
            self.fast += _fast(record)
            usage = record.get("usage") or {}
            self.tokens += int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
            self.cost += float(usage.get("cost_usd") or 0.0)
            self.cost_known = self.cost_known and usage.get("cost_known", True) is not False
            cost = f"${self.cost:.2f}" if self.cost_known else "$ n/a"
            return f"correct {self.correct}  fast {self.fast}  tokens {self.tokens:,}  {cost}"


def _fast(record: dict[str, Any]) -> bool:
    """Correct, faster than the reference, and allowed to count as fast (no integrity flag against it, not
    emulated): harness.metrics' rule."""
    return metrics.is_fast(record, 1.0)


def _run_with_progress(runner: Runner, total: int) -> RunSummary:
    tally = _Tally()
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[stats]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(runner.run_dir.path.name, total=total, stats="")

        def on_sample(record: dict[str, Any], skipped: bool) -> None:
            progress.update(task, advance=1, stats=tally.add(record))

        runner.on_sample = on_sample
        try:
            return runner.run()
        except KeyboardInterrupt:
            progress.stop()
            err_console.print(f"pkb: interrupted; finished samples are kept: pkb run --run-id "
                              f"{runner.run_dir.path.name} --resume --runs-dir {runner.run_dir.path.parent}")
            sys.stderr.flush()
            os._exit(130)  # sample threads may sit in a model call for minutes; everything on disk is consistent


def _cost_cell(records: list[dict[str, Any]]) -> str:
    """Dollars, or n/a when any sample's model has no price (a sum of the priced ones would mislead)."""
    if any((r.get("usage") or {}).get("cost_known") is False for r in records):
        return "n/a"
    return f"{sum(float((r.get('usage') or {}).get('cost_usd') or 0.0) for r in records):.4f}"


def _print_summary(summary: RunSummary, run_dir: RunDir, ranks_per_gpu: int = 1) -> None:
    emulated = layout.is_emulated(ranks_per_gpu)
    table = Table(title=f"run {summary.run_id}: {len(summary.records)} of {summary.total} samples finished")
    for col in ("condition", "samples", "correct", "fast (>1x)", "no code", "infra error", "tokens", "cost $"):
        table.add_column(col)
    by_condition: dict[str, list[dict[str, Any]]] = {}
    for r in summary.records:
        by_condition.setdefault(r["condition"], []).append(r)
    for condition, records in by_condition.items():
        tokens = sum(int(r["usage"]["input_tokens"]) + int(r["usage"]["output_tokens"]) for r in records)
        table.add_row(condition, str(len(records)), str(sum(r["correct"] for r in records)),
                      str(sum(_fast(r) for r in records)),
                      str(sum(r["verdict"] == "no_code" for r in records)),
                      str(sum(r["verdict"] == "infra_error" for r in records)), f"{tokens:,}",
                      _cost_cell(records))
    console.print(table)
    if emulated or any(is_emulated(r) for r in summary.records):
        console.print(f"[yellow]{cli_emulation.notice(ranks_per_gpu)}[/yellow]: no sample counts as fast")
    if summary.infra_errors:
        console.print(f"{summary.infra_errors} sample(s) ended in infra_error (the harness's failure, retried; "
                      "not counted against the model)")
    for line in summary.interrupted:
        console.print(f"[yellow]unfinished (provider error, not the model's):[/yellow] {line}")
    for line in summary.errors:
        console.print(f"[red]unfinished (internal error, see events.jsonl):[/red] {line}")
    if not summary.complete:
        console.print(f"continue with: pkb run --run-id {summary.run_id} --resume --runs-dir {run_dir.path.parent}")
    console.print(f"results: {run_dir.path}   report: pkb report {run_dir.path}")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m agent.cli_run ...` is `pkb run ...`."""
    parser = argparse.ArgumentParser(prog="pkb run", description="Run samples of a model on problems.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return cmd_run(args)
    except CliError as err:
        print(f"pkb: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
