"""Budgets inside a request (issue 44, part 3): the reply limit of every request is capped by what the token
and dollar budgets leave, a prompt that alone would overrun is never sent, and every stop reason is one
of agent.stop_reasons. The model answers at length (agent.scripted.LongAnswerChatModel), honouring
max_tokens as a server does: before the fix it took every budget over by a whole answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from agent.budgets import MAX_COST, MAX_INPUT_TOKENS, MAX_OUTPUT_TOKENS, Budget, BudgetTracker, Spent
from agent.model_table import ModelInfo
from agent.reasoning import least_reply, reply_limit
from agent.scripted import LongAnswerChatModel
from agent.stop_reasons import StopReason, checked
from agent.usage import Price, PriceTable
from tests.agent_support import SCRIPTED, run_samples

CONDITION = "agent:guide"  # the cheapest tool: each turn costs no evaluation


def long_model(answer_tokens: int) -> LongAnswerChatModel:
    return LongAnswerChatModel(answer_tokens=answer_tokens, tool="guide", args={})


def sample(run_dir: Path) -> dict[str, Any]:
    folder = run_dir / "samples" / "all_reduce" / CONDITION / "0"
    return dict(json.loads((folder / "sample.json").read_text()))


def test_a_small_output_token_budget_caps_each_request_and_is_never_exceeded(tmp_path):
    model = long_model(2_000)
    runner, summary = run_samples(tmp_path, [model], conditions=[CONDITION],
                                  budget=Budget(max_output_tokens=5_000, max_turns=None))
    record = sample(runner.run_dir.path)
    assert summary.complete and record["stop_reason"] == MAX_OUTPUT_TOKENS
    assert record["usage"]["output_tokens"] == 5_000 and record["turns"] == 3  # was 6,000
    # each request may write only what is left: 5000, then 3000, then 1000 (the last answer cut short)
    assert model.limits == [5_000, 3_000, 1_000]


def test_a_small_input_token_budget_never_sends_a_prompt_that_would_overrun_it(tmp_path):
    # every answer stays in the history, so each prompt is ~2000 tokens longer than the last
    model = long_model(2_000)
    runner, _ = run_samples(tmp_path, [model], conditions=[CONDITION],
                            budget=Budget(max_input_tokens=30_000, max_turns=None))
    record = sample(runner.run_dir.path)
    assert record["stop_reason"] == MAX_INPUT_TOKENS and record["turns"] >= 2
    assert record["usage"]["input_tokens"] <= 30_000  # was 40,000+: the last prompt was sent anyway


def test_a_dollar_budget_caps_each_reply_and_is_never_exceeded(tmp_path):
    prices = PriceTable.from_dict({"version": "test", "currency": "USD", "per_million_tokens": {
        SCRIPTED: {"input": 1.0, "output": 10.0}}}, "test")
    model = long_model(3_000)  # $0.03 of output a reply, and a few thousandths for the prompt
    runner, _ = run_samples(tmp_path, [model], conditions=[CONDITION], prices=prices,
                            budget=Budget(max_cost_usd=0.1, max_turns=None))
    record = sample(runner.run_dir.path)
    assert record["stop_reason"] == MAX_COST and record["usage"]["cost_known"]
    assert record["usage"]["cost_usd"] <= 0.1
    assert model.limits[0] is not None and model.limits[-1] is not None and model.limits[-1] < 3_000


def test_the_request_limit_names_the_budget_that_stops_it():
    price = Price(input=1.0, output=10.0)  # dollars per million tokens
    tracker = BudgetTracker(Budget(max_cost_usd=1.0, max_output_tokens=50_000),
                            Spent(cost_usd=0.5, output_tokens=10_000))
    limit = tracker.before_request(100_000, price)  # the prompt costs $0.10; $0.40 left buys 40,000 tokens
    assert limit.stop is None and limit.max_tokens == 40_000
    assert tracker.before_request(600_000, price).stop == MAX_COST  # the prompt alone costs $0.60
    assert tracker.before_request(100_000, price, least_reply=40_001).stop == MAX_COST
    assert tracker.before_request(100_000, None).max_tokens == 40_000  # unpriced: only the token budget
    assert BudgetTracker(Budget(max_input_tokens=1_000), Spent(input_tokens=900)).before_request(101, None).stop \
        == MAX_INPUT_TOKENS
    assert BudgetTracker(Budget()).before_request(10**9, price).max_tokens is None  # no budget: no cap


def test_the_reply_limit_goes_out_under_each_providers_name():
    from langchain_anthropic import ChatAnthropic
    from langchain_openai import ChatOpenAI

    messages = [HumanMessage(content="hi")]
    compatible = ChatOpenAI(model="local", api_key="x", base_url="http://localhost:1", max_completion_tokens=8_000)
    payload = compatible._get_request_payload(messages, **reply_limit("openai", None, compatible, 1_234))
    assert payload["max_completion_tokens"] == 1_234 and payload["extra_body"] == {"max_tokens": 1_234}
    reasoner = ChatOpenAI(model="gpt-5", api_key="x")
    payload = reasoner._get_request_payload(messages, **reply_limit(
        "openai", ModelInfo(reasoning="effort"), reasoner, 99_999))
    assert payload["max_completion_tokens"] == 99_999 and "extra_body" not in payload and "max_tokens" not in payload
    # never above the model's own limit
    assert reply_limit("openai", None, compatible, 50_000)["max_tokens"] == 8_000
    thinking = ChatAnthropic(model="claude-sonnet-4-5", api_key="x", max_tokens=20_000,
                             thinking={"type": "enabled", "budget_tokens": 4_096})
    assert least_reply(thinking) == 4_097 and least_reply(compatible) == 1
    payload = thinking._get_request_payload(messages, **reply_limit("anthropic", None, thinking, 5_000))
    assert payload["max_tokens"] == 5_000


def test_stop_reasons_are_one_closed_list():
    assert checked("no_code") == "no_code" and checked(StopReason.MAX_WALL) == "max_wall" and checked(None) is None
    assert type(checked(StopReason.MAX_WALL)) is str  # plain strings in the state and the records
    with pytest.raises(ValueError, match="unknown stop reason 'budget_exceeded'"):
        checked("budget_exceeded")
    # the names the graph and the budgets export are members of the list
    from agent import budgets, graph
    for name in ("SUBMITTED", "MODEL_ENDED", "NO_CODE", "ZERO_SHOT", "MODEL_ERROR", "REPLAYED", "CONTEXT_OVERFLOW"):
        assert StopReason(getattr(graph, name))
    for name in ("MAX_TURNS", "MAX_INPUT_TOKENS", "MAX_OUTPUT_TOKENS", "MAX_COST", "MAX_WALL", "MAX_GPU"):
        assert StopReason(getattr(budgets, name))
