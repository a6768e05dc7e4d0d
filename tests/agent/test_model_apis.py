"""Providers against local servers that enforce the real APIs' rules (tests/fakes): reasoning parameters,
thinking blocks sent back unchanged, prompt caching and its accounting, context management over a
scripted 30-turn agent session, and the context-overflow stop.

The servers are the model: a Brain decides each reply from the request, so the whole loop (LangGraph,
LangChain, the SDKs, the HTTP wire) runs for real; only evaluations are faked (tests/fakes/session.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI

from agent.caching import breakpoint_positions, with_breakpoints
from agent.cli import main as pkb
from agent.context import ContextPolicy, ContextState, best_and_newest, prepare
from agent.model_table import load_model_table
from agent.providers import ProviderError
from agent.reasoning import ReasoningConfig
from agent.retry import invoke_model
from agent.rundir import RunDir
from agent.runner import RunConfig, Runner, create_run
from agent.scheduler import DeviceScheduler
from agent.usage import Usage, load_price_table, usage_of
from harness.config import EvalConfig
from harness.problems.registry import get, load_suite
from tests.agent_support import chat_model_for
from tests.fakes.anthropic_api import AnthropicFake, AnthropicModel, signature
from tests.fakes.base import Turn
from tests.fakes.openai_api import CACHE_STEP, OpenAIFake, OpenAIModel
from tests.fakes.session import BEST_TURN, RECALLED, FakeExecutor, candidate, session_brain
from tools.base import ToolContext, ToolSettings
from tools.dispatch import run_tool

TURNS = 30
WINDOW = 40_000  # fake tokens: the session's candidates alone are more than this
PRICES = {"openai:gpt-fake": {"input": 1.0, "output": 4.0, "cache_read": 0.1},
          "anthropic:claude-fake": {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75}}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "HTTP_PROXY",
                 "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-local")


@pytest.fixture
def tables(tmp_path: Path) -> dict[str, str]:
    models = {"version": "test", "models": {
        "openai:gpt-fake": {"context_window": WINDOW, "max_output_tokens": 32000, "reasoning": "effort",
                            "temperature": False, "effort_levels": ["low", "medium", "high"]},
        "anthropic:claude-fake": {"context_window": WINDOW, "max_output_tokens": 64000, "reasoning": "budget",
                                  "temperature": True, "effort_levels": []}},
        "thinking_budget_for_effort": {"low": 2048}}
    prices = {"version": "test", "currency": "USD", "per_million_tokens": PRICES}
    (tmp_path / "models.json").write_text(json.dumps(models))
    (tmp_path / "prices.json").write_text(json.dumps(prices))
    return {"models": str(tmp_path / "models.json"), "prices": str(tmp_path / "prices.json")}


@pytest.fixture
def openai_fake() -> Iterator[OpenAIFake]:
    with OpenAIFake(brain=session_brain(TURNS), models={"gpt-fake": OpenAIModel(WINDOW, reasoning=True)},
                    reasoning_content=True) as fake:
        yield fake


@pytest.fixture
def anthropic_fake() -> Iterator[AnthropicFake]:
    with AnthropicFake(brain=session_brain(TURNS), models={"claude-fake": AnthropicModel(WINDOW, "budget")}) as fake:
        yield fake


def run_session(tmp_path: Path, model: str, base_url: str, tables: dict[str, str], *, run_id: str,
                **config: Any) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """One agent sample of all_reduce against a fake server; (sample.json, transcript, events)."""
    run_config = RunConfig(model=model, conditions=["agent:bench+check"], samples=1, problems=["all_reduce"],
                           budgets={"max_turns": TURNS + 5, "max_wall_s": 600.0}, trials=2, model_attempts=1,
                           base_url=base_url, prices=tables["prices"], models=tables["models"],
                           reasoning_effort="low", **config)
    run_dir = RunDir(tmp_path / run_id)
    prices = load_price_table(tables["prices"])
    create_run(run_dir, run_config, prices)
    runner = Runner(run_dir, run_config, [get(load_suite(), "all_reduce")], prices=prices,
                    executor=FakeExecutor(), eval_config=EvalConfig(trials=2),
                    scheduler=DeviceScheduler("cpu", 2, cpu_slots=1))
    summary = runner.run()
    assert summary.complete and not summary.errors and summary.fatal is None, summary
    folder = run_dir.path / "samples" / "all_reduce" / "agent:bench+check" / "0"
    events = [json.loads(line) for line in run_dir.events.read_text().splitlines() if line.strip()]
    return (json.loads((folder / "sample.json").read_text()), json.loads((folder / "transcript.json").read_text()),
            events)


def shortened_turns(events: list[dict[str, Any]]) -> set[int]:
    return {e["turn"] for e in events if e.get("event") == "context_shortened"}


# -- a 30-turn session against each server ------------------------------------------------------------------
def test_openai_session_is_well_formed_fits_the_window_and_keeps_its_prefix_cached(tmp_path, tables, openai_fake):
    record, transcript, events = run_session(tmp_path, "openai:gpt-fake", openai_fake.url + "/v1", tables,
                                             run_id="openai")
    assert not openai_fake.rejected, openai_fake.rejected[0].answer  # every request obeyed the server's rules
    assert record["stop_reason"] == "submitted" and record["turns"] == TURNS and record["verdict"] == "correct"
    bodies = [e.body for e in openai_fake.exchanges]
    assert all(b["reasoning_effort"] == "low" and "temperature" not in b and "max_tokens" not in b for b in bodies)
    # the transcript sent never passed the window, and the context manager had to act for that
    assert max(u["prompt_tokens"] for u in openai_fake.usages) <= WINDOW
    assert record["context"]["shortened"] > 0 and record["context"]["batches"] >= 1
    # ... while the transcript on disk keeps every candidate whole
    sent = [c["args"]["source"] for m in transcript if m["role"] == "assistant" for c in m["tool_calls"]
            if "source" in c["args"]]
    assert len(sent) == TURNS - 1 and all(not s.startswith("[candidate") for s in sent)
    assert sum(len(s) for s in sent) > 3 * WINDOW  # bytes: the candidates alone are over the window
    # byte-stable prefix: every turn without a new shortening batch hits the cache for the whole last prompt
    batches = shortened_turns(events)
    usages = openai_fake.usages
    for turn in range(2, TURNS + 1):
        if turn not in batches:
            previous = usages[turn - 2]["prompt_tokens"]
            assert usages[turn - 1]["prompt_tokens_details"]["cached_tokens"] >= previous - CACHE_STEP, turn
    # usage recorded is what the server reported; the reasoning text it returned is in the transcript
    assert record["usage"]["input_tokens"] == sum(u["prompt_tokens"] for u in usages)
    assert record["usage"]["cache_read_tokens"] == sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert record["usage"]["reasoning_tokens"] == 40 * TURNS
    replies = [m for m in transcript if m["role"] == "assistant"]
    assert replies[5]["reasoning"] == "Turn 5: trying the next variant." and replies[5]["finish_reason"] == "tool_calls"


def test_anthropic_session_sends_thinking_back_and_reads_the_whole_previous_prompt(tmp_path, tables,
                                                                                    anthropic_fake):
    record, transcript, events = run_session(tmp_path, "anthropic:claude-fake", anthropic_fake.url, tables,
                                             run_id="anthropic")
    assert not anthropic_fake.rejected, anthropic_fake.rejected[0].answer  # thinking blocks came back intact
    assert record["stop_reason"] == "submitted" and record["turns"] == TURNS and record["verdict"] == "correct"
    bodies = [e.body for e in anthropic_fake.exchanges]
    assert all(b["thinking"] == {"type": "enabled", "budget_tokens": 2048} and "temperature" not in b for b in bodies)
    assert all(b["max_tokens"] > 2048 for b in bodies)
    # every later request carries every earlier thinking block with its signature, byte for byte
    last = bodies[-1]["messages"]
    thoughts = [b for m in last if m["role"] == "assistant" for b in m["content"] if b.get("type") == "thinking"]
    assert len(thoughts) == TURNS - 1 and all(t["signature"] == signature(t["thinking"]) for t in thoughts)
    usages = anthropic_fake.usages
    totals = [u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] for u in usages]
    assert max(totals) <= WINDOW and record["context"]["batches"] >= 1
    # each turn without a new shortening batch reads everything the previous request sent from the cache
    batches = shortened_turns(events)
    for turn in range(2, TURNS + 1):
        if turn not in batches:
            assert usages[turn - 1]["cache_read_input_tokens"] == totals[turn - 2], turn
    assert record["usage"]["cache_write_tokens"] == sum(u["cache_creation_input_tokens"] for u in usages)
    assert record["usage"]["reasoning_tokens"] == sum(u["output_tokens_details"]["thinking_tokens"] for u in usages)
    replies = [m for m in transcript if m["role"] == "assistant"]
    assert replies[3]["reasoning"] == "Turn 3: trying the next variant." and replies[3]["finish_reason"] == "tool_use"


def cost_of(usages: list[dict[str, Any]], wire: str, price: dict[str, float]) -> float:
    """What the server's own usage report costs at `price` (USD per million tokens)."""
    total = 0.0
    for u in usages:
        if wire == "openai":
            cached = u["prompt_tokens_details"]["cached_tokens"]
            total += (u["prompt_tokens"] - cached) * price["input"] + cached * price["cache_read"]
            total += u["completion_tokens"] * price["output"]
        else:
            total += (u["input_tokens"] * price["input"] + u["cache_read_input_tokens"] * price["cache_read"]
                      + u["cache_creation_input_tokens"] * price["cache_write"] + u["output_tokens"] * price["output"])
    return total / 1e6


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_recorded_cost_with_caching_is_below_without_by_what_the_cache_reported(tmp_path, tables, wire):
    model = "openai:gpt-fake" if wire == "openai" else "anthropic:claude-fake"
    price = PRICES[model]
    runs: dict[bool, tuple[dict[str, Any], list[dict[str, Any]], list[str]]] = {}
    for cached in (True, False):
        if wire == "openai":  # OpenAI caches on its own: the server's cache is what is switched off
            fake: Any = OpenAIFake(brain=session_brain(TURNS), models={"gpt-fake": OpenAIModel(WINDOW, True)},
                                   cache=cached)
            url, extra = None, {}
        else:  # Anthropic caches only where asked: pkb's breakpoints are what is switched off
            fake = AnthropicFake(brain=session_brain(TURNS), models={"claude-fake": AnthropicModel(WINDOW)})
            url, extra = None, {"prompt_cache": cached}
        with fake:
            url = fake.url + ("/v1" if wire == "openai" else "")
            record, _, _ = run_session(tmp_path, model, url, tables, run_id=f"{wire}-{cached}", **extra)
            runs[cached] = (record, fake.usages, [json.dumps(e.body.get("messages")) for e in fake.exchanges])
    (on, usages_on, sent_on), (off, usages_off, sent_off) = runs[True], runs[False]
    # the same conversation both times, so the difference is caching alone
    assert on["turns"] == off["turns"] == TURNS and on["usage"]["input_tokens"] == off["usage"]["input_tokens"]
    if wire == "openai":
        assert sent_on == sent_off
    # the recorded cost is the server's usage report priced, both ways
    assert on["usage"]["cost_usd"] == pytest.approx(cost_of(usages_on, wire, price), abs=2e-6)
    assert off["usage"]["cost_usd"] == pytest.approx(cost_of(usages_off, wire, price), abs=2e-6)
    assert off["usage"]["cache_read_tokens"] == off["usage"]["cache_write_tokens"] == 0
    # and it is lower with caching by exactly what the cache reported: reads saved, writes surcharged
    reads, writes = on["usage"]["cache_read_tokens"], on["usage"]["cache_write_tokens"]
    saved = (reads * (price["input"] - price["cache_read"])
             - writes * (price.get("cache_write", price["input"]) - price["input"])) / 1e6
    assert on["usage"]["cost_usd"] < off["usage"]["cost_usd"]
    assert off["usage"]["cost_usd"] - on["usage"]["cost_usd"] == pytest.approx(saved, abs=4e-6)
    assert reads > 0.5 * on["usage"]["input_tokens"]  # most of what a long session reads comes from the cache


# -- the servers' rules, one at a time ----------------------------------------------------------------------
def test_openai_server_refuses_temperature_and_max_tokens_for_a_reasoning_model_and_pkb_never_sends_them(
        tables):
    with OpenAIFake(models={"gpt-fake": OpenAIModel(WINDOW, True), "chat-fake": OpenAIModel(WINDOW, False)}) as fake:
        raw = ChatOpenAI(model="gpt-fake", base_url=fake.url + "/v1", api_key="k", max_retries=0, temperature=0.2)
        with pytest.raises(ProviderError, match="temperature"):
            invoke_model(raw, [HumanMessage("hi")], attempts=1)
        raw = ChatOpenAI(model="chat-fake", base_url=fake.url + "/v1", api_key="k", max_retries=0,
                         reasoning_effort="high")
        with pytest.raises(ProviderError, match="reasoning_effort"):
            invoke_model(raw, [HumanMessage("hi")], attempts=1)
        table = load_model_table(tables["models"])
        with pytest.raises(ProviderError, match="refuses a temperature"):  # refused before any request
            chat_model_for("openai:gpt-fake", base_url=fake.url + "/v1", temperature=0.2, models=table)
        model = chat_model_for("openai:gpt-fake", base_url=fake.url + "/v1", max_output_tokens=500, models=table,
                               reasoning=ReasoningConfig("high"))
        assert invoke_model(model, [HumanMessage("hi")], attempts=1).content == "ok"
        body = fake.exchanges[-1].body
        assert body["reasoning_effort"] == "high" and body["max_completion_tokens"] == 500
        assert "max_tokens" not in body and "temperature" not in body
        # a model the table does not know (a compatible server) gets max_tokens as well: llama.cpp reads only that
        model = chat_model_for("openai:chat-fake", base_url=fake.url + "/v1", max_output_tokens=500, models=table)
        invoke_model(model, [HumanMessage("hi")], attempts=1)
        assert fake.exchanges[-1].body["max_tokens"] == 500 == fake.exchanges[-1].body["max_completion_tokens"]


def test_openai_server_reports_cached_tokens_only_for_a_repeated_prefix():
    with OpenAIFake(models={"gpt-fake": OpenAIModel(WINDOW, True)}) as fake:
        model = ChatOpenAI(model="gpt-fake", base_url=fake.url + "/v1", api_key="k", max_retries=0)
        long = SystemMessage("x" * 9000)  # 3000 fake tokens
        invoke_model(model, [long, HumanMessage("a")], attempts=1)
        again = invoke_model(model, [long, HumanMessage("b")], attempts=1)
        other = invoke_model(model, [SystemMessage("y" + "x" * 8999), HumanMessage("a")], attempts=1)
    first, second, third = (u["prompt_tokens_details"]["cached_tokens"] for u in fake.usages)
    assert first == 0 and second >= 2944 and second % CACHE_STEP == 0 and third == 0
    again_usage, other_usage = usage_of(again), usage_of(other)
    assert again_usage is not None and other_usage is not None
    assert again_usage.cache_read_tokens == second and other_usage.cache_read_tokens == 0


def anthropic_client(fake: AnthropicFake) -> Any:
    """The SDK's client on the fake. Typed Any: these tests send what the SDK's request types refuse on purpose
    (altered thinking blocks, a temperature through extra_body, bare dicts for its TypedDicts)."""
    return anthropic.Anthropic(api_key="k", base_url=fake.url, max_retries=0)


def test_anthropic_server_refuses_a_tool_result_whose_thinking_block_is_missing_or_altered():
    brain = lambda turn, body: Turn(thinking="I will call check.", tool=("check", {"source": "x"}))  # noqa: E731
    with AnthropicFake(brain=brain, models={"claude-fake": AnthropicModel(WINDOW)}) as fake:
        client = anthropic_client(fake)
        thinking = {"type": "enabled", "budget_tokens": 1024}
        first = client.messages.create(model="claude-fake", max_tokens=4096, thinking=thinking,
                                       messages=[{"role": "user", "content": "write it"}])
        blocks = [b.model_dump(exclude_none=True) for b in first.content]
        assert [b["type"] for b in blocks] == ["thinking", "tool_use"]
        result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": blocks[1]["id"],
                                               "content": "correct"}]}

        def send(assistant: list[dict[str, Any]]) -> Any:
            return client.messages.create(model="claude-fake", max_tokens=4096, thinking=thinking, messages=[
                {"role": "user", "content": "write it"}, {"role": "assistant", "content": assistant}, result])

        assert send(blocks).stop_reason == "tool_use"  # sent back unchanged: accepted
        with pytest.raises(anthropic.BadRequestError, match="Expected `thinking`"):
            send(blocks[1:])  # missing
        altered = [{**blocks[0], "thinking": "I will call bench."}, blocks[1]]
        with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
            send(altered)
        with pytest.raises(anthropic.BadRequestError, match="temperature"):
            client.messages.create(model="claude-fake", max_tokens=4096, thinking=thinking,
                                   extra_body={"temperature": 0.5},  # this SDK has no temperature argument
                                   messages=[{"role": "user", "content": "write it"}])
        with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
            client.messages.create(model="claude-fake", max_tokens=1024, thinking=thinking,
                                   messages=[{"role": "user", "content": "write it"}])


def test_anthropic_server_reads_the_cache_only_for_a_byte_identical_prefix():
    with AnthropicFake(models={"claude-fake": AnthropicModel(WINDOW)}) as fake:
        client = anthropic_client(fake)
        system = [{"type": "text", "text": "s" * 6000, "cache_control": {"type": "ephemeral"}}]

        def send(system_blocks: list[dict[str, Any]], user: str) -> Any:
            return client.messages.create(model="claude-fake", max_tokens=100, system=system_blocks,
                                          messages=[{"role": "user", "content": user}]).usage

        written = send(system, "a")
        read = send(system, "b")
        moved = send([{"type": "text", "text": "s" * 6000}], "c")  # no breakpoint: nothing read or written
        changed = send([{**system[0], "text": "S" + "s" * 5999}], "d")  # one byte differs
    assert written.cache_creation_input_tokens > 2000 and written.cache_read_input_tokens == 0
    assert read.cache_read_input_tokens == written.cache_creation_input_tokens and read.cache_creation_input_tokens == 0
    assert moved.cache_read_input_tokens == moved.cache_creation_input_tokens == 0
    assert changed.cache_read_input_tokens == 0 and changed.cache_creation_input_tokens > 2000


def test_anthropic_usage_split_by_cache_ttl_is_counted_as_cache_writes():
    """The API reports writes per TTL (cache_creation.ephemeral_5m_input_tokens); LangChain then zeroes the
    undivided figure, and the writes must still be priced as writes."""
    with AnthropicFake(models={"claude-fake": AnthropicModel(WINDOW)}) as fake:
        model = chat_model_for("anthropic:claude-fake", base_url=fake.url, max_output_tokens=100)
        reply = invoke_model(model, with_breakpoints([SystemMessage("s" * 6000), HumanMessage("a")], 2), attempts=1)
    usage = usage_of(reply)
    assert usage is not None
    reported = fake.usages[0]
    assert usage.cache_write_tokens == reported["cache_creation_input_tokens"] > 0
    assert usage.input_tokens == reported["input_tokens"] + usage.cache_write_tokens


# -- context management and breakpoints, without a server ---------------------------------------------------
def test_breakpoints_mark_system_task_previous_end_and_newest_and_never_more_than_four():
    messages: list[Any] = [SystemMessage("s"), HumanMessage("task")]
    assert breakpoint_positions(messages, 2) == [0, 1]
    for i in range(3):
        messages += [AIMessage("", tool_calls=[{"name": "check", "args": {}, "id": f"c{i}"}]),
                     ToolMessage("ok", tool_call_id=f"c{i}")]
    assert breakpoint_positions(messages, 2) == [0, 1, 5, 7]


def test_context_keeps_the_best_and_newest_candidates_and_shortens_the_oldest_first():
    messages: list[Any] = [SystemMessage("system"), HumanMessage("task")]
    candidates = []
    for i in range(8):
        messages += [AIMessage("", tool_calls=[{"name": "check", "args": {"source": candidate(i)}, "id": f"c{i}"}]),
                     ToolMessage("check: done", tool_call_id=f"c{i}", name="check")]
        verdict = "correct" if i != 3 else "output_mismatch"
        candidates.append({"index": i, "path": f"candidates/{i:03d}.py", "tool": "check", "tool_call_id": f"c{i}",
                           "message_id": None, "verdict": verdict, "speedup": 3.0 if i == BEST_TURN else 1.1})
    assert best_and_newest(candidates) == {"c7", f"c{BEST_TURN}"}
    full = prepare(messages, candidates, ContextPolicy(window=None), ContextState())
    assert not full.newly_shortened and full.messages == messages
    tight = prepare(messages, candidates, ContextPolicy(window=full.estimate, share=0.6), ContextState())
    assert tight.newly_shortened[:2] == ["c0", "c1"] and f"c{BEST_TURN}" not in tight.newly_shortened
    assert "c7" not in tight.newly_shortened and tight.estimate <= 0.6 * full.estimate and not tight.overflow
    sources = {c["id"]: c["args"]["source"] for m in tight.messages if isinstance(m, AIMessage) for c in m.tool_calls}
    assert sources["c7"] == candidate(7) and sources[f"c{BEST_TURN}"] == candidate(BEST_TURN)
    assert sources["c0"].startswith("[candidate 0 (candidates/000.py,") and "recall(candidate=0)" in sources["c0"]
    assert messages[2].tool_calls[0]["args"]["source"] == candidate(0)  # the state's messages are untouched
    # the next turn sends the same shortened bytes without shortening again (the prefix stays cacheable)
    again = prepare(messages, candidates, ContextPolicy(window=full.estimate, share=0.6), tight.state)
    assert not again.newly_shortened and again.messages == tight.messages
    # a window nothing can fit is an overflow, not a request
    assert prepare(messages, candidates, ContextPolicy(window=500), ContextState()).overflow


def test_recall_returns_an_old_candidate_whole(tmp_path):
    problem = get(load_suite(), "all_reduce")
    ctx = ToolContext(problem=problem, settings=ToolSettings(2, "cpu", "small"), config=EvalConfig(trials=2),
                      workdir=tmp_path)
    (tmp_path / "candidates").mkdir()
    (tmp_path / "candidates" / f"{RECALLED:03d}.py").write_text(candidate(RECALLED))
    (tmp_path / "candidates" / f"{RECALLED:03d}.json").write_text(json.dumps(
        {"tool": "bench", "data": {"verdict": "correct", "speedup": 1.02}}))
    outcome = run_tool("recall", {"candidate": RECALLED}, ctx)
    assert candidate(RECALLED).rstrip() in outcome.text and "bench, verdict correct, speedup 1.02x" in outcome.text
    assert "no candidate 9" in run_tool("recall", {"candidate": 9}, ctx).text


def test_reasoning_settings_map_per_provider_and_contradictions_fail_before_any_request():
    table = load_model_table()
    env = {"OPENAI_API_KEY": "k", "ANTHROPIC_API_KEY": "k"}
    gpt = chat_model_for("openai:gpt-5.5", reasoning=ReasoningConfig("high"), max_output_tokens=1000, env=env)
    assert isinstance(gpt, ChatOpenAI)
    assert gpt.reasoning_effort == "high" and gpt.max_tokens == 1000 and gpt.temperature is None
    opus = chat_model_for("anthropic:claude-opus-4-8", reasoning=ReasoningConfig("xhigh"), env=env)
    assert isinstance(opus, ChatAnthropic)
    assert opus.thinking == {"type": "adaptive", "display": "summarized"} and opus.output_config == {"effort": "xhigh"}
    haiku = chat_model_for("anthropic:claude-haiku-4-5", reasoning=ReasoningConfig(thinking_budget=10_000),
                           env=env)
    assert isinstance(haiku, ChatAnthropic)
    assert haiku.thinking == {"type": "enabled", "budget_tokens": 10_000}
    assert haiku.max_tokens is not None and haiku.max_tokens > 10_000
    for spec, kwargs, words in (
            ("openai:gpt-5.5", {"temperature": 0.3}, "refuses a temperature"),
            ("openai:gpt-5.5", {"reasoning": ReasoningConfig("ultra")}, "takes --reasoning-effort"),
            ("openai:gpt-5.5", {"reasoning": ReasoningConfig(thinking_budget=2048)}, "Anthropic's"),
            ("anthropic:claude-opus-4-8", {"reasoning": ReasoningConfig(thinking_budget=4096)}, "no token budget"),
            ("anthropic:claude-haiku-4-5", {"reasoning": ReasoningConfig("low"), "temperature": 0.5}, "temperature"),
            ("anthropic:claude-haiku-4-5", {"reasoning": ReasoningConfig(thinking_budget=8000),
                                            "max_output_tokens": 4000}, "must exceed")):
        with pytest.raises(ProviderError, match=words):
            chat_model_for(spec, env=env, models=table, **kwargs)


def test_usage_counts_reasoning_tokens_and_prices_them_as_output():
    reply = AIMessage("x", usage_metadata={"input_tokens": 100, "output_tokens": 50, "total_tokens": 150,
                                           "output_token_details": {"reasoning": 30}})
    usage = usage_of(reply)
    assert usage == Usage(100, 50, reasoning_tokens=30)
    price = load_price_table().price("openai:gpt-5.5")
    assert price is not None and price.cost(usage) == pytest.approx((100 * price.input + 50 * price.output) / 1e6)


@pytest.mark.parametrize("args, words", [
    (["--model", "openai:gpt-5.5", "--temperature", "0.2"], "refuses a temperature"),
    (["--model", "anthropic:claude-opus-4-8", "--thinking-budget", "4096"], "no token budget"),
    (["--model", "anthropic:claude-haiku-4-5", "--reasoning-effort", "low", "--max-reply-tokens", "2000"],
     "must exceed"),
    (["--model", "openai:gpt-5.5", "--context-share", "1.5"], "--context-share"),
])
def test_pkb_run_refuses_settings_the_model_would_refuse_before_anything_runs(tmp_path, capsys, args, words):
    code = pkb(["run", *args, "--problems", "all_reduce", "--runs-dir", str(tmp_path), "--run-id", "refused"])
    assert code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()
