"""The model's tool arguments are hostile input (issue 45, class 9): bounded in size and nesting with a
one-line refusal, read in linear time, and a bad argument is the model's error, never the tool's. Each
test here failed before the fix (tests/exploits/README.md lists them with the judge's exploits).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage

from agent.tool_calls import REFUSED, bound_reply, invalid_call_answer, within_wall
from harness.config import EvalConfig, Limits, TimingConfig
from harness.launch.sandbox import probe
from harness.problems.registry import get, load_suite
from prompts.pkb_generator import first_block
from prompts.replies import extract_code
from tests.agent_support import run_samples, scripted
from tools.base import MAX_ARGUMENT_DEPTH, MAX_SOURCE_BYTES, ToolContext, ToolSettings, source_arg, strip_fence
from tools.dispatch import run_tool

HUGE = 48 << 20  # the source an agent once accepted, judged and wrote four times (a 433 MiB run folder)
# The pattern source_arg used: backtracks quadratically on a long blank run inside an unclosed fence.
OLD_FENCE = re.compile(r"^\s*(`{3,}|~{3,})[^\n]*\n(.*?)\n\s*\1\s*$", re.DOTALL)
# PKB's rule for a reply's code (prompts.pkb_generator.first_block), as PKB's generator writes it.
PKB_BLOCKS = (re.compile(r"```python\s*\n(.*?)```", re.DOTALL), re.compile(r"```\s*\n(.*?)```", re.DOTALL))


def pkb_first_block(reply: str) -> str:
    text = reply.strip()
    for pattern in PKB_BLOCKS:
        found = pattern.search(text)
        if found:
            return found.group(1).strip()
    return text


@pytest.fixture(scope="module")
def all_reduce():
    return get(load_suite(), "all_reduce")


def context(problem, workdir: Path) -> ToolContext:
    return ToolContext(problem=problem, settings=ToolSettings(2, "cpu", "small"),
                       config=EvalConfig(trials=2, timing=TimingConfig.for_device("cpu")), workdir=workdir)


def refused(outcome) -> bool:
    """The model's error: named as bad arguments, with no verdict, nothing saved, no retry invited."""
    return (outcome.data.get("error") == "bad_arguments" and "verdict" not in outcome.data
            and outcome.candidate is None and "again" not in outcome.text and "infra" not in outcome.text)


def test_a_48_mib_source_is_refused_in_one_line_naming_the_limit(all_reduce, tmp_path):
    for tool in ("compile", "check", "submit"):
        outcome = run_tool(tool, {"source": "x = 1\n" * (HUGE // 6)}, context(all_reduce, tmp_path))
        assert refused(outcome), tool
        assert len(outcome.text.splitlines()) == 1 and f"{MAX_SOURCE_BYTES:,} bytes" in outcome.text
    assert not (tmp_path / "candidates").exists() and not (tmp_path / "final.py").exists()
    # just under the limit is still a candidate
    fine = run_tool("submit", {"source": "x = 1\n" * (MAX_SOURCE_BYTES // 6 - 1)}, context(all_reduce, tmp_path))
    assert fine.candidate is not None and fine.ends_sample


def test_arguments_nested_deeper_than_a_tool_takes_are_refused(all_reduce, tmp_path):
    deep: object = "x"
    for _ in range(100_000):  # deeper than a recursive walk survives
        deep = [deep]
    outcome = run_tool("guide", {"topic": "barriers", "extra": deep}, context(all_reduce, tmp_path))
    assert refused(outcome) and f"more than {MAX_ARGUMENT_DEPTH} deep" in outcome.text
    many = run_tool("guide", {"topic": ["t"] * 2_000_000}, context(all_reduce, tmp_path))
    assert refused(many) and "in all" in many.text


@pytest.mark.timeout(60)  # the old pattern took minutes on this source, in the agent's own process
def test_a_400_kb_source_with_an_unclosed_fence_is_read_in_one_pass():
    source = "```python\nimport torch\n" + "\n \n" * 130_000 + "def solution(x):\n    return x\n"
    assert len(source) > 390_000
    assert source_arg({"source": source}) == source  # no closing fence: taken as it is
    reply = "Here it is.\n\n" + source  # the same text as a reply: the last (unclosed) python block
    code = extract_code(reply)
    assert code is not None and code.startswith("import torch") and code.endswith("return x\n")
    # PKB's rule (--prompt pkb) on a reply whose unclosed fence is followed by a long blank run
    assert first_block("```python" + " \n" * 200_000 + "x = 1") == "```python" + " \n" * 200_000 + "x = 1"


def test_the_one_pass_fence_rule_is_the_old_patterns_rule():
    """The new scan agrees with the old pattern on every short text (where the pattern is quick)."""
    rng = random.Random(7)
    pieces = ["```", "````", "`", "~~~", "~~~~", "\n", "\n\n", " ", "\t", "\x0b", "x", "python"]
    for _ in range(50_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 9)))
        found = OLD_FENCE.match(text)
        assert strip_fence(text) == (found.group(2) if found else None), repr(text)
    assert source_arg({"source": "```python\ndef solution(x):\n    return x\n```\n"}) == \
        "def solution(x):\n    return x\n"
    for _ in range(50_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 9)))
        assert first_block(text) == pkb_first_block(text), repr(text)


def test_a_malformed_quote_in_a_harness_command_is_the_models_error(all_reduce, tmp_path):
    outcome = run_tool("bash", {"command": "pkb-check 'solution.py"}, context(all_reduce, tmp_path))
    assert refused(outcome) and "No closing quotation" in outcome.text  # was infra_error, "call the tool again"


def test_a_reply_over_the_limits_never_reaches_the_state():
    huge = "y" * (MAX_SOURCE_BYTES + 1)
    reply = AIMessage(content=[{"type": "text", "text": "trying"},
                               {"type": "tool_use", "id": "c1", "name": "check", "input": {"source": huge}},
                               {"type": "tool_use", "id": "c2", "name": "guide", "input": {"topic": "memory"}}],
                      tool_calls=[{"name": "check", "args": {"source": huge}, "id": "c1", "type": "tool_call"},
                                  {"name": "guide", "args": {"topic": "memory"}, "id": "c2", "type": "tool_call"}],
                      invalid_tool_calls=[{"name": "bench", "args": "{" * 100_000, "id": "c3", "error": "bad JSON",
                                           "type": "invalid_tool_call"}])
    kept = bound_reply(reply)
    assert [c["id"] for c in kept.tool_calls] == ["c2"]  # the call within the limits still runs
    assert len(json.dumps(kept.model_dump(), default=str)) < 10_000
    refusal = next(b for b in kept.invalid_tool_calls if b["id"] == "c1")
    assert str(refusal["error"]).startswith(REFUSED)
    answer = invalid_call_answer(dict(refusal))
    assert answer.startswith("error: check: `source` is") and f"{MAX_SOURCE_BYTES:,} bytes" in answer
    assert "could not be parsed" in invalid_call_answer(dict(next(b for b in kept.invalid_tool_calls
                                                                  if b["id"] == "c3")))
    assert bound_reply(AIMessage(content="fine")) .content == "fine"


def test_a_48_mib_tool_call_leaves_a_small_run_folder(tmp_path):
    model = scripted([("tool", "compile", {"source": "x = 1\n" * (HUGE // 6)}), ("text", "done")])
    runner, summary = run_samples(tmp_path, [model], conditions=["agent:compile"])
    folder = runner.run_dir.path / "samples" / "all_reduce" / "agent:compile" / "0"
    record = json.loads((folder / "sample.json").read_text())
    assert summary.complete and record["candidates"] == 0 and record["tool_calls"] == {}
    answer = json.loads((folder / "transcript.json").read_text())[3]
    assert answer["role"] == "tool" and f"{MAX_SOURCE_BYTES:,} bytes" in answer["content"]
    size = sum(p.stat().st_size for p in runner.run_dir.path.rglob("*") if p.is_file())
    assert size < 8 << 20  # was 433 MiB: the source in the candidate, its record, the transcript, the checkpoints


def test_every_phase_of_a_tool_evaluation_fits_the_wall_left():
    config = EvalConfig(limits=Limits(compile_s=180, check_s=120, reference_s=900))
    cut = within_wall(config, 30.0)
    assert cut.limits.compile_s == cut.limits.check_s == cut.limits.reference_s == cut.limits.time_s == 30.0
    assert cut.limits.grace_s == config.limits.grace_s and within_wall(config, None) is config


@pytest.mark.skipif(probe().backend != "bwrap", reason="the shell runs only in the bubblewrap sandbox")
def test_a_shell_command_is_stopped_when_the_wall_budget_runs_out(tmp_path):
    from agent.budgets import MAX_WALL, Budget

    model = scripted([("tool", "bash", {"command": "sleep 100"}), ("text", "done")])
    runner, _ = run_samples(tmp_path, [model], conditions=["bash"], shell_timeout_s=120.0,
                            budget=Budget(max_wall_s=3.0))
    folder = runner.run_dir.path / "samples" / "all_reduce" / "bash" / "0"
    record = json.loads((folder / "sample.json").read_text())
    answer = json.loads((folder / "transcript.json").read_text())[3]
    killed = re.search(r"killed after (\d+) s", answer["content"])
    assert killed is not None and int(killed.group(1)) <= 3  # not the command's own 120 s
    assert record["stop_reason"] == MAX_WALL
