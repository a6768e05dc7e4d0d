"""A chat model that replays a script, for tests of the agent loop (and `--model scripted:NAME`).

    model = ScriptedChatModel(script=script_from_steps([
        ("tool", "check", {"code": "..."}),        # an AIMessage asking for one tool call
        ("text", "done"),                          # an AIMessage with plain text
    ]))
    bound = model.bind_tools([check, bench])       # model.bound_tools records the schemas exposed
    bound.invoke(messages)                         # the next scripted AIMessage, with usage_metadata

Steps: ("text", content), ("tool", name, args), ("tools", [(name, args), ...]), or an AIMessage as is.
In JSON (a list of steps, or {"steps": [...]}) the same steps are lists: ["tool", "check", {...}].
`scripted:NAME` names a script registered with register_script, or a .json file holding one.

An answer table ({"answers": ...} in the .json file) is a model whose outcome is known per condition and
problem, for sweeps with a known answer (tests, docs/sweep.md): AnswerTableChatModel.

LongAnswerChatModel answers every call at length, as far as the request's `max_tokens` lets it, and
reports the tokens it read and wrote as a server would: for tests of the budgets within a request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field, PrivateAttr

from agent.model_spec import ProviderError

DEFAULT_USAGE = UsageMetadata(input_tokens=100, output_tokens=20, total_tokens=120)

_SCRIPTS: dict[str, Callable[[], list[AIMessage]]] = {}


class ScriptExhausted(ProviderError):
    """The agent asked the scripted model for more replies than its script holds."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="script")


class ScriptedChatModel(BaseChatModel):
    """Replays `script` in order, one AIMessage per call.

    A scripted message without usage_metadata reports `usage` (None: none at all). Every call's input
    messages and bound tool schemas are kept in `calls`; the last bind_tools in `bound_tools`.
    """

    script: list[AIMessage]
    script_name: str = "scripted"
    usage: UsageMetadata | None = Field(default_factory=lambda: DEFAULT_USAGE.copy())
    bound_tools: list[dict[str, Any]] = Field(default_factory=list)
    calls: list[dict[str, Any]] = Field(default_factory=list)
    _position: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def remaining(self) -> int:
        return len(self.script) - self._position

    @property
    def bound_tool_names(self) -> list[str]:
        return [schema["function"]["name"] for schema in self.bound_tools]

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        self.bound_tools = [convert_to_openai_tool(tool) for tool in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=self.bound_tools, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls.append({"messages": list(messages), "tools": kwargs.get("tools"),
                           "max_tokens": kwargs.get("max_tokens")})
        if self._position >= len(self.script):
            raise ScriptExhausted(
                f"scripted model {self.script_name!r} ran out: call {self._position + 1} but the script has "
                f"{len(self.script)} replies"
            )
        reply = self.script[self._position].model_copy(deep=True)
        self._position += 1
        if reply.usage_metadata is None and self.usage is not None:
            reply.usage_metadata = UsageMetadata(**self.usage)
        return ChatResult(generations=[ChatGeneration(message=reply)])


class _BindsTools(BaseChatModel):
    """A test model that takes the tools it is given as OpenAI schemas, and keeps nothing of them."""

    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | Any], *,
                   tool_choice: str | None = None, **kwargs: Any) -> Runnable[Any, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(tool) for tool in tools], **kwargs)


class LongAnswerChatModel(_BindsTools):
    """Every reply: `answer_tokens` tokens of text (cut to the request's `max_tokens`, as a server cuts a
    reply, finish_reason "length") and the same tool call, `tool` with `args`. Its usage is what it read
    (the messages and the tool schemas, counted as agent.context counts them) and what it wrote; each
    call's max_tokens is kept in `limits`."""

    answer_tokens: int = 2_000
    tool: str = "compile"
    args: dict[str, Any] = Field(default_factory=dict)
    limits: list[int | None] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted-long"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        from agent.context import count_message, tools_token_count  # deferred: tools.render loads tiktoken

        limit = kwargs.get("max_tokens")
        self.limits.append(limit)
        written = self.answer_tokens if limit is None else min(self.answer_tokens, int(limit))
        read = sum(count_message(m) for m in messages) + tools_token_count(kwargs.get("tools") or [])
        reply = AIMessage(content=" ".join(["word"] * written),
                          tool_calls=[{"name": self.tool, "args": dict(self.args), "id": f"long_{len(self.limits)}",
                                       "type": "tool_call"}],
                          response_metadata={"finish_reason": "length" if written < self.answer_tokens else "stop"})
        reply.usage_metadata = UsageMetadata(input_tokens=read, output_tokens=written, total_tokens=read + written)
        return ChatResult(generations=[ChatGeneration(message=reply)])


def script_from_steps(steps: Iterable[Any]) -> list[AIMessage]:
    """AIMessages from simple steps (see the module docstring); tool-call ids are call_0, call_1, ..."""
    script: list[AIMessage] = []
    counter = 0

    def call(name: Any, args: Any) -> dict[str, Any]:
        nonlocal counter
        if not isinstance(name, str) or not isinstance(args, dict):
            raise ValueError(f"a tool step needs a name and an args object, got {name!r}, {args!r}")
        counter += 1
        return {"name": name, "args": args, "id": f"call_{counter - 1}", "type": "tool_call"}

    for number, step in enumerate(steps):
        if isinstance(step, AIMessage):
            script.append(step)
            continue
        kind = step[0] if isinstance(step, (list, tuple)) and step else None
        if kind == "text" and len(step) == 2 and isinstance(step[1], str):
            script.append(AIMessage(content=step[1]))
        elif kind == "tool" and len(step) == 3:
            script.append(AIMessage(content="", tool_calls=[call(step[1], step[2])]))
        elif kind == "tools" and len(step) == 2:
            script.append(AIMessage(content="", tool_calls=[call(*pair) for pair in step[1]]))
        else:
            raise ValueError(
                f"script step {number} is {step!r}; use ('text', content), ('tool', name, args) "
                "or ('tools', [(name, args), ...])"
            )
    return script


def register_script(name: str, steps: Iterable[Any]) -> None:
    """Make `scripted:NAME` replay these steps (a fresh copy for every model built)."""
    script = script_from_steps(steps)
    _SCRIPTS[name] = lambda: [message.model_copy(deep=True) for message in script]


_PROBLEM_LINE = re.compile(r"^# Problem: (\S+)", re.M)  # prompts/task.md's first line
ANY = "*"


class AnswerTableChatModel(_BindsTools):
    """Answers every call from a table: condition -> problem -> code (None: a reply without code).

    The condition is read from the tools bound to the call (none: zero-shot; else agent:<tools>, recall and
    submit left out, as agent.conditions names it), the problem from the task's `# Problem: NAME` line; "*"
    stands for any condition or problem not listed. An agent gets the code as a reply without tool calls,
    which is its submission. Stateless, so a resumed sample needs nothing to pick up where it was.

    JSON: {"answers": {"zero-shot": {"*": null}, "agent:check": {"all_reduce": "correct_ar.py", "*": null}}},
    each file relative to the JSON file.
    """

    answers: dict[str, dict[str, str | None]]
    table_name: str = "answers"
    usage: UsageMetadata | None = Field(default_factory=lambda: DEFAULT_USAGE.copy())

    @property
    def _llm_type(self) -> str:
        return "scripted-answers"

    def condition(self, tools: Sequence[dict[str, Any]] | None) -> str:
        # Deferred: agent.conditions reads the tool registry, which a plain scripted script never needs.
        from agent.conditions import AGENT, RECALL, SUBMIT, ZERO_SHOT

        names = sorted(t["function"]["name"] for t in tools or [] if t["function"]["name"] not in (RECALL, SUBMIT))
        return f"{AGENT}:{'+'.join(names)}" if tools else ZERO_SHOT

    def answer(self, condition: str, problem: str | None) -> str | None:
        table = self.answers.get(condition, self.answers.get(ANY, {}))
        return table.get(problem or "", table.get(ANY))

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        text = "\n".join(m.content for m in messages if isinstance(m.content, str))
        found = _PROBLEM_LINE.search(text)
        code = self.answer(self.condition(kwargs.get("tools")), found.group(1) if found else None)
        content = f"Here is the kernel.\n\n```python\n{code.rstrip()}\n```\n" if code is not None else \
            "I cannot write this kernel."
        reply = AIMessage(content=content)
        if self.usage is not None:
            reply.usage_metadata = UsageMetadata(**self.usage)
        return ChatResult(generations=[ChatGeneration(message=reply)])


def answer_table(path: Path, data: dict[str, Any]) -> AnswerTableChatModel:
    """The AnswerTableChatModel of a JSON file; files named in it are read relative to it."""
    answers = data["answers"]
    if not isinstance(answers, dict) or not all(isinstance(v, dict) for v in answers.values()):
        raise ValueError('"answers" must map each condition to an object of problem -> file or null')
    table: dict[str, dict[str, str | None]] = {}
    for condition, by_problem in answers.items():
        table[condition] = {}
        for problem, file in by_problem.items():
            if file is not None and not isinstance(file, str):
                raise ValueError(f"answers.{condition}.{problem} must be a file name or null")
            table[condition][problem] = None if file is None else (path.parent / file).read_text()
    return AnswerTableChatModel(answers=table, table_name=str(path))


def scripted_model(name: str) -> BaseChatModel:
    """The model behind `scripted:NAME`: a registered script, or a .json file (a script or an answer table)."""
    if name in _SCRIPTS:
        return ScriptedChatModel(script=_SCRIPTS[name](), script_name=name)
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        try:
            data = json.loads(path.read_text())
            if isinstance(data, dict) and "answers" in data:
                return answer_table(path, data)
            steps = data["steps"] if isinstance(data, dict) else data
            return ScriptedChatModel(script=script_from_steps(steps), script_name=name)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ProviderError(f"script {name} cannot be used: {err}") from None
    known = ", ".join(sorted(_SCRIPTS)) or "none"
    raise ProviderError(f"no script {name!r}: give a .json script file or a registered name (registered: {known})")
