"""SampleContext: everything one sample's graph nodes and tool calls need that is not state (never
checkpointed): the problem, the condition, the model, the folder, the budget, where evaluations run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel

from agent.budgets import Budget
from agent.conditions import Condition
from agent.context import ContextPolicy
from agent.executors.interface import Executor
from agent.prompting import PromptChoice
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
    model_name: str  # "provider:model", the price table's key
    directory: SampleDir
    budget: Budget
    prices: PriceTable | None
    config: EvalConfig  # what the tools evaluate with; the final scoring uses scoring_seed(config.seed)
    scheduler: DeviceScheduler | None  # None only with an executor
    world_size: int
    device: str
    shape: str
    topology: dict[str, Any] | None = None
    log: Any = None  # a structlog logger bound to this sample
    model_attempts: int = 5
    answer_tokens: int = 600
    guide_in_prompt: bool = True
    # Where evaluations run when not on this node's scheduler (a Ray cluster); None: here, in leases.
    executor: Executor | None = None
    # The model's window and when to start shortening old candidates; None or window None: not managed.
    context_policy: ContextPolicy | None = None
    prompt_cache: bool = True  # Anthropic breakpoints (agent.caching); off only to measure what caching saves
    # Which prompt the sample opens with (agent.prompting: this project's or PKB's own, from a checkout).
    prompt: PromptChoice = field(default_factory=PromptChoice)
    shell_solution: str = SHELL_SOLUTION  # bash: the scratch folder's file that is checked and scored
    shell_timeout_s: float = 120.0  # bash: the time limit of one command

    @property
    def provider(self) -> str:
        return self.model_name.partition(":")[0]
