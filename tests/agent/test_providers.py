"""Model providers, offline: real SDK clients against local HTTP servers on 127.0.0.1 that speak the
OpenAI chat-completions and the Anthropic messages wire formats; retries, errors, usage, cost; the
scripted model."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from structlog.testing import capture_logs

from agent.providers import ModelSpec, ProviderError, parse_model_spec
from agent.retry import invoke_model
from agent.scripted import ScriptedChatModel, ScriptExhausted, register_script, script_from_steps
from agent.usage import PriceTable, PriceTableError, Usage, load_price_table, usage_of
from tests.agent_support import chat_model_for

# ---------------------------------------------------------------------------------------------------
# Local servers


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class FakeServer:
    """Answers each POST with the next scripted Reply (418 once they run out) and records the request."""

    replies: list[Reply]
    requests: list[dict[str, Any]] = field(default_factory=list)
    httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.httpd is not None
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def hits(self) -> int:
        return len(self.requests)

    def start(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.requests.append(
                    {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                     "json": json.loads(body or b"{}")}
                )
                reply = server.replies.pop(0) if server.replies else Reply(418, {"error": "script ran out"})
                time.sleep(reply.delay_s)
                payload = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (the timeout test)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., FakeServer]]:
    servers: list[FakeServer] = []

    def start(*replies: Reply) -> FakeServer:
        server = FakeServer(list(replies))
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # No real key, base URL or proxy from the machine leaks into these tests.
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE", "ANTHROPIC_BASE_URL",
                 "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------------
# Wire formats


def openai_reply(*, text: str | None = None, tool: tuple[str, str, dict] | None = None,
                 usage: tuple[int, int, int] = (0, 0, 0)) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool:
        call_id, name, args = tool
        message["tool_calls"] = [{"id": call_id, "type": "function",
                                  "function": {"name": name, "arguments": json.dumps(args)}}]
    prompt, completion, cached = usage
    return Reply(200, {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1764400000, "model": "gpt-5.4",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool else "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}},
    })


def anthropic_reply(*, text: str | None = None, tool: tuple[str, str, dict] | None = None,
                    usage: tuple[int, int, int, int] = (0, 0, 0, 0)) -> Reply:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    if tool:
        tool_id, name, args = tool
        content.append({"type": "tool_use", "id": tool_id, "name": name, "input": args})
    fresh, output, cache_read, cache_write = usage
    return Reply(200, {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-5", "content": content,
        "stop_reason": "tool_use" if tool else "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": fresh, "output_tokens": output, "cache_read_input_tokens": cache_read,
                  "cache_creation_input_tokens": cache_write},
    })


def error_reply(wire: str, status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    if wire == "openai":
        body: dict[str, Any] = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
    else:
        body = {"type": "error", "error": {"type": "api_error", "message": message}}
    return Reply(status, body, headers or {})


def ok_reply(wire: str) -> Reply:
    if wire == "openai":
        return openai_reply(text="ok", usage=(5, 1, 0))
    return anthropic_reply(text="ok", usage=(5, 1, 0, 0))


def model_for(wire: str, server_url: str, **kwargs: Any) -> Any:
    if wire == "openai":
        return chat_model_for("openai:gpt-5.4", base_url=server_url + "/v1", env={"OPENAI_API_KEY": "sk-test"},
                              **kwargs)
    return chat_model_for("anthropic:claude-sonnet-5", base_url=server_url, env={"ANTHROPIC_API_KEY": "sk-ant-test"},
                          **kwargs)


@tool
def check(code: str) -> str:
    """Compile the candidate and check it against the reference on every rank."""
    return "correct"


PROMPT = [SystemMessage("You write kernels."), HumanMessage("Write all_reduce.")]
CODE = "def solution(x):\n    return x\n"


class Sleeps(list):
    """An injected sleep that records the waits instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


# ---------------------------------------------------------------------------------------------------
# Model strings and keys


def test_model_strings_parse():
    assert parse_model_spec("openai:gpt-5.4") == ModelSpec("openai", "gpt-5.4")
    assert parse_model_spec(" Anthropic:claude-sonnet-5 ").text == "anthropic:claude-sonnet-5"
    assert parse_model_spec("openai:org/model:free").name == "org/model:free"  # only the first colon splits
    assert parse_model_spec("replay:runs/old/solutions") == ModelSpec("replay", "runs/old/solutions")
    assert not parse_model_spec("replay:d").is_chat_model
    assert parse_model_spec("scripted:smoke").is_chat_model


@pytest.mark.parametrize("text", ["gemini:pro", "gpt-5.4", "", "openai:", "anthropic:  "])
def test_bad_model_string_is_one_clear_line(text):
    with pytest.raises(ProviderError) as info:
        parse_model_spec(text)
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert repr(text) in message and "openai:MODEL" in message and "anthropic:MODEL" in message


def test_missing_api_key_names_the_variable():
    with pytest.raises(ProviderError, match="OPENAI_API_KEY"):
        chat_model_for("openai:gpt-5.4", env={})
    with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY"):
        chat_model_for("anthropic:claude-sonnet-5", env={})
    with pytest.raises(ProviderError, match="TOGETHER_API_KEY"):  # named explicitly: required even with a base URL
        chat_model_for("openai:meta/llama", base_url="https://api.together.xyz/v1", api_key_env="TOGETHER_API_KEY",
                       env={"OPENAI_API_KEY": "sk-wrong-vendor"})
    # A local server (base URL, no key variable named) gets a placeholder key.
    assert chat_model_for("openai:Qwen/Qwen3-Coder", base_url="http://127.0.0.1:8000/v1", env={}) is not None


def test_bad_base_url_and_replay_have_clear_errors():
    with pytest.raises(ProviderError, match="http:// or https://"):
        chat_model_for("openai:m", base_url="localhost:8000", env={"OPENAI_API_KEY": "k"})
    with pytest.raises(ProviderError, match="replay"):
        chat_model_for("replay:some/dir")


# ---------------------------------------------------------------------------------------------------
# Full tool-calling exchanges over each wire format


def test_openai_tool_calling_exchange_records_usage_and_cost(serve):
    server = serve(
        openai_reply(tool=("call_abc", "check", {"code": CODE}), usage=(1200, 80, 1000)),
        openai_reply(text="The kernel is correct; submitting.", usage=(1400, 30, 1200)),
    )
    model = chat_model_for("openai:gpt-5.4", base_url=server.url + "/v1", env={"OPENAI_API_KEY": "sk-test"})
    bound = model.bind_tools([check])

    first = invoke_model(bound, PROMPT, sleep=Sleeps())
    assert first.tool_calls == [{"name": "check", "args": {"code": CODE}, "id": "call_abc", "type": "tool_call"}]
    answer = ToolMessage(content="verdict: correct", tool_call_id=first.tool_calls[0]["id"])
    final = invoke_model(bound, [*PROMPT, first, answer], sleep=Sleeps())
    assert final.content == "The kernel is correct; submitting." and not final.tool_calls

    assert server.hits == 2
    sent1, sent2 = (r["json"] for r in server.requests)
    assert {r["path"] for r in server.requests} == {"/v1/chat/completions"}
    assert server.requests[0]["headers"]["authorization"] == "Bearer sk-test"
    assert [t["function"]["name"] for t in sent1["tools"]] == ["check"]
    assert sent1["tools"][0]["function"]["parameters"]["required"] == ["code"]
    assert sent1["model"] == "gpt-5.4" and "temperature" not in sent1
    assert sent2["messages"][-2]["tool_calls"][0]["id"] == "call_abc"
    assert sent2["messages"][-1] == {"role": "tool", "tool_call_id": "call_abc", "content": "verdict: correct"}

    usages = [usage_of(first), usage_of(final)]
    assert usages[0] == Usage(input_tokens=1200, output_tokens=80, cache_read_tokens=1000)
    assert usages[0] is not None and usages[1] is not None
    total = usages[0] + usages[1]
    assert total == Usage(input_tokens=2600, output_tokens=110, cache_read_tokens=2200)
    # gpt-5.4: $2.50 input, $0.25 cached input, $15 output per million tokens.
    expected = (400 * 2.5 + 2200 * 0.25 + 110 * 15.0) / 1e6
    assert load_price_table().cost("openai:gpt-5.4", total) == pytest.approx(expected)


def test_anthropic_tool_calling_exchange_records_usage_and_cost(serve):
    server = serve(
        anthropic_reply(text="Let me check it.", tool=("toolu_01", "check", {"code": CODE}), usage=(50, 90, 1000, 200)),
        anthropic_reply(text="Correct; submitting.", usage=(70, 25, 1200, 0)),
    )
    model = chat_model_for("anthropic:claude-sonnet-5", base_url=server.url, max_output_tokens=2048,
                           env={"ANTHROPIC_API_KEY": "sk-ant-test"})
    bound = model.bind_tools([check])

    first = invoke_model(bound, PROMPT, sleep=Sleeps())
    assert first.tool_calls == [{"name": "check", "args": {"code": CODE}, "id": "toolu_01", "type": "tool_call"}]
    answer = ToolMessage(content="verdict: correct", tool_call_id="toolu_01")
    final = invoke_model(bound, [*PROMPT, first, answer], sleep=Sleeps())
    assert final.text == "Correct; submitting." and not final.tool_calls

    assert server.hits == 2
    sent1, sent2 = (r["json"] for r in server.requests)
    assert {r["path"] for r in server.requests} == {"/v1/messages"}
    headers = server.requests[0]["headers"]
    assert "sk-ant-test" in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))
    assert [t["name"] for t in sent1["tools"]] == ["check"]
    assert sent1["tools"][0]["input_schema"]["required"] == ["code"]
    assert sent1["max_tokens"] == 2048 and sent1["system"]
    assert any(block.get("type") == "tool_use" and block["id"] == "toolu_01"
               for block in sent2["messages"][-2]["content"])
    result = sent2["messages"][-1]
    assert result["role"] == "user"
    assert result["content"][0]["type"] == "tool_result" and result["content"][0]["tool_use_id"] == "toolu_01"

    # LangChain folds cache reads and writes into input_tokens; Usage keeps them apart for pricing.
    assert usage_of(first) == Usage(input_tokens=1250, output_tokens=90, cache_read_tokens=1000,
                                    cache_write_tokens=200)
    first_usage, final_usage = usage_of(first), usage_of(final)
    assert first_usage is not None and final_usage is not None
    total = first_usage + final_usage
    # claude-sonnet-5: $2 input, $0.20 cache read, $2.50 cache write, $10 output per million tokens.
    expected = (120 * 2.0 + 2200 * 0.2 + 200 * 2.5 + 115 * 10.0) / 1e6
    assert load_price_table().cost("anthropic:claude-sonnet-5", total) == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------------
# Retries: 429 and 5xx and lost connections only, bounded, logged; SDK retries off


WIRES = ["openai", "anthropic"]


@pytest.mark.parametrize("wire", WIRES)
def test_rate_limit_then_success_is_retried_and_logged(serve, wire):
    server = serve(error_reply(wire, 429, "slow down"), ok_reply(wire))
    sleeps = Sleeps()
    with capture_logs() as logs:
        reply = invoke_model(model_for(wire, server.url), PROMPT, initial_wait_s=0.001, sleep=sleeps)
    assert reply.text == "ok"
    assert server.hits == 2 and len(sleeps) == 1
    retry_events = [e for e in logs if e["event"] == "model_retry"]
    assert len(retry_events) == 1
    event = retry_events[0]
    assert event["status"] == 429 and event["attempt"] == 1 and "slow down" in event["error"]


@pytest.mark.parametrize("wire", WIRES)
def test_server_errors_are_retried(serve, wire):
    overloaded = 529 if wire == "anthropic" else 503
    server = serve(error_reply(wire, 500, "boom"), error_reply(wire, overloaded, "overloaded"), ok_reply(wire))
    sleeps = Sleeps()
    assert invoke_model(model_for(wire, server.url), PROMPT, initial_wait_s=0.001, sleep=sleeps).text == "ok"
    assert server.hits == 3 and len(sleeps) == 2


@pytest.mark.parametrize("wire", WIRES)
def test_attempts_bound_every_hit_so_sdk_retries_do_not_stack(serve, wire):
    server = serve(*[error_reply(wire, 500, "still down")] * 10)
    with pytest.raises(ProviderError) as info:
        invoke_model(model_for(wire, server.url), PROMPT, attempts=3, initial_wait_s=0.001, sleep=Sleeps())
    assert server.hits == 3  # with the SDKs' own retries on, this would be 3 x 3
    assert info.value.kind == "server" and info.value.status == 500
    assert "HTTP 500" in str(info.value) and "after 3 attempts" in str(info.value)
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("wire", WIRES)
def test_bad_request_fails_at_once(serve, wire):
    server = serve(error_reply(wire, 400, "tools.0.name: bad\nsecond line"), ok_reply(wire))
    sleeps = Sleeps()
    with pytest.raises(ProviderError) as info:
        invoke_model(model_for(wire, server.url), PROMPT, initial_wait_s=0.001, sleep=sleeps)
    assert server.hits == 1 and sleeps == []
    assert info.value.kind == "request" and info.value.status == 400
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "HTTP 400" in message and "tools.0.name: bad" in message


def test_unauthorized_names_the_key_variable(serve):
    server = serve(error_reply("openai", 401, "invalid api key"))
    model = chat_model_for("openai:meta/llama", base_url=server.url + "/v1", api_key_env="TOGETHER_API_KEY",
                           env={"TOGETHER_API_KEY": "wrong"})
    with pytest.raises(ProviderError, match="HTTP 401.*TOGETHER_API_KEY"):
        invoke_model(model.bind_tools([check]), PROMPT, sleep=Sleeps())
    assert server.hits == 1


def test_waits_grow_exponentially_within_the_cap(serve):
    server = serve(*[error_reply("openai", 500, "down")] * 5)
    sleeps = Sleeps()
    with pytest.raises(ProviderError):
        invoke_model(model_for("openai", server.url), PROMPT, attempts=5, initial_wait_s=1.0, max_wait_s=5.0,
                     sleep=sleeps)
    assert server.hits == 5 and len(sleeps) == 4
    assert 1.0 <= sleeps[0] <= 2.0 and 2.0 <= sleeps[1] <= 3.0 and 4.0 <= sleeps[2] <= 5.0 and sleeps[3] == 5.0


def test_slow_server_is_a_timeout_after_the_retries(serve):
    server = serve(*[Reply(200, {}, delay_s=0.5)] * 2)
    with pytest.raises(ProviderError) as info:
        invoke_model(model_for("openai", server.url, timeout=0.1), PROMPT, attempts=2, initial_wait_s=0.001,
                     sleep=Sleeps())
    assert server.hits == 2 and info.value.kind == "timeout"
    assert "did not answer within the timeout after 2 attempts" in str(info.value)


def test_retry_after_header_lengthens_the_wait(serve):
    server = serve(error_reply("openai", 429, "wait", {"Retry-After": "7"}), ok_reply("openai"))
    sleeps = Sleeps()
    invoke_model(model_for("openai", server.url), PROMPT, initial_wait_s=0.001, max_wait_s=30, sleep=sleeps)
    assert sleeps == [7.0]


@pytest.mark.parametrize("wire", WIRES)
def test_unreachable_base_url_says_so_after_the_retries(wire):
    url = f"http://127.0.0.1:{closed_port()}"
    sleeps = Sleeps()
    with pytest.raises(ProviderError) as info:
        invoke_model(model_for(wire, url), PROMPT, attempts=3, initial_wait_s=0.001, sleep=sleeps)
    message = str(info.value)
    assert info.value.kind == "unreachable" and len(sleeps) == 2
    assert "unreachable after 3 attempts" in message and url in message
    assert len(message.splitlines()) == 1


# ---------------------------------------------------------------------------------------------------
# Usage and prices


def test_price_table_unknown_models_dated_snapshots_and_user_tables(tmp_path):
    table = load_price_table()
    assert table.version == "2026-11-29" and table.currency == "USD"
    assert table.cost("openai:some-unlisted-model", Usage(10, 10)) is None  # unknown, not zero
    assert table.price("anthropic:claude-sonnet-5-20261001") == table.price("anthropic:claude-sonnet-5")
    sources = json.loads(Path(table.source).read_text())["_sources"]
    assert set(sources) == set(table.prices)  # every price cites where it came from

    mine = tmp_path / "prices.json"
    mine.write_text(json.dumps({"version": "mine-1", "currency": "USD",
                                "per_million_tokens": {"openai:Qwen/Qwen3-Coder": {"input": 0.2, "output": 0.6}}}))
    own = load_price_table(mine)
    assert own.version == "mine-1" and own.source == str(mine)
    # No cache rate given: cache reads are charged at the input rate.
    assert own.cost("openai:Qwen/Qwen3-Coder", Usage(1_000_000, 1_000_000, 500_000)) == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not valid JSON"),
        ('{"version": "x", "currency": "EUR", "per_million_tokens": {}}', "must be \"USD\""),
        ('{"version": "x", "currency": "USD", "per_million_tokens": {"gpt-5": {"input": 1, "output": 2}}}',
         "provider:model"),
        ('{"version": "x", "currency": "USD", "per_million_tokens": {"openai:m": {"input": -1, "output": 2}}}',
         "openai:m: \"input\" must be a non-negative number"),
    ],
)
def test_bad_price_table_is_one_line(tmp_path, content, needle):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(PriceTableError) as info:
        load_price_table(path)
    assert needle in str(info.value) and str(path) in str(info.value)
    assert len(str(info.value).splitlines()) == 1
    with pytest.raises(PriceTableError, match="does not exist"):
        load_price_table(tmp_path / "missing.json")


def test_reply_without_usage_is_unknown_not_zero():
    assert usage_of(AIMessage(content="hi")) is None
    table = PriceTable.from_dict({"version": "t", "currency": "USD",
                                  "per_million_tokens": {"scripted:t": {"input": 1, "output": 2}}}, "test")
    assert table.cost("scripted:t", Usage(1_000_000, 500_000)) == pytest.approx(2.0)


# ---------------------------------------------------------------------------------------------------
# The scripted model


def test_scripted_model_records_bound_tools_and_replays_in_order():
    @tool
    def bench(code: str, iterations: int = 10) -> str:
        """Time the candidate against the reference."""
        return "1.3x"

    model = ScriptedChatModel(script=script_from_steps([
        ("tool", "check", {"code": CODE}),
        ("tools", [("check", {"code": CODE}), ("bench", {"code": CODE})]),
        ("text", "done"),
    ]))
    bound = model.bind_tools([check, bench])
    assert model.bound_tool_names == ["check", "bench"]
    assert model.bound_tools[1]["function"]["parameters"]["properties"]["iterations"]["default"] == 10

    first = invoke_model(bound, PROMPT)
    assert [c["name"] for c in first.tool_calls] == ["check"] and first.tool_calls[0]["id"] == "call_0"
    second = invoke_model(bound, PROMPT)
    assert [c["id"] for c in second.tool_calls] == ["call_1", "call_2"]
    third = invoke_model(bound, PROMPT)
    assert third.content == "done" and usage_of(third) == Usage(100, 20)
    assert [c["tools"][0]["function"]["name"] for c in model.calls] == ["check"] * 3  # tools sent with every call
    assert model.remaining == 0


def test_scripted_usage_is_configurable_per_model_and_per_message():
    own = AIMessage(content="x", usage_metadata={"input_tokens": 7, "output_tokens": 3, "total_tokens": 10})
    model = ScriptedChatModel(script=[own, AIMessage(content="y")], usage=None)
    assert usage_of(model.invoke(PROMPT)) == Usage(7, 3)
    assert usage_of(model.invoke(PROMPT)) is None


def test_scripted_model_running_out_is_a_clear_error():
    model = ScriptedChatModel(script=script_from_steps([("text", "only one")]), script_name="short")
    model.invoke(PROMPT)
    with pytest.raises(ScriptExhausted) as info:
        invoke_model(model, PROMPT, sleep=Sleeps())
    assert str(info.value) == "scripted model 'short' ran out: call 2 but the script has 1 replies"
    assert isinstance(info.value, ProviderError) and info.value.kind == "script"


def test_scripted_model_strings(tmp_path):
    register_script("test-smoke", [("tool", "check", {"code": CODE}), ("text", "done")])
    one, two = chat_model_for("scripted:test-smoke"), chat_model_for("scripted:test-smoke")
    assert one.invoke(PROMPT).tool_calls and two.invoke(PROMPT).tool_calls  # each model gets a fresh copy

    path = tmp_path / "script.json"
    path.write_text(json.dumps({"steps": [["text", "hello"]]}))
    assert chat_model_for(f"scripted:{path}").invoke(PROMPT).content == "hello"

    with pytest.raises(ProviderError, match="no script 'nope'.*test-smoke"):
        chat_model_for("scripted:nope")
    path.write_text(json.dumps([["speak", "hello"]]))
    with pytest.raises(ProviderError, match="script step 0"):
        chat_model_for(f"scripted:{path}")
