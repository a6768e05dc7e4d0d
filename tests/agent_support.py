"""Shared by the tests of the agent loop and the runner: scripted models, a small EvalConfig, a Runner on a
fresh run directory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel

from agent.budgets import (
    Budget,
)
from agent.providers import make_chat_model, parse_model_spec
from agent.rundir import RunDir
from agent.runner import RunConfig, Runner, create_run
from agent.scheduler import DeviceScheduler
from agent.scripted import ScriptedChatModel, script_from_steps
from agent.usage import PriceTable
from harness.config import EvalConfig, TimingConfig
from harness.problems.registry import get, load_suite
from tests.conftest import CANDIDATES

CORRECT = (CANDIDATES / "correct_all_gather_sum.py").read_text()


BROKEN = (CANDIDATES / "compile_error_syntax.py").read_text()  # scored without starting a rank


SCRIPTED = "scripted:test"


def scripted(steps: list[Any]) -> ScriptedChatModel:
    return ScriptedChatModel(script=script_from_steps(steps), script_name="test")


def fenced(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code}```\n"


def eval_config() -> EvalConfig:
    return EvalConfig(trials=2, timing=TimingConfig(warmup=1, iters=3, host_iters=1))


def run_samples(tmp_path: Path, models: Sequence[BaseChatModel] | Callable[[], BaseChatModel], *,
                conditions: list[str], problems: tuple[str, ...] = ("all_reduce",), samples: int = 1,
                budget: Budget | None = None, prices: PriceTable | None = None, concurrency: int = 1,
                run_id: str = "run", model: str = SCRIPTED, **config: Any) -> tuple[Runner, Any]:
    """A Runner on a fresh run directory; `models` are handed out one per sample, in plan order."""
    suite = load_suite()
    chosen = [get(suite, name) for name in problems]
    run_config = RunConfig(model=model, conditions=conditions, samples=samples, problems=list(problems),
                           budgets=(budget or Budget()).as_dict(), trials=2, model_attempts=1, **config)
    run_dir = RunDir(tmp_path / run_id)
    if not run_dir.run_json.exists():
        create_run(run_dir, run_config, prices)
    factory = models if callable(models) else iter(models).__next__
    runner = Runner(run_dir, run_config, chosen, concurrency=concurrency, prices=prices, model_factory=factory,
                    eval_config=eval_config(), scheduler=DeviceScheduler("cpu", 2, cpu_slots=1))
    return runner, runner.run()


def chat_model_for(text: str, **options: Any) -> BaseChatModel:
    """make_chat_model for a "provider:name" text, parsed as `pkb run` parses --model."""
    return make_chat_model(parse_model_spec(text), **options)
