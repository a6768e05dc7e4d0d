"""The agent's LangGraph loop on CPU (gloo, W=2) with scripted models: tools, conditions, budgets, scoring.

Evaluations that launch ranks cost seconds on a 2-core machine, so most tests here score candidates that
fail to compile (the harness stops before any rank starts) and only the end-to-end test runs real checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage

from agent.budgets import (
    MAX_COST,
    MAX_GPU,
    MAX_INPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    MAX_TURNS,
    MAX_WALL,
    Budget,
    BudgetTracker,
)
from agent.cli import main as pkb
from agent.conditions import AGENT_TOOLS, ConditionError, parse_condition, parse_conditions
from agent.graph import SCORING_SEED_OFFSET, scoring_seed
from agent.providers import ProviderError
from agent.scripted import ScriptedChatModel
from agent.usage import PriceTable, Usage
from tests.agent_support import BROKEN, CORRECT, SCRIPTED, fenced, run_samples, scripted


def sample_files(run_dir: Path, problem: str, condition: str, k: int = 0) -> dict[str, Any]:
    folder = run_dir / "samples" / problem / condition / str(k)
    out: dict[str, Any] = {"folder": folder, "sample": json.loads((folder / "sample.json").read_text())}
    if (folder / "result.json").exists():
        out["result"] = json.loads((folder / "result.json").read_text())
    out["transcript"] = json.loads((folder / "transcript.json").read_text())
    out["candidates"] = sorted(p.name for p in (folder / "candidates").glob("*.py")) \
        if (folder / "candidates").is_dir() else []
    return out


# -- end to end ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_scripted_agent_compile_check_bench_submit_matches_pkb_eval(tmp_path, capsys):
    model = scripted([("tool", "compile", {"source": CORRECT}), ("tool", "check", {"source": CORRECT}),
                      ("tool", "bench", {"source": CORRECT}), ("tool", "submit", {"source": CORRECT})])
    runner, summary = run_samples(tmp_path, [model], conditions=["agent:bench+check+compile"])
    assert summary.complete and not summary.errors
    s = sample_files(runner.run_dir.path, "all_reduce", "agent:bench+check+compile")
    record, result = s["sample"], s["result"]
    assert record["status"] == "finished" and record["stop_reason"] == "submitted"
    assert record["turns"] == 4 and record["tool_calls"] == {"compile": 1, "check": 1, "bench": 1, "submit": 1}
    assert record["verdict"] == "correct" and record["correct"] and record["speedup"] is not None
    assert record["usage"]["input_tokens"] == 400 and record["usage"]["output_tokens"] == 80
    # every candidate kept, in order, each with the tool's record; the submitted one scored as final.py
    assert s["candidates"] == ["000.py", "001.py", "002.py", "003.py"]
    tools_seen = [json.loads((s["folder"] / "candidates" / f"00{i}.json").read_text())["tool"] for i in range(4)]
    assert tools_seen == ["compile", "check", "bench", "submit"]
    assert (s["folder"] / "final.py").read_text() == CORRECT
    check = json.loads((s["folder"] / "candidates" / "001.json").read_text())
    assert check["data"]["verdict"] == "correct" and check["data"]["result"]["seed"] == 0  # the tools' seed
    # the transcript: system, task, then assistant/tool pairs, the tool answers tied to their candidates
    roles = [m["role"] for m in s["transcript"]]
    assert roles == ["system", "user"] + ["assistant", "tool"] * 4
    tool_messages = [m for m in s["transcript"] if m["role"] == "tool"]
    assert [m["name"] for m in tool_messages] == ["compile", "check", "bench", "submit"]
    assert [m["candidate"] for m in tool_messages] == [f"candidates/00{i}.py" for i in range(4)]
    first = s["transcript"][2]
    assert first["tool_calls"][0]["name"] == "compile" and first["usage"]["input_tokens"] == 100

    # the final scoring is the full harness on a fresh seed: the same verdict as `pkb eval` of the file
    assert result["seed"] == scoring_seed(0) == SCORING_SEED_OFFSET and result["trials"] == 2
    capsys.readouterr()
    code = pkb(["eval", "--problem", "all_reduce", "--solution", str(s["folder"] / "final.py"), "--world-size", "2",
                "--trials", "2", "--json"])
    direct = json.loads(capsys.readouterr().out)
    assert code == 0 and direct["seed"] == 0
    for key in ("verdict", "correct", "flags", "problem", "world_size", "shape", "device"):
        assert result[key] == direct[key], key
    assert result["timings"] is not None and direct["timings"] is not None
    assert result["candidate"]["sha256"] == direct["candidate"]["sha256"]


# -- conditions -----------------------------------------------------------------------------------------
def test_zero_shot_is_one_call_with_no_tools_and_code_from_the_reply(tmp_path):
    models = [scripted([("text", fenced(BROKEN))]), scripted([("text", "I would rather not write code.")])]
    runner, summary = run_samples(tmp_path, models, conditions=["zero-shot"], samples=2)
    assert summary.complete
    for model in models:
        assert len(model.calls) == 1 and model.bound_tools == [] and model.calls[0]["tools"] is None
        sent = [m.type for m in model.calls[0]["messages"]]
        assert sent == ["system", "human"]
    coded = sample_files(runner.run_dir.path, "all_reduce", "zero-shot", 0)
    assert coded["sample"]["stop_reason"] == "zero_shot" and coded["sample"]["turns"] == 1
    assert coded["sample"]["verdict"] == "compile_error" and coded["result"]["verdict"] == "compile_error"
    assert coded["candidates"] == ["000.py"] and (coded["folder"] / "final.py").read_text().strip() == BROKEN.strip()
    last = coded["transcript"][-1]
    assert last["role"] == "assistant" and last["candidate"] == "candidates/000.py"
    # a reply without code is a sample outcome, not a crash
    empty = sample_files(runner.run_dir.path, "all_reduce", "zero-shot", 1)
    assert empty["sample"]["status"] == "finished" and empty["sample"]["stop_reason"] == "no_code"
    assert empty["sample"]["verdict"] == "no_code" and not empty["sample"]["correct"]
    assert "result" not in empty and empty["candidates"] == [] and not (empty["folder"] / "final.py").exists()


def test_a_tool_subset_exposes_exactly_those_tools(tmp_path):
    model = scripted([("text", "no code today")])
    runner, _ = run_samples(tmp_path, [model], conditions=["agent:check+compile"])
    assert sorted(model.bound_tool_names) == ["check", "compile", "recall", "submit"]  # recall and submit: always
    assert [t["function"]["name"] for t in model.calls[0]["tools"]] == model.bound_tool_names
    record = sample_files(runner.run_dir.path, "all_reduce", "agent:check+compile")["sample"]
    assert record["stop_reason"] == "no_code" and record["turns"] == 1


def test_every_tool_offered_to_a_plain_agent():
    condition = parse_condition("agent")
    assert condition.tools == AGENT_TOOLS and condition.bound_tools[-1] == "submit"
    assert parse_condition("agent", "compile,check").name == "agent:check+compile"
    assert parse_condition("agent:compile+check").name == "agent:check+compile"
    assert [c.name for c in parse_conditions("zero-shot,agent:bench", None)] == ["zero-shot", "agent:bench"]
    for bad, tools in (("agent:nope", None), ("zero-shot", "check"), ("agent:check", "bench"), ("agents", None),
                       ("agent:submit", None), ("agent:recall", None)):
        with pytest.raises(ConditionError):
            parse_conditions(bad, tools)


def test_an_agent_reply_with_code_and_no_tool_call_is_a_submission(tmp_path):
    model = scripted([("tool", "compile", {"source": CORRECT}), ("text", fenced(BROKEN))])
    runner, _ = run_samples(tmp_path, [model], conditions=["agent:compile"])
    s = sample_files(runner.run_dir.path, "all_reduce", "agent:compile")
    assert s["sample"]["stop_reason"] == "submitted" and s["candidates"] == ["000.py", "001.py"]
    assert s["sample"]["verdict"] == "compile_error"  # the reply's code, not the earlier candidate


def test_a_model_error_stops_the_sample_and_scores_the_last_candidate(tmp_path):
    model = scripted([("tool", "compile", {"source": BROKEN})])  # the second call finds the script exhausted
    runner, summary = run_samples(tmp_path, [model], conditions=["agent:compile"])
    s = sample_files(runner.run_dir.path, "all_reduce", "agent:compile")
    assert summary.complete
    assert s["sample"]["stop_reason"] == "model_error" and "ran out" in s["sample"]["error"]
    assert s["sample"]["verdict"] == "compile_error" and s["candidates"] == ["000.py"]


def test_a_tool_call_with_unparsable_arguments_gets_an_error_answer_and_the_loop_goes_on(tmp_path):
    garbled = AIMessage(content="", invalid_tool_calls=[
        {"name": "compile", "args": '{"source": "def solution(', "id": "bad_0", "error": "Unterminated string",
         "type": "invalid_tool_call"}])
    model = scripted([garbled, ("tool", "compile", {"source": BROKEN}), ("text", "done")])
    runner, _ = run_samples(tmp_path, [model], conditions=["agent:compile"])
    s = sample_files(runner.run_dir.path, "all_reduce", "agent:compile")
    assert s["sample"]["turns"] == 3 and s["sample"]["tool_calls"] == {"compile": 1}
    answer = s["transcript"][3]
    assert answer["role"] == "tool" and answer["tool_call_id"] == "bad_0" and "could not be parsed" in answer["content"]
    # the last candidate is scored, so the stop is model_ended, never no_code (issue 44)
    assert s["sample"]["stop_reason"] == "model_ended" and s["sample"]["verdict"] == "compile_error"


class Failing(ScriptedChatModel):
    """A model whose every call fails the way a provider does."""

    error: Any = None

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


def test_provider_outages_leave_the_sample_unfinished_and_bad_keys_end_the_run(tmp_path):
    outage = Failing(script=[], error=ProviderError("server error (HTTP 503)", kind="server", status=503))
    runner, summary = run_samples(tmp_path, [outage], conditions=["zero-shot"], run_id="outage")
    assert not summary.complete and summary.records == [] and "HTTP 503" in summary.interrupted[0]
    record = json.loads((runner.run_dir.path / "samples/all_reduce/zero-shot/0/sample.json").read_text())
    assert record["status"] == "running" and "503" in record["error"]  # --resume continues it
    bad_key = [Failing(script=[], error=ProviderError("request refused (HTTP 401)", kind="request", status=401))
               for _ in range(3)]
    runner, summary = run_samples(tmp_path, bad_key, conditions=["zero-shot"], samples=3, run_id="badkey")
    assert summary.fatal and "401" in summary.fatal and summary.records == []


# -- budgets --------------------------------------------------------------------------------------------
def test_budget_tracker_limits_and_turn_semantics():
    tracker = BudgetTracker(Budget(max_turns=2, max_wall_s=None))
    assert tracker.stop_reason(before_model_call=True) is None
    tracker.record_model_call(Usage(100, 20), 0.5)
    tracker.record_model_call(None, None)
    assert tracker.spent.turns == 2 and tracker.spent.input_tokens == 100 and not tracker.spent.cost_known
    assert tracker.stop_reason(before_model_call=False) is None  # the last turn's reply is still acted on
    assert tracker.stop_reason(before_model_call=True) == MAX_TURNS
    tracker = BudgetTracker(Budget(max_turns=None, max_wall_s=None, max_gpu_s=5))
    tracker.record_tool("check", 2.0)
    tracker.record_tool("check", 3.0)
    assert tracker.spent.tool_calls == {"check": 2} and tracker.stop_reason(before_model_call=False) == MAX_GPU
    with pytest.raises(ValueError):
        Budget(max_turns=0)


def _prices(per_reply_usd: float) -> PriceTable:
    # 20 output tokens a reply (the scripted default), priced so that one reply costs per_reply_usd; the input
    # is free (a priced prompt is checked before it is sent: test_budgets_within_a_request.py)
    return PriceTable.from_dict({"version": "test", "currency": "USD", "per_million_tokens": {
        SCRIPTED: {"input": 0.0, "output": per_reply_usd * 5e4}}}, "test")


# (budget, tool the script keeps calling, stop reason, model calls made, tool calls run)
@pytest.mark.parametrize(("budget", "tool", "reason", "turns", "tools_run"), [
    (Budget(max_turns=2), "compile", MAX_TURNS, 2, 2),  # the 2nd reply's tools still run; no 3rd call
    # the prompt alone (thousands of tokens) is over 150: the first request is never sent (issue 44)
    (Budget(max_input_tokens=150), "compile", MAX_INPUT_TOKENS, 0, 0),
    (Budget(max_output_tokens=50), "compile", MAX_OUTPUT_TOKENS, 3, 2),  # 20 output tokens per reply
    (Budget(max_cost_usd=2.5), "compile", MAX_COST, 3, 2),  # $1 per reply
    (Budget(max_wall_s=1e-6), "compile", MAX_WALL, 1, 0),
    (Budget(max_gpu_s=1e-6), "check", MAX_GPU, 1, 1),  # a check holds the device (rank slots on CPU)
])
def test_each_budget_stops_a_sample_with_its_own_reason(tmp_path, budget, tool, reason, turns, tools_run):
    model = scripted([("tool", tool, {"source": BROKEN})] * 8)
    runner, _ = run_samples(tmp_path, [model], conditions=[f"agent:{tool}"], budget=budget, prices=_prices(1.0))
    s = sample_files(runner.run_dir.path, "all_reduce", f"agent:{tool}")
    record = s["sample"]
    assert record["status"] == "finished" and record["stop_reason"] == reason
    assert record["turns"] == turns == len(model.calls)
    # a reply that spent a budget gets no tool run; the last candidate, if any, is still scored
    assert sum(record["tool_calls"].values()) == len(s["candidates"]) == tools_run
    assert record["verdict"] == ("compile_error" if tools_run else "no_code")
    if reason == MAX_COST:
        assert record["usage"]["cost_usd"] == pytest.approx(3.0) and record["usage"]["cost_known"]
    if reason == MAX_GPU:
        assert record["gpu_s"] > 0
