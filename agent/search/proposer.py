"""The model side of a search: the prompt for one candidate, the model call (or, with an agent proposer, an
episode of the agent loop: agent.search.episode), and the code in the reply.

A fresh draft gets the zero-shot prompt of `pkb run` (prompts/zero_shot.md and task.md). A refinement adds
prompts/search_refine.md: the parent's source, what the harness measured for it, its roofline (the bound,
the binding resource, the fraction it reaches and the gap), other kernels for inspiration, and the
problem's recent failures with their evidence, so the model does not repeat them.

Models: any `pkb run` provider (agent.providers), built once; `scripted:mutator[:RATES]` builds one
agent.search.mutator.MutatorChatModel per candidate, seeded by the run's seed and the candidate's slot.
The scripted model raises no provider errors, so the retry loop (agent.retry, which imports the provider
SDKs) is loaded only for real providers.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

import prompts
from agent.conditions import AGENT
from agent.graph import MODEL_ERROR as MODEL_ERROR_STOP
from agent.graph import FatalProviderError, TransientProviderError, is_fatal, is_transient
from agent.providers import ProviderError, make_chat_model, parse_model_spec
from agent.retry import invoke_model
from agent.search import episode
from agent.search.archive import MODEL_ERROR, NO_CODE, Candidate
from agent.search.config import SearchConfig
from agent.search.config import derived_seed as derived_seed  # re-exported: its old home
from agent.search.mutator import MutatorChatModel, is_mutator, rates_of
from agent.search.tunables import AST_LOCK
from agent.usage import PriceTable, usage_of
from harness.problems.problem import Problem

MAX_EVIDENCE_CHARS = 600  # of a failure shown to the model
MAX_NOTE_CHARS = 1000  # of the reply's prose kept in the archive


class FatalModelError(ProviderError):
    """Every call would fail the same way (bad key, unknown model): the search stops."""


class TransientModelError(ProviderError):
    """The provider is down or rate-limiting past the retries: the slot waits and tries again."""


@dataclass
class Proposal:
    source: str | None
    verdict: str | None  # None when there is code; else no_code or model_error
    note: str
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = True
    model_s: float = 0.0
    device_s: float = 0.0  # an agent proposer's tools' device seconds
    tool_calls: dict[str, int] = field(default_factory=dict)

    @property
    def sha256(self) -> str | None:
        return hashlib.sha256(self.source.encode()).hexdigest() if self.source is not None else None


def reply_text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "\n".join(b if isinstance(b, str) else str(b.get("text", "")) for b in content
                     if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text"))


def _ms(value: float | None) -> str:
    return f"{value:.4g} ms" if value is not None else "n/a"


def measurements(c: Candidate) -> str:
    flags = ", ".join(c.flags) if c.flags else "none"
    return (f"verdict {c.verdict}; speedup {c.speedup:.3g}x (candidate median {_ms(c.candidate_ms)}, reference "
            f"{_ms(c.reference_ms)}); integrity flags: {flags}" if c.speedup is not None
            else f"verdict {c.verdict}; not timed; integrity flags: {flags}")


def roofline_line(c: Candidate, bound: tuple[float | None, str | None] | None) -> str:
    if bound is None or bound[0] is None:
        return "not known for this problem on this machine."
    bound_ms, binding = bound
    line = f"lower bound {bound_ms:.4g} ms per call, bound by {binding}"
    if c.roofline_fraction is not None:
        line += (f"; this kernel reaches {c.roofline_fraction:.2%} of it (gap {1 - min(c.roofline_fraction, 1):.2%})")
    return line + "."


class Proposer:
    """Builds the prompts and calls the model for the candidates of one search."""

    def __init__(self, config: SearchConfig, problems: dict[str, Problem], *, prices: PriceTable | None,
                 topology: dict[str, Any] | None = None, model_factory: Callable[[int], BaseChatModel] | None = None,
                 log: Any = None) -> None:
        self.config = config
        self.problems = problems
        self.prices = prices
        self.topology = topology
        self.log = log
        self.spec = parse_model_spec(config.model)
        self.scripted = self.spec.provider == "scripted" and is_mutator(self.spec.name)
        self._shared: BaseChatModel | None = None
        self._factory = model_factory
        self._tasks: dict[str, str] = {}
        self._system: str | None = None
        self.condition = config.proposer_condition
        # An agent proposer's episodes: their folder (runs/<search>/episodes) and where their tools run; set by
        # the search (agent.search.loop) before the first proposal.
        self.episodes: Path | None = None
        self.where: episode.Where | None = None
        if model_factory is None and not self.scripted:  # built now: a bad key or model fails before any work
            self._shared = make_chat_model(self.spec, base_url=config.base_url, api_key_env=config.api_key_env,
                                           temperature=config.temperature, max_output_tokens=config.max_reply_tokens)

    def model_for(self, slot: int) -> BaseChatModel:
        if self._factory is not None:
            return self._factory(slot)
        if self.scripted:
            return MutatorChatModel(seed=derived_seed(self.config.seed, slot, "model"), device=self.config.device,
                                    rates=rates_of(self.spec.name))
        assert self._shared is not None
        return self._shared

    # -- the prompt ---------------------------------------------------------------------------------------
    def system(self) -> str:
        """The condition's system prompt: zero-shot's, or the agent's with its tools listed."""
        tools = list(self.condition.bound_tools)
        with AST_LOCK:
            if self._system is None:
                self._system = prompts.render_system(tools, self.config.guide_in_prompt and "guide" not in tools)
            return self._system

    def task(self, problem: str) -> str:
        with AST_LOCK:  # render_task parses the reference's source
            if problem not in self._tasks:
                self._tasks[problem] = prompts.render_task(self.problems[problem], self.config.shape,
                                                           self.config.world_size, self.topology,
                                                           include_guide=False)
            return self._tasks[problem]

    def messages(self, problem: str, parents: list[Candidate], visible: list[Candidate],
                 bound: tuple[float | None, str | None] | None) -> list[BaseMessage]:
        system = self.system()
        task = self.task(problem)
        if not parents:
            return [SystemMessage(content=system), HumanMessage(content=task)]
        parent, inspirations = parents[0], parents[1:]
        evaluated = [c for c in visible if c.done]
        trusted = [c.speedup for c in evaluated if c.trusted and c.speedup is not None]
        inspiration_text = "".join(
            f"\n## Inspiration\n\nCandidate {c.id} ({measurements(c)}):\n\n"
            f"```python\n{(c.source or '').rstrip()}\n```\n" for c in inspirations)
        failed = [c for c in evaluated if not c.correct and c.verdict not in (None, "infra_error")]
        failed = failed[-self.config.failures_in_prompt:] if self.config.failures_in_prompt else []
        failure_text = ""
        if failed:
            failure_text = "\n## Recent failures of this problem\n\n" + "".join(
                f"- candidate {c.id}: {c.verdict}: {(c.failure_message or '').strip()[:MAX_EVIDENCE_CHARS]}\n"
                for c in failed)
        refine = Template(prompts.load("search_refine.md")).substitute(
            evaluated=len(evaluated), correct=sum(c.correct for c in evaluated),
            best_speedup=f"{max(trusted):.3g}x" if trusted else "n/a", parent_id=parent.id,
            device=self.config.device, shape=self.config.shape, world_size=self.config.world_size,
            parent_measurements=measurements(parent), roofline=roofline_line(parent, bound),
            parent_source=(parent.source or "").rstrip(), inspirations=inspiration_text, failures=failure_text)
        return [SystemMessage(content=system), HumanMessage(content=task + "\n" + refine)]

    # -- the call -----------------------------------------------------------------------------------------
    def propose(self, slot: int, messages: list[BaseMessage], problem: str | None = None) -> Proposal:
        """The candidate of `slot`: one model call, or with an agent proposer one episode (on `problem`)."""
        if self.condition.kind == AGENT:
            assert problem is not None
            return self._episode(slot, messages, problem)
        model = self.model_for(slot)
        started = time.perf_counter()
        try:
            reply = self._invoke(model, messages)
        except ProviderError as err:
            self._classify(err)
            return Proposal(None, MODEL_ERROR, str(err)[:MAX_NOTE_CHARS], model_s=time.perf_counter() - started)
        seconds = time.perf_counter() - started
        usage = usage_of(reply)
        cost = self.prices.cost(self.spec.text, usage) if (self.prices is not None and usage is not None) else None
        text = reply_text(reply)
        code = prompts.extract_code(text)
        note = text.split("```", 1)[0].strip()[:MAX_NOTE_CHARS]
        return Proposal(code, None if code is not None else NO_CODE, note,
                        input_tokens=usage.input_tokens if usage else 0,
                        output_tokens=usage.output_tokens if usage else 0,
                        cost_usd=cost or 0.0, cost_known=cost is not None, model_s=seconds)

    def _episode(self, slot: int, messages: list[BaseMessage], problem: str) -> Proposal:
        if self.episodes is None or self.where is None:
            raise RuntimeError("an agent proposer needs the search's episode folder and devices (Search sets them)")
        started = time.perf_counter()
        tools_seed = derived_seed(self.config.seed, slot, "tools") % 2**31  # not the evaluation's inputs
        try:
            done = episode.run(problem=self.problems[problem], condition=self.condition, model=self.model_for(slot),
                               model_name=self.spec.text, messages=messages, folder=self.episodes / f"{slot:05d}",
                               turns=self.config.proposer_turns, config=self.config.eval_config(seed=tools_seed),
                               where=self.where, prices=self.prices, model_attempts=self.config.model_attempts,
                               guide_in_prompt=self.config.guide_in_prompt, log=self.log)
        except FatalProviderError as err:
            raise FatalModelError(str(err), kind=err.kind, status=err.status) from err
        except TransientProviderError as err:
            raise TransientModelError(str(err), kind=err.kind, status=err.status) from err
        spent = done.spent
        verdict = None if done.source is not None else (MODEL_ERROR if done.stop_reason == MODEL_ERROR_STOP
                                                         else NO_CODE)
        tools = ", ".join(f"{name} x{n}" for name, n in sorted(spent.tool_calls.items())) or "no tool"
        note = f"agent episode: {spent.turns} turn(s), {tools}; stopped: {done.stop_reason}"
        if done.error:
            note += f" ({done.error})"
        return Proposal(done.source, verdict, note[:MAX_NOTE_CHARS], input_tokens=spent.input_tokens,
                        output_tokens=spent.output_tokens, cost_usd=spent.cost_usd, cost_known=spent.cost_known,
                        model_s=time.perf_counter() - started, device_s=spent.gpu_s, tool_calls=dict(spent.tool_calls))

    def _invoke(self, model: BaseChatModel, messages: list[BaseMessage]) -> AIMessage:
        if isinstance(model, MutatorChatModel):
            reply = model.invoke(messages)
            assert isinstance(reply, AIMessage)
            return reply
        return invoke_model(model, messages, attempts=self.config.model_attempts, log=self.log)

    def _classify(self, err: ProviderError) -> None:
        """Raise for errors that are not this candidate's (see FatalModelError, TransientModelError)."""
        if is_fatal(err):
            raise FatalModelError(str(err), kind=err.kind, status=err.status) from err
        if is_transient(err):
            raise TransientModelError(str(err), kind=err.kind, status=err.status) from err
