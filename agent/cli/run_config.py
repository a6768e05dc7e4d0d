"""`pkb run`'s options read once into the run's settings: a RunRequest holds the RunConfig (built from the options,
or the stored run's, which options given with --resume must agree with), where the run lives, and how this pass
runs (what run.json does not store). Everything after reads the request, never the options again."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from agent.budgets import Budget
from agent.cli.common import CliError
from agent.cli.source import PKB_PREFIX
from agent.conditions import REPLAY, Condition, ConditionError, parse_conditions
from agent.context import DEFAULT_SHARE
from agent.model_spec import ModelSpec, ProviderError, parse_model_spec
from agent.prompting import OURS, PKB, PromptChoiceError, check_conditions, parse_prompt
from agent.rundir import RunDir
from agent.runner import RunConfig, RunError, load_run_config
from harness.problems.parallelkernelbench import checkout
from harness.problems.parallelkernelbench.solutions import solution_set_info

# An option given with --resume that disagrees with the stored run's field `key`, in one line.
RESUME_MISMATCH = ("--resume: run {run} was started with {key} {stored!r}, not {value!r}; leave {option} out to "
                   "continue it, or start a new run")
# (option, RunConfig field): options that, given with --resume, must agree with the stored run (--problems too,
# once the suite is read: agent.cli.run_checks).
RESUME_CHECKED = (("--model", "model"), ("--condition", "conditions"), ("--samples", "samples"),
                  ("--source", "source"), ("--device", "device"),
                  ("--world-size", "world_size"), ("--ranks-per-gpu", "ranks_per_gpu"), ("--shape", "shape"),
                  ("--seed", "seed"), ("--trials", "trials"),
                  ("--base-url", "base_url"), ("--prices", "prices"), ("budgets", "budgets"),
                  ("--temperature", "temperature"), ("--max-reply-tokens", "max_reply_tokens"),
                  ("--no-timing", "skip_timing"), ("--no-guide", "guide_in_prompt"), ("--api-key-env", "api_key_env"),
                  ("--reasoning-effort", "reasoning_effort"), ("--thinking-budget", "thinking_budget"),
                  ("--models", "models"), ("--context-window", "context_window"), ("--context-share", "context_share"),
                  ("--no-prompt-cache", "prompt_cache"), ("--prompt", "prompt"), ("--pkb-hardware", "pkb_hardware"),
                  ("--shell-timeout", "shell_timeout_s"), ("--precision", "precision"))


def _model(text: str) -> ModelSpec:
    """The model as the run stores it: replay and script paths made absolute, so a resume works from anywhere."""
    try:
        spec = parse_model_spec(text)
    except ProviderError as err:
        raise CliError(str(err)) from None
    if spec.provider == "replay" or (spec.provider == "scripted" and spec.name.endswith(".json")):
        return ModelSpec(spec.provider, str(Path(spec.name).expanduser().resolve()))
    return spec


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


@dataclass(frozen=True)
class RunRequest:
    """`pkb run`'s options, read once: the run's config and model, its folder, and how this pass runs."""

    config: RunConfig  # built from the options, or the stored run's (--resume, --retry-infra)
    spec: ModelSpec  # config.model, parsed
    run_dir: RunDir
    resuming: bool  # --resume or --retry-infra: the run exists, its stored config is what runs
    retry_infra: bool  # judge again only the samples in infra_error
    selection: Sequence[str] | None  # --problems as given (a resumed run keeps config.problems)
    concurrency: int
    evaluations_per_gpu: int
    executor: str  # "local" or "ray" (agent.cli.options builds it; not part of the run)

    @property
    def replay_dir(self) -> Path | None:
        return Path(self.spec.name) if self.spec.provider == "replay" else None


def request_from_args(args: argparse.Namespace) -> RunRequest:
    """The run the options describe: a new one (its folder must not exist), or the stored one they resume, with
    the options given again checked against it."""
    resuming = bool(args.resume or args.retry_infra)
    if not resuming:
        config, spec = _fresh(args)
        run_dir = RunDir(Path(args.runs_dir) / (args.run_id or _run_id(spec)))
        if run_dir.run_json.exists():
            raise CliError(f"run {run_dir.path} already exists; add --resume to continue it, or pick another --run-id")
    else:
        run_dir = RunDir(Path(args.runs_dir) / args.run_id)
        try:
            config = load_run_config(run_dir)
        except RunError as err:
            raise CliError(str(err)) from None
        spec = check_resume_args(args, config, run_dir)
    return RunRequest(config=config, spec=spec, run_dir=run_dir, resuming=resuming, retry_infra=args.retry_infra,
                      selection=args.problems, concurrency=args.concurrency,
                      evaluations_per_gpu=args.evaluations_per_gpu, executor=args.executor)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """A new run's config from its options (`pkb sweep` builds each cell's so)."""
    return _fresh(args)[0]


def _fresh(args: argparse.Namespace) -> tuple[RunConfig, ModelSpec]:
    if not args.model:
        raise CliError("--model is required (openai:MODEL, anthropic:MODEL, replay:DIR or scripted:FILE.json)")
    spec = _model(args.model)
    model = spec.text
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
    precision = _precision(args, spec, pkb_prompt=(args.prompt or OURS).strip() != OURS)
    prompt, hardware = _prompt(args, conditions, precision)
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
        prompt=prompt,
        pkb_hardware=hardware,
        shell_timeout_s=_positive(args.shell_timeout, "--shell-timeout") if args.shell_timeout is not None else 120.0,
        precision=precision,
    ), spec


def _positive(value: float, option: str) -> float:
    if value <= 0:
        raise CliError(f"{option} must be positive, got {value:g}")
    return value


def _precision(args: argparse.Namespace, spec: ModelSpec, *, pkb_prompt: bool) -> str | None:
    """--precision as the run stores it: for a checkout's problems or PKB's prompt, the option, else the replayed
    set's precision where its folder name says it (solutions_<backend>_<precision>_...), else PKB's default (bf16);
    None for this suite's problems without PKB's prompt (they keep their own dtypes)."""
    pkb = (args.source or "").startswith(PKB_PREFIX) or pkb_prompt
    if args.precision is not None and not pkb:
        raise CliError("--precision applies to a ParallelKernelBench checkout's problems (--source pkb:PATH) or "
                       "--prompt pkb")
    if not pkb:
        return None
    if args.precision is not None:
        if args.precision not in checkout.PRECISIONS:
            raise CliError(f"--precision {args.precision!r}: use {', '.join(checkout.PRECISIONS)}")
        return str(args.precision)
    info = solution_set_info(spec.name) if spec.provider == "replay" else None
    if info is None:
        return checkout.DEFAULT_PRECISION
    if info["precision"] not in checkout.PRECISIONS:
        raise CliError(f"the solution set {Path(spec.name).name} says precision {info['precision']!r}, which pkb "
                       f"does not score; pass --precision ({', '.join(checkout.PRECISIONS)})")
    return info["precision"]


def _prompt(args: argparse.Namespace, conditions: list[Condition], precision: str | None = None,
            ) -> tuple[str, str | None]:
    """--prompt as the run stores it ("pkb-agent", or "pkb:/abs/checkout") and --pkb-hardware, checked (with the
    precision PKB's prompt will name, when given)."""
    try:
        choice = parse_prompt(args.prompt, args.source, args.pkb_hardware, precision)
        check_conditions(choice, conditions)
    except PromptChoiceError as err:
        raise CliError(str(err)) from None
    if choice.name != PKB:
        return choice.name, None
    return f"{PKB}:{choice.checkout}", args.pkb_hardware


def check_resume_args(args: argparse.Namespace, stored: RunConfig, run_dir: RunDir) -> ModelSpec:
    """Options given with --resume must agree with the stored run (the stored config is what runs); returns the
    stored run's model. --problems is checked where the suite is read (agent.cli.run_checks)."""
    spec = _model(args.model or stored.model)  # a --model given must name the stored one, checked below
    given: dict[str, Any] = {
        "model": spec.text if args.model else None,
        "conditions": [c.name for c in _conditions(args, spec)] if (args.condition or args.tools) else None,
        "samples": args.samples, "source": args.source, "device": args.device, "world_size": args.world_size,
        "ranks_per_gpu": args.ranks_per_gpu,
        "shape": args.shape, "seed": args.seed, "trials": args.trials, "base_url": args.base_url,
        "prices": str(Path(args.prices).resolve()) if args.prices else None, "budgets": _budget(args),
        "temperature": args.temperature, "max_reply_tokens": args.max_reply_tokens,
        "skip_timing": True if args.no_timing else None, "guide_in_prompt": False if args.no_guide else None,
        "api_key_env": args.api_key_env, "reasoning_effort": args.reasoning_effort,
        "thinking_budget": args.thinking_budget, "models": str(Path(args.models).resolve()) if args.models else None,
        "context_window": args.context_window, "context_share": args.context_share,
        "prompt_cache": False if args.no_prompt_cache else None,
        "prompt": (_prompt(args, stored.parsed_conditions)[0] if args.prompt else None),
        "pkb_hardware": args.pkb_hardware,
        "shell_timeout_s": args.shell_timeout,
        "precision": args.precision,
    }
    for option, key in RESUME_CHECKED:
        value = given[key]
        if value is not None and value != getattr(stored, key):
            raise CliError(RESUME_MISMATCH.format(run=run_dir.path.name, key=key, stored=getattr(stored, key),
                                                  value=value, option="--budget-*" if key == "budgets" else option))
    return spec


def default_run_id(model: str) -> str:
    return _run_id(parse_model_spec(model))


def _run_id(spec: ModelSpec) -> str:
    """The time and the model, as a folder name."""
    name = Path(spec.name).name if spec.provider in ("replay", "scripted") else spec.name
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{spec.provider}-{name}").strip("-")[:60]
    return f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{slug}"
