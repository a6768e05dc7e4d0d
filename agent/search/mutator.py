"""A stochastic scripted model for the search: its proposals are edits of real kernels, failures mixed in.

`MutatorChatModel` is a LangChain chat model that needs no network. It reads the prompt the search sends
(the problem's name from the task, `# Problem: NAME`; the parent kernel from the `## Parent` section; an
inspiration from `## Inspiration`) and answers like a model would: a sentence on what it changed, then
the whole file in a ```python block, with token usage. What it changes:

- with a parent: one or more tunable edits (a step along the ladder, sometimes a jump; agent.search.tunables),
  sometimes a switch to a sibling variant of the same family carrying the tunable values over, and with an
  inspiration a crossover of tunable values;
- without a parent (a fresh draft, as independent sampling asks): one of the library's kernels for the
  problem, with a few edits;
- at the configured rates, a failure instead: a syntax error, a wrong answer, a hang (one rank waits in a
  barrier its peers never join), a runtime error, a collective in the timed call (correct, but flagged
  `uses_torch_collectives`), or a reply without code.

The library is the expert solutions (problems/*/solutions/<problem>__*.py) on CUDA, and the CPU families
(agent/search/cpu_kernels/) on CPU, where the CUDA experts cannot run. Every draw comes from a
random.Random seeded by `seed` alone, so one model object answers one prompt the same way every time: the
search builds one per candidate with a seed derived from the run's seed and the candidate's index, which
makes a search with this model reproducible (and a killed one resumable to the same archive).

As an agent proposer (a search with `--proposer agent:check+...`, agent.search.episode) it checks each draft
with `check` (else `compile`) before answering: a draft that passes is its answer; one that fails is
replaced by a fresh draft (drawn from the seed and the number of failed checks), until the episode's turns
run out. So its injected failures are caught by the tools instead of costing an evaluation.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

import prompts
from agent.search import tunables

MUTATOR = "mutator"  # the model string is scripted:mutator, or scripted:mutator:syntax=0.1,hang=0
REPO = Path(__file__).resolve().parents[2]
CPU_KERNELS = Path(__file__).resolve().parent / "cpu_kernels"
EXPERT_GLOB = "problems/*/solutions"
_PROBLEM = re.compile(r"^# Problem: (\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Rates:
    """How often a reply is each kind of failure (the rest are edits), and how edits are drawn."""

    syntax: float = 0.04
    wrong: float = 0.06
    hang: float = 0.02
    runtime: float = 0.04
    collective: float = 0.04
    no_code: float = 0.02
    variant: float = 0.15  # of edits: switch to a sibling variant of the family
    jump: float = 0.25  # of tunable edits: a random value of the ladder instead of a neighbour

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"mutator rate {f.name} must be in [0, 1], got {value}")
        if self.failure_total > 1.0:
            raise ValueError(f"mutator failure rates add up to {self.failure_total:.2f} > 1")

    @property
    def failure_total(self) -> float:
        return self.syntax + self.wrong + self.hang + self.runtime + self.collective + self.no_code

    @classmethod
    def parse(cls, text: str) -> Rates:
        """`syntax=0.1,hang=0` (the part after `scripted:mutator:`); empty: the defaults."""
        values: dict[str, float] = {}
        known = {f.name for f in fields(cls)}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in known:
                raise ValueError(f"mutator option {item!r}: use NAME=RATE with NAME one of {', '.join(sorted(known))}")
            try:
                values[key.strip()] = float(value)
            except ValueError:
                raise ValueError(f"mutator option {item!r}: {value!r} is not a number") from None
        return cls(**values)


def is_mutator(model_name: str) -> bool:
    """`mutator` or `mutator:OPTIONS` (the name part of scripted:...)."""
    return model_name == MUTATOR or model_name.startswith(MUTATOR + ":")


def rates_of(model_name: str) -> Rates:
    return Rates.parse(model_name.partition(":")[2])


# -- the library --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kernel:
    name: str  # the file's stem: <problem>__<variant>
    source: str

    @property
    def skeleton(self) -> str:
        return tunables.skeleton(self.source)


def library(problem: str, device: str) -> list[Kernel]:
    """The kernels the model knows for `problem` on `device`, in name order."""
    if device == "cuda":
        files = sorted(REPO.glob(f"{EXPERT_GLOB}/{problem}__*.py"))
    else:
        files = sorted(CPU_KERNELS.glob(f"{problem}__*.py"))
    return [Kernel(path.stem, path.read_text()) for path in files]


def family_of(source: str, kernels: list[Kernel]) -> Kernel | None:
    """The library kernel `source` is an edit of, by its skeleton (tunable values blanked)."""
    shape = tunables.skeleton(source)
    return next((k for k in kernels if k.skeleton == shape), None)


# -- edits --------------------------------------------------------------------------------------------------
@dataclass
class Draft:
    source: str
    notes: list[str] = field(default_factory=list)


def edit_tunable(draft: Draft, rng: random.Random, rates: Rates) -> bool:
    sites = [t for t in tunables.find_tunables(draft.source) if len(t.choices) > 1]
    if not sites:
        return False
    site = rng.choice(sites)
    if rng.random() < rates.jump:
        value = rng.choice([c for c in site.choices if c != site.value])
    else:
        i = site.index + rng.choice((-1, 1))
        i = min(max(i, 0), len(site.choices) - 1)
        if site.choices[i] == site.value:
            i = site.index - 1 if site.index > 0 else site.index + 1
        value = site.choices[i]
    draft.source = tunables.set_value(draft.source, site, value)
    draft.notes.append(f"{site.name} {site.value} -> {value}")
    return True


def carry_tunables(source: str, values: Mapping[str, str]) -> str:
    """`source` with its annotated tunables set to `values` where the names agree and the value is allowed."""
    for name, value in values.items():
        site = tunables.by_name(source).get(name)
        if site is not None and value in site.choices and site.value != value:
            source = tunables.set_value(source, site, value)
    return source


def switch_variant(draft: Draft, rng: random.Random, kernels: list[Kernel]) -> bool:
    current = family_of(draft.source, kernels)
    others = [k for k in kernels if current is None or k.name != current.name]
    if not others:
        return False
    target = rng.choice(others)
    values = {name: t.value for name, t in tunables.by_name(draft.source).items()}
    draft.source = carry_tunables(target.source, values)
    draft.notes.append(f"switched to the {target.name.split('__', 1)[-1]} variant")
    return True


def crossover(draft: Draft, rng: random.Random, inspiration: str) -> bool:
    theirs = tunables.by_name(inspiration)
    changed = False
    for name, mine in tunables.by_name(draft.source).items():
        other = theirs.get(name)
        if other is not None and other.value != mine.value and rng.random() < 0.5:
            draft.source = carry_tunables(draft.source, {name: other.value})
            draft.notes.append(f"{name} {mine.value} -> {other.value} (from the inspiration)")
            changed = True
    return changed


# -- failures -----------------------------------------------------------------------------------------------
def _solution_def(source: str) -> ast.FunctionDef | None:
    try:
        tree = tunables.parse(source)
    except (SyntaxError, ValueError):
        return None
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "solution"), None)


def _insert_in_solution(source: str, lines: list[str]) -> str | None:
    """`lines` inserted as the first statements of solution() (after its docstring)."""
    fn = _solution_def(source)
    if fn is None or not fn.body:
        return None
    body = fn.body
    first = body[1] if (len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                        and isinstance(body[0].value.value, str)) else body[0]
    indent = " " * first.col_offset
    text = source.splitlines(keepends=True)
    at = first.lineno - 1
    return "".join(text[:at] + [indent + line + "\n" for line in lines] + text[at:])


def break_syntax(source: str) -> tuple[str, str] | None:
    """The colon of the `def solution(...)` line dropped."""
    fn = _solution_def(source)
    if fn is None:
        return None
    lines = source.splitlines(keepends=True)
    for i in range(fn.lineno - 1, min(len(lines), fn.body[0].lineno - 1)):
        stripped = lines[i].rstrip("\n")
        if stripped.rstrip().endswith(":"):
            lines[i] = stripped.rstrip()[:-1] + "\n"
            return "".join(lines), "tidied the signature of solution()"
    return None


def wrong_answer(source: str) -> tuple[str, str] | None:
    """The reduction loses a rank (`range(1, world)` starts at 2), else every return value is halved."""
    if "range(1, world)" in source:
        return source.replace("range(1, world)", "range(2, world)", 1), "skipped a redundant accumulation step"
    fn = _solution_def(source)
    if fn is None:
        return None
    returns = [n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None]
    if not returns:
        return None
    last = max(returns, key=lambda n: n.lineno)
    lines = source.splitlines(keepends=True)
    line = lines[last.lineno - 1]
    head, sep, value = line.partition("return ")
    if not sep or last.end_lineno != last.lineno:
        return None
    lines[last.lineno - 1] = f"{head}return ({value.rstrip()}) * 0.5\n"
    return "".join(lines), "folded the output scaling into the return"


def hang(source: str) -> tuple[str, str] | None:
    """The last rank waits in a barrier no other rank joins: a real deadlock."""
    out = _insert_in_solution(source, [
        "if torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:",
        "    torch.distributed.barrier()  # make sure the peers' writes have landed",
    ])
    return (out, "added a safety barrier on the last rank") if out else None


def runtime_error(source: str) -> tuple[str, str] | None:
    out = _insert_in_solution(source, ["_scratch_bytes = _workspace_bytes(x)  # size the scratch once"])
    return (out, "sized the scratch buffer up front") if out else None


def collective(source: str) -> tuple[str, str] | None:
    """A torch.distributed barrier in every call: correct, and flagged uses_torch_collectives by the harness."""
    out = _insert_in_solution(source, ["torch.distributed.barrier()  # keep the ranks in step"])
    return (out, "kept the ranks in step with a barrier") if out else None


FAILURES = {"syntax": break_syntax, "wrong": wrong_answer, "hang": hang, "runtime": runtime_error,
            "collective": collective}


# -- the model ----------------------------------------------------------------------------------------------
def section(text: str, heading: str) -> str | None:
    """The body of the markdown section `## heading` (to the next `## ` heading), or None."""
    match = re.search(rf"(?m)^## {re.escape(heading)}\s*$", text)
    if match is None:
        return None
    rest = text[match.end():]
    following = re.search(r"(?m)^## ", rest)
    return rest[:following.start()] if following else rest


def propose(problem: str | None, parent: str | None, inspiration: str | None, *, device: str, rates: Rates,
            rng: random.Random) -> tuple[str | None, list[str]]:
    """(the new file or None for a reply without code, what was done)."""
    roll = rng.random()
    if roll < rates.no_code:
        return None, ["no_code"]
    kernels = library(problem, device) if problem else []
    if parent is not None:
        draft = Draft(parent)
        if inspiration is not None and rng.random() < 0.5:
            crossover(draft, rng, inspiration)
        if rng.random() < rates.variant:
            switch_variant(draft, rng, kernels)
        for _ in range(1 + int(rng.random() < 0.35) + int(rng.random() < 0.1)):
            edit_tunable(draft, rng, rates)
    elif kernels:
        start = rng.choice(kernels)
        draft = Draft(start.source, [f"started from the {start.name.split('__', 1)[-1]} design"])
        for _ in range(rng.choice((0, 1, 1, 2))):
            edit_tunable(draft, rng, rates)
    else:
        return None, ["no kernel known for this problem"]
    threshold = rates.no_code
    for name in ("syntax", "wrong", "hang", "runtime", "collective"):
        threshold += getattr(rates, name)
        if roll < threshold:
            broken = FAILURES[name](draft.source)
            if broken is not None:
                draft.source, note = broken
                draft.notes.append(note)
                draft.notes.append(f"injected:{name}")
            break
    return draft.source, draft.notes


def reply_text(source: str | None, notes: list[str]) -> str:
    said = [n for n in notes if not n.startswith("injected:")]
    if source is None:
        return "I could not find a safe improvement for this kernel; I would keep the current version."
    summary = "; ".join(said) if said else "kept the design, re-checked the details"
    return f"Changes: {summary}.\n\n```python\n{source.rstrip()}\n```\n"


class MutatorChatModel(BaseChatModel):
    """The stochastic scripted model; `seed` fixes every draw (one object per candidate, see the module doc)."""

    seed: int
    device: str = "cpu"
    rates: Rates = Field(default_factory=Rates)

    @property
    def _llm_type(self) -> str:
        return "pkb-mutator"

    def bind_tools(self, tools: Any, *, tool_choice: str | None = None, **kwargs: Any) -> Runnable[Any, AIMessage]:
        """As an agent proposer (agent.search.episode): the tools are offered with every call."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        text = "\n".join(m.content if isinstance(m.content, str) else str(m.content) for m in messages)
        found = _PROBLEM.search(text)
        parent_part, inspiration_part = section(text, "Parent"), section(text, "Inspiration")
        parent = prompts.extract_code(parent_part) if parent_part else None
        inspiration = prompts.extract_code(inspiration_part) if inspiration_part else None
        tools = [t["function"]["name"] for t in kwargs.get("tools") or []]
        tool = next((t for t in CHECKING_TOOLS if t in tools), None)
        tried = [m for m in messages if isinstance(m, ToolMessage)]
        if tool is not None and tried and passed(str(tried[-1].content)):
            # As an agent: the last draft passed its check; answer with it (its submission).
            ai = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
            source: str | None = str(ai[-1].tool_calls[0]["args"].get("source") or "")
            notes = ["passed its check"]
            content = reply_text(source, notes)
            reply = AIMessage(content=content)
        else:
            # Each attempt of an agent draws afresh (the seed and how many drafts failed their check).
            rng = random.Random(self.seed if not tried else derive(self.seed, len(tried)))
            source, notes = propose(found.group(1) if found else None, parent, inspiration, device=self.device,
                                    rates=self.rates, rng=rng)
            content = reply_text(source, notes)
            reply = AIMessage(content=content)
            if tool is not None and source is not None:
                said = "; ".join(n for n in notes if not n.startswith("injected:")) or "a draft"
                content = f"Checking this draft first ({said})."
                reply = AIMessage(content=content, tool_calls=[{"name": tool, "args": {"source": source},
                                                                "id": f"call_{len(tried)}", "type": "tool_call"}])
        reply.usage_metadata = UsageMetadata(input_tokens=len(text) // 4, output_tokens=len(content) // 4,
                                             total_tokens=len(text) // 4 + len(content) // 4)
        return ChatResult(generations=[ChatGeneration(message=reply)])


# As an agent, the model checks a draft with the first of these tools it is given before answering with it.
CHECKING_TOOLS = ("check", "compile")


def passed(tool_answer: str) -> bool:
    """Whether a check or compile answer (tools/check.py, tools/compile.py) says the draft passed."""
    return tool_answer.startswith(("check: correct", "compile: OK"))


def derive(seed: int, attempt: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:attempt:{attempt}".encode()).digest()[:8], "big")
