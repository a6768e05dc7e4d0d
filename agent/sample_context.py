"""SampleContext: everything one sample's graph nodes and tool calls need that is not state (never
checkpointed): the problem, the condition, the model, the folder, where evaluations run, and the run's settings.

The run's settings are its RunConfig itself, held, not copied: the names the nodes read (the budget, the world
size, the shape, ...) are views of it, so a setting is defined once, in agent.run_config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel

from agent.budgets import Budget
from agent.conditions import Condition
from agent.context import ContextPolicy
from agent.executors.interface import Executor
from agent.model_spec import parse_model_spec
from agent.prompting import PromptChoice
from agent.run_config import RunConfig
from agent.rundir import SampleDir
from agent.scheduler import DeviceScheduler
from agent.usage import PriceTable
from harness.config import EvalConfig
from harness.problems.problem import Problem
from prompts import SHELL_SOLUTION


@dataclass
class SampleContext:
    """Everything one sample's nodes need that is not state (never checkpointed)."""

    problem: Problem
    condition: Condition
    model: BaseChatModel | None
    run: RunConfig  # the run's settings (a search episode's own): read through the views below
    directory: SampleDir
    prices: PriceTable | None
    config: EvalConfig  # what the tools evaluate with; the final scoring uses scoring_seed(config.seed)
    scheduler: DeviceScheduler | None  # None only with an executor
    topology: dict[str, Any] | None = None
    log: Any = None  # a structlog logger bound to this sample
    # Where evaluations run when not on this node's scheduler (a Ray cluster); None: here, in leases.
    executor: Executor | None = None
    # The model's window and when to start shortening old candidates; None or window None: not managed.
    context_policy: ContextPolicy | None = None
    # Which prompt the sample opens with (agent.prompting: this project's or PKB's own, from a checkout), the
    # run's `prompt` parsed once for the run.
    prompt: PromptChoice = field(default_factory=PromptChoice)
    shell_solution: str = SHELL_SOLUTION  # bash: the scratch folder's file that is checked and scored

    @property
    def model_name(self) -> str:
        """"provider:model", the price table's key."""
        return parse_model_spec(self.run.model).text

    @property
    def provider(self) -> str:
        return self.model_name.partition(":")[0]

    @property
    def budget(self) -> Budget:
        return self.run.budget

    @property
    def world_size(self) -> int:
        return self.run.world_size

    @property
    def device(self) -> str:
        return self.run.device

    @property
    def shape(self) -> str:
        return self.run.shape

    @property
    def model_attempts(self) -> int:
        return self.run.model_attempts

    @property
    def answer_tokens(self) -> int:
        return self.run.answer_tokens

    @property
    def guide_in_prompt(self) -> bool:
        return self.run.guide_in_prompt

    @property
    def prompt_cache(self) -> bool:
        """Anthropic breakpoints (agent.caching); off only to measure what caching saves."""
        return self.run.prompt_cache

    @property
    def shell_timeout_s(self) -> float:
        """bash: the time limit of one command."""
        return self.run.shell_timeout_s
