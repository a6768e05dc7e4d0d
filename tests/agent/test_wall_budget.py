"""The wall budget while a model request and a tool run (issue 45): a request's timeout and its retries end
with the budget, and a tool's whole evaluation, queueing included, ends by the sample's deadline.

No test asserts a time: the slow servers and evaluations here would outlast any test timeout without the
bound (the requests' own timeout is 600 s), and the timeouts sent are asserted as values.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from langchain_core.exceptions import ModelConnectionError, ModelTimeoutError
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from agent.budgets import MAX_WALL, Budget
from agent.executors.local import LocalExecutor
from agent.executors.request import EvalRequest
from agent.providers import ProviderError
from agent.retry import LEAST_TIMEOUT_S, WALL, invoke_model
from agent.rundir import RunDir
from agent.runner import RunConfig, Runner, create_run
from agent.scheduler import DeviceScheduler
from harness import cancel
from harness.config import EvalConfig, Limits, TimingConfig
from harness.problems.registry import get, load_suite
from harness.records.results import EvalResult
from tests.agent_support import BROKEN, SCRIPTED, chat_model_for, eval_config, run_samples, scripted
from tests.conftest import CANDIDATES, live_children, processes_mentioning
from tools.base import ToolContext, ToolSettings
from tools.dispatch import run_tool

PROMPT = [SystemMessage("You write kernels."), HumanMessage("Write all_reduce.")]
LONG = CANDIDATES / "computes_for_long.py"  # 200 s of work per call


# -- a model request's timeout and retries -------------------------------------------------------------
class Recorder:
    """A model that records the keyword arguments of every call, and answers or raises from `outcomes`."""

    def __init__(self, *outcomes: Any, request_timeout: float = 600.0) -> None:
        self.outcomes = list(outcomes)
        self.request_timeout = request_timeout
        self.kwargs: list[dict[str, Any]] = []

    def invoke(self, messages: Any, **kwargs: Any) -> AIMessage:
        self.kwargs.append(kwargs)
        outcome = self.outcomes.pop(0) if self.outcomes else AIMessage("ok")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class Sleeps(list):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def test_each_request_timeout_is_what_the_wall_budget_leaves() -> None:
    model = Recorder()
    invoke_model(model, PROMPT, wall_left=10.0, clock=lambda: 100.0, sleep=Sleeps())  # type: ignore[arg-type]
    assert model.kwargs == [{"timeout": 10.0}]  # not the client's 600 s
    invoke_model(model, PROMPT, wall_left=0.01, clock=lambda: 100.0, sleep=Sleeps())  # type: ignore[arg-type]
    assert model.kwargs[-1] == {"timeout": LEAST_TIMEOUT_S}  # a timeout must be positive
    invoke_model(model, PROMPT, wall_left=5000.0, clock=lambda: 100.0, sleep=Sleeps())  # type: ignore[arg-type]
    assert model.kwargs[-1] == {"timeout": 600.0}  # the client's own, where it is the shorter
    invoke_model(model, PROMPT, sleep=Sleeps())  # type: ignore[arg-type]
    assert model.kwargs[-1] == {}  # no wall budget: the request is sent as before


def test_a_timeout_the_budget_cut_is_the_budgets_stop_never_retried() -> None:
    model = Recorder(ModelTimeoutError("timed out"), AIMessage("late"))
    sleeps = Sleeps()
    with pytest.raises(ProviderError) as info:
        invoke_model(model, PROMPT, wall_left=3.0, clock=time.monotonic, sleep=sleeps,  # type: ignore[arg-type]
                     initial_wait_s=0.5)
    assert info.value.kind == WALL and "wall budget ran out" in str(info.value)
    assert len(model.kwargs) == 1 and sleeps == []  # the next attempt would start past the budget's end


def test_a_timeout_of_the_client_itself_stays_a_timeout() -> None:
    """The client's own (shorter) timeout, with the budget far away: a transient outage, as before."""
    model = Recorder(ModelTimeoutError("timed out"), request_timeout=30.0)
    with pytest.raises(ProviderError) as info:
        invoke_model(model, PROMPT, attempts=1, wall_left=1000.0, sleep=Sleeps())  # type: ignore[arg-type]
    assert info.value.kind == "timeout" and model.kwargs == [{"timeout": 30.0}]


def test_a_retry_wait_past_the_budget_ends_the_request_as_the_budgets_stop() -> None:
    now = [100.0]
    model = Recorder(ModelConnectionError("reset"), ModelConnectionError("reset"), AIMessage("ok"))
    sleeps = Sleeps()
    with pytest.raises(ProviderError) as info:  # the first wait (4 s and more) is past the 3 s left
        invoke_model(model, PROMPT, wall_left=3.0, initial_wait_s=4.0, clock=lambda: now[0],  # type: ignore[arg-type]
                     sleep=sleeps)
    assert info.value.kind == WALL and len(model.kwargs) == 1 and sleeps == []
    # with time for it, the same failure is retried as before
    model = Recorder(ModelConnectionError("reset"), AIMessage("ok"))
    assert invoke_model(model, PROMPT, wall_left=60.0, initial_wait_s=1.0, clock=lambda: now[0],  # type: ignore[arg-type]
                        sleep=sleeps).text == "ok"
    assert len(model.kwargs) == 2 and len(sleeps) == 1


@dataclass
class SlowServer:
    """Answers each POST after `delay_s`, or with `status` and `headers` at once; records whether the client
    closed the connection before the answer (the request aborted)."""

    delay_s: float = 0.0
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hits: int = 0
    aborted: int = 0
    httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.httpd is not None
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> SlowServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.hits += 1
                if server.delay_s:
                    # wait for the answer's time, or for the client to hang up (readable, and nothing to read)
                    ready, _, _ = select.select([self.connection], [], [], server.delay_s)
                    if ready and self.connection.recv(1, socket.MSG_PEEK) == b"":
                        server.aborted += 1
                        return
                body = json.dumps({"error": {"message": "slow down", "type": "rate_limit"}}).encode()
                try:
                    self.send_response(server.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    for name, value in server.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., SlowServer]]:
    servers: list[SlowServer] = []

    def start(**kwargs: Any) -> SlowServer:
        servers.append(SlowServer(**kwargs).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def chat_model(wire: str, url: str) -> Any:
    if wire == "openai":
        return chat_model_for("openai:gpt-5.4", base_url=url + "/v1", env={"OPENAI_API_KEY": "sk-test"})
    return chat_model_for("anthropic:claude-sonnet-5", base_url=url, env={"ANTHROPIC_API_KEY": "sk-ant-test"})


def wait_for(condition: Callable[[], bool]) -> bool:
    for _ in range(200):  # the server's thread sees the hang-up a moment after the client's
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_a_slow_server_is_hung_up_on_when_the_budget_ends(serve, wire) -> None:
    """The real SDK clients (their own timeout 600 s) against a server that would answer in 120 s."""
    server = serve(delay_s=120.0)
    with pytest.raises(ProviderError) as info:
        invoke_model(chat_model(wire, server.url), PROMPT, wall_left=1.0, initial_wait_s=0.01, sleep=Sleeps())
    assert info.value.kind == WALL and server.hits == 1
    assert wait_for(lambda: server.aborted == 1)  # the request was aborted, not left to run


def test_a_retry_after_past_the_budget_is_not_waited_for(serve) -> None:
    server = serve(status=429, headers={"Retry-After": "30"})
    sleeps = Sleeps()
    with pytest.raises(ProviderError) as info:
        invoke_model(chat_model("openai", server.url), PROMPT, wall_left=5.0, initial_wait_s=0.01,
                     max_wait_s=60.0, sleep=sleeps)
    assert info.value.kind == WALL and server.hits == 1 and sleeps == []


def test_a_sample_whose_request_the_budget_cuts_stops_with_max_wall(tmp_path: Path, serve) -> None:
    server = serve(delay_s=120.0)
    runner, summary = run_samples(tmp_path, [chat_model("openai", server.url)], conditions=["zero-shot"],
                                  budget=Budget(max_wall_s=1.0))
    assert summary.complete and not summary.errors
    record = json.loads((runner.run_dir.path / "samples/all_reduce/zero-shot/0/sample.json").read_text())
    assert record["status"] == "finished" and record["stop_reason"] == MAX_WALL
    assert record["verdict"] == "no_code" and "error" not in record  # never booked as the model's error
    assert server.hits == 1 and wait_for(lambda: server.aborted == 1)


# -- a tool's whole evaluation ------------------------------------------------------------------------
class StallsFirst:
    """An executor whose first evaluation (the tool's) waits as a queue for devices does, polling harness.cancel,
    for at most a minute; later ones (the final scoring) run here."""

    name = "stalls-first"

    def __init__(self) -> None:
        self.requests: list[EvalRequest] = []
        self.local = LocalExecutor(DeviceScheduler("cpu", 2, cpu_slots=1))
        self.stalled_to_the_end = False

    def evaluate(self, request: EvalRequest) -> EvalResult:
        self.requests.append(request)
        if len(self.requests) == 1:
            for _ in range(600):
                cancel.sleep(0.1)  # DeadlinePassed here, at the sample's deadline
            self.stalled_to_the_end = True
        return self.local.evaluate(request)

    def run_on_devices(self, world_size: int, device: str, fn: Callable[..., Any], /, *args: Any,
                       **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def capacity(self, world_size: int | None = None, device: str | None = None) -> int:
        return 1

    def close(self) -> None:
        pass


def test_a_tool_evaluation_waiting_past_the_budget_ends_the_sample_with_max_wall(tmp_path: Path) -> None:
    """Queueing counts: an evaluation that waits for its devices is stopped at the sample's deadline, the model
    reads why, and the sample stops with max_wall (its last candidate still scored)."""
    model = scripted([("tool", "check", {"source": BROKEN}), ("text", "done")])
    config = RunConfig(model=SCRIPTED, conditions=["agent:check"], samples=1, problems=["all_reduce"],
                       budgets=Budget(max_wall_s=2.0).as_dict(), trials=2, model_attempts=1)
    run_dir = RunDir(tmp_path / "run")
    create_run(run_dir, config, None)
    executor = StallsFirst()
    runner = Runner(run_dir, config, [get(load_suite(), "all_reduce")], model_factory=lambda: model,
                    eval_config=eval_config(), executor=executor)
    summary = runner.run()
    assert summary.complete and not executor.stalled_to_the_end
    folder = run_dir.path / "samples/all_reduce/agent:check/0"
    record = json.loads((folder / "sample.json").read_text())
    assert record["stop_reason"] == MAX_WALL and record["turns"] == 1 and record["tool_calls"] == {"check": 1}
    answer = json.loads((folder / "transcript.json").read_text())[-1]
    assert answer["role"] == "tool" and "wall budget ran out" in answer["content"]
    assert record["verdict"] == "compile_error" and len(executor.requests) == 2  # the final scoring ran


def test_a_check_running_past_the_deadline_is_stopped_and_leaves_nothing(tmp_path: Path, fresh_cancel: None,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Real ranks computing for 200 s a call, a check limit of 120 s (each phase alone within what was left, as
    agent.tool_calls.within_wall caps them): the deadline ends the whole evaluation, its processes and folders
    go, and the model reads that the wall budget ran out. Another thread's work is not touched."""
    import tempfile

    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    config = EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"), limits=Limits(check_s=120))
    ctx = ToolContext(problem=get(load_suite(), "all_reduce"), settings=ToolSettings(2, "cpu", "small"),
                      config=config, workdir=tmp_path / "sample", deadline=time.monotonic() + 8.0)
    beside: list[str] = []

    def sleep_without_a_deadline() -> None:
        cancel.sleep(12.0)
        beside.append("slept")

    neighbour = threading.Thread(target=sleep_without_a_deadline)
    neighbour.start()
    outcome = run_tool("check", {"source": LONG.read_text()}, ctx)
    neighbour.join(timeout=60)
    assert outcome.data.get("stopped") == "max_wall" and outcome.data.get("verdict") is None
    assert "wall budget ran out" in outcome.text and outcome.candidate is not None
    assert processes_mentioning(str(private)) == [] and live_children() == []
    # pool and evaluation folders removed (tiktoken, which sizes the answer, keeps its cache there)
    assert [p.name for p in private.iterdir() if p.name != "data-gym-cache"] == []
    assert beside == ["slept"]  # the deadline was this thread's only


def test_a_deadline_kills_only_what_its_thread_registered_within_it(fresh_cancel: None) -> None:
    killed: list[str] = []
    with cancel.killable(lambda: killed.append("outside")):
        with cancel.deadline(time.monotonic() + 0.2), cancel.killable(lambda: killed.append("inside")):
            cancel.check()  # before the deadline: nothing
            with pytest.raises(cancel.DeadlinePassed):
                cancel.sleep(600)  # a wait of this thread ends at the deadline
            assert cancel.requested()
            with pytest.raises(cancel.DeadlinePassed):
                cancel.check()
        assert wait_for(lambda: killed == ["inside"])
        cancel.check()  # the block is over: this thread goes on
        assert not cancel.requested()
    with cancel.deadline(time.monotonic() + 600):
        cancel.request()  # Ctrl-C inside a deadline is still Ctrl-C, not the budget's stop
        with pytest.raises(cancel.Cancelled) as info:
            cancel.check()
        assert not isinstance(info.value, cancel.DeadlinePassed)
