"""What a run asks for (run.json's "config"), read back for --resume and `pkb rescore`.

It imports no model stack (LangChain, LangGraph): `pkb rescore` reads a run's settings and scores its files
without loading the agent loop. The two defaults that live with the model stack (the context share, the prompt)
are read from it only when a config leaves them out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from agent.budgets import Budget
from agent.conditions import Condition, parse_condition
from agent.model_spec import parse_model_spec
from agent.model_table import ModelTable, load_model_table
from agent.reasoning import ReasoningConfig
from agent.rundir import RUN_SCHEMA, RunLayout, read_json
from harness.config import EvalConfig, TimingConfig
from harness.emulation import layout

if TYPE_CHECKING:
    from agent.context import ContextPolicy
    from agent.prompting import PromptChoice

# 30 s, 2 min, 5 min: a pool that did not start or a reference that overran often clears in minutes, not seconds
# (agent.scoring's own retries come back to back, about 12 s in all).
DEFAULT_INFRA_WAITS_S = (30.0, 120.0, 300.0)


class RunError(ValueError):
    """A run that cannot start or go on as asked (exists, missing, different config); one line."""


class RunConfig(BaseModel):
    """What a run asks for; stored as run.json's "config" and authoritative on --resume."""

    model: str
    conditions: list[str]
    samples: int | None = Field(1, description="per problem and condition; replay: at most this many files")
    problems: list[str]
    source: str | None = None  # None: this suite; "pkb:PATH": a PKB checkout
    device: str = "cpu"
    world_size: int = 2
    ranks_per_gpu: int = 1  # > 1: ranks share GPUs, symmetric memory emulated; timings are not speedups
    shape: str = "small"
    budgets: dict[str, Any] = Field(default_factory=lambda: Budget().as_dict())
    seed: int = 0
    trials: int = 5
    skip_timing: bool = False
    base_url: str | None = None
    api_key_env: str | None = None
    prices: str | None = None  # the --prices file; None: the packaged agent/prices.json
    model_attempts: int = 5
    temperature: float | None = None  # sent only when set: some models reject sampling parameters
    max_reply_tokens: int | None = None  # the provider's per-reply output limit, when set
    answer_tokens: int = 600
    guide_in_prompt: bool = True
    reasoning_effort: str | None = None  # agent.reasoning: mapped per provider
    thinking_budget: int | None = None
    models: str | None = None  # the --models file; None: the packaged agent/models.json
    context_window: int | None = None  # overrides the model table's window
    # shorten old candidates past this share of the window (default: agent.context.DEFAULT_SHARE)
    context_share: float = Field(default_factory=lambda: _default_context_share())
    prompt_cache: bool = True
    # agent.prompting: "pkb-agent" (its OURS, the default), or "pkb:CHECKOUT" (PKB's own, from a checkout)
    prompt: str = Field(default_factory=lambda: _default_prompt())
    pkb_hardware: str | None = None  # --prompt pkb: PKB's hardware profile (None: h100_8, "none": none)
    shell_timeout_s: float = 120.0  # bash: the time limit of one shell command (PKB's agent: 900 s)
    # PKB's precision (harness.problems.parallelkernelbench.checkout.PRECISIONS): a checkout's inputs, tolerances and
    # PKB's prompt. None: this suite without PKB's prompt, or a run made before the option (bf16 inputs, the
    # checkout's default precision in PKB's prompt).
    precision: str | None = None
    # Seconds between judgements of a sample that ended in infra_error (the harness's failure): it is judged again
    # after each, up to len(infra_waits_s) more times in one pass; `--resume` and `--retry-infra` judge it again.
    infra_waits_s: list[float] = Field(default_factory=lambda: list(DEFAULT_INFRA_WAITS_S))

    @property
    def prompt_choice(self) -> PromptChoice:
        from agent import prompting  # the model stack (LangChain's messages): not for the run's scoring

        return prompting.parse_prompt(self.prompt, self.source, self.pkb_hardware, self.precision)

    @property
    def budget(self) -> Budget:
        return Budget.from_dict(self.budgets)

    @property
    def parsed_conditions(self) -> list[Condition]:
        return [parse_condition(c) for c in self.conditions]

    @property
    def reasoning(self) -> ReasoningConfig:
        return ReasoningConfig(effort=self.reasoning_effort, thinking_budget=self.thinking_budget)

    def model_table(self) -> ModelTable:
        return load_model_table(self.models)

    def model_context(self) -> tuple[ModelTable | None, ContextPolicy]:
        """A chat model's table and the run's context policy, its window from --context-window, else the table's
        (not managed where neither knows it); a replay has no table and an unmanaged policy."""
        from agent.context import ContextPolicy  # the model stack (LangChain's messages): not for the run's scoring

        spec = parse_model_spec(self.model)
        if not spec.is_chat_model:
            return None, ContextPolicy(None)
        table = load_model_table(self.models)
        info = table.info(spec.text)
        window = self.context_window if self.context_window is not None else (info.context_window if info else None)
        return table, ContextPolicy(window=window, share=self.context_share)

    def eval_config(self) -> EvalConfig:
        return EvalConfig(trials=self.trials, seed=self.seed, skip_timing=self.skip_timing,
                          timing=TimingConfig.for_device(self.device), **layout.eval_config_fields(self.ranks_per_gpu))


def load_run_config(run_dir: RunLayout) -> RunConfig:
    """The config of an existing run, for --resume."""
    header = read_json(run_dir.run_json)
    if header is None:
        raise RunError(f"no run to resume at {run_dir.path} (run.json is missing)")
    if not isinstance(header, dict) or header.get("schema") != RUN_SCHEMA or not isinstance(header.get("config"), dict):
        raise RunError(f"{run_dir.run_json} is not a {RUN_SCHEMA} run header")
    try:
        return RunConfig.model_validate(header["config"])
    except ValueError as err:
        raise RunError(f"{run_dir.run_json}: its config cannot be read ({str(err).splitlines()[0]})") from None


def _default_context_share() -> float:
    from agent.context import DEFAULT_SHARE  # the model stack: only for a config that leaves the share out

    return DEFAULT_SHARE


def _default_prompt() -> str:
    from agent.prompting import OURS  # the model stack: only for a config that leaves the prompt out

    return OURS
