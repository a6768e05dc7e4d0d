"""`pkb run`'s checks that need the suite, the devices and the model, read from the run's request
(agent.cli.run_config.RunRequest): the problems it runs, this node's scheduler, the price table and a client
built once to show that the model's settings hold. Each is one line and exit code 2 when it fails."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from agent.cli import emulation
from agent.cli.common import CliError
from agent.cli.run_config import RunRequest
from agent.cli.source import check_shape, resolve_source, select_in
from agent.model_spec import ModelSpec, parse_model_spec
from agent.model_table import ModelTableError
from agent.providers import ProviderError, make_chat_model
from agent.replay import ReplayError, ReplaySet, load_replay
from agent.runner import RunConfig
from agent.scheduler import DeviceScheduler, SchedulerError
from agent.usage import PriceTable, PriceTableError, load_price_table
from harness.emulation import layout
from harness.problems.problem import Problem


@dataclass(frozen=True)
class Checked:
    """What the checks found: the run's config with its problems named, and what runs it."""

    config: RunConfig
    problems: list[Problem]
    skipped: list[str]  # selected problems without the run's world size
    replay: ReplaySet | None
    scheduler: DeviceScheduler | None
    prices: PriceTable


def check(request: RunRequest) -> Checked:
    """Every check of the run `request` describes, in the order the user meets them."""
    problems, skipped, replay = _select_problems(request.config, request.selection, request.replay_dir)
    config = request.config.model_copy(update={"problems": [p.name for p in problems]})
    scheduler = check_device(config, request.executor, request.evaluations_per_gpu)
    prices = check_model(config, request.spec)
    return Checked(config, problems, skipped, replay, scheduler, prices)


def _select_problems(config: RunConfig, selection: Sequence[str] | None, replay_dir: Path | None,
                     ) -> tuple[list[Problem], list[str], ReplaySet | None]:
    """The problems to run, the names of selected ones left out (no such world size), and the replay set."""
    source = resolve_source(config.source, config.precision)
    replay = None
    if replay_dir is not None:
        try:
            replay = load_replay(replay_dir, source)
        except ReplayError as err:
            raise CliError(str(err)) from None
    if config.problems:  # a resumed run: exactly the problems it started with
        chosen = select_in(source, config.problems)
    elif selection:
        chosen = select_in(source, selection)
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


def check_device(config: RunConfig, executor: str = "local", evaluations_per_gpu: int = 1) -> DeviceScheduler | None:
    """This node's scheduler; None for a Ray run, whose driver needs no devices (the cluster is checked when the
    executor is built). `evaluations_per_gpu` > 1: untimed evaluations may share the GPUs (the stored run's
    --no-timing decides, so a resumed run is checked as well)."""
    if config.world_size < 1:
        raise CliError(f"--world-size must be at least 1, got {config.world_size}")
    emulation.check(config.device, config.world_size, config.ranks_per_gpu)
    if evaluations_per_gpu > 1:
        if not config.skip_timing:
            raise CliError("--evaluations-per-gpu needs --no-timing: a timing never shares its GPUs")
        if config.device != "cuda":
            raise CliError("--evaluations-per-gpu needs --device cuda (on CPU the rank slots are the concurrency)")
        if executor != "local":
            raise CliError("--evaluations-per-gpu shares this machine's GPUs: leave --executor at local")
    if executor != "local":
        if layout.is_emulated(config.ranks_per_gpu):
            raise CliError("--ranks-per-gpu runs on this machine's GPUs: leave --executor at local")
        return None
    if config.device == "cuda":
        if not torch.cuda.is_available():
            raise CliError("--device cuda: no CUDA device is visible on this machine")
    try:
        return DeviceScheduler(config.device, config.world_size, ranks_per_gpu=config.ranks_per_gpu,
                               shared_evaluations=evaluations_per_gpu)
    except SchedulerError as err:
        raise CliError(str(err)) from None


def check_model(config: RunConfig, spec: ModelSpec | None = None) -> PriceTable:
    """The run's price table; a chat model's client built once (`spec`: config.model, parsed)."""
    spec = spec or parse_model_spec(config.model)
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
