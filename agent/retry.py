"""One model call with bounded retries: rate limits (429), server errors (5xx) and lost connections only.

Everything else the server says (400, 401, 403, 404, ...) is final at once; a 400 that says the prompt is
over the model's context comes back as kind "context", so the loop can name that stop. Every HTTP or connection
failure leaves as a ProviderError with a one-line message; a server still unreachable after the last
attempt is named as such. Other exceptions (a bug, a malformed response) propagate unchanged. The
provider SDKs' own retries are off (see agent.providers), so this loop is the only one.

Within a wall budget (`wall_left`), every attempt's timeout is at most the time left (at least
LEAST_TIMEOUT_S; the client's own timeout where that is shorter, agent.providers.DEFAULT_TIMEOUT_S by
default), and no wait between attempts reaches past it: a
request cut by the budget, or a retry the budget leaves no time for, leaves as ProviderError kind "wall"
(WALL), which the agent loop books as the wall budget's stop (max_wall), never as the model's error.
"""

from __future__ import annotations

import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from langchain_core.exceptions import ContextOverflowError, ModelConnectionError, ModelTimeoutError
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from agent.providers import DEFAULT_TIMEOUT_S, ProviderError
from harness import cancel

# The provider SDKs whose errors are retried or named. They are read from sys.modules, never imported here: an
# SDK's exception can only exist once its SDK was imported (agent.providers imports one when it builds that
# provider's model), and importing both costs a `pkb run` with a replayed or scripted model seconds of start-up.
_SDKS = ("openai", "anthropic")


def _sdk_errors(*names: str) -> tuple[type[BaseException], ...]:
    """The classes called `names` of every provider SDK this process has imported."""
    return tuple(getattr(sdk, name) for module in _SDKS if (sdk := sys.modules.get(module)) is not None
                 for name in names)


def status_errors() -> tuple[type[BaseException], ...]:
    return _sdk_errors("APIStatusError")


def connection_errors() -> tuple[type[BaseException], ...]:
    return (*_sdk_errors("APIConnectionError"), ModelConnectionError, ModelTimeoutError)


def timeout_errors() -> tuple[type[BaseException], ...]:
    return (*_sdk_errors("APITimeoutError"), ModelTimeoutError)


MAX_MESSAGE_CHARS = 300
# A 400 that says the prompt is over the model's context (servers that LangChain does not recognise as such:
# llama.cpp, vLLM and SGLang word it their own way).
CONTEXT_WORDS = re.compile(r"context length|context window|context_length_exceeded|prompt is too long|"
                           r"maximum context|too many tokens|exceeds? (the )?(max(imum)? )?(model|context)", re.I)

# ProviderError.kind of a request the wall budget ended (see the module doc).
WALL = "wall"
# The shortest timeout a request is given (a timeout must be positive; the guard let this request go).
LEAST_TIMEOUT_S = 1.0

_log = structlog.get_logger("agent.retry")


def invoke_model(
    model: Runnable[Any, BaseMessage],
    messages: Sequence[BaseMessage],
    *,
    attempts: int = 5,
    initial_wait_s: float = 1.0,
    max_wait_s: float = 60.0,
    sleep: Callable[[float], None] = cancel.sleep,
    log: Any = None,
    wall_left: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AIMessage:
    """model.invoke(messages), retried up to `attempts` calls in all on 429, 5xx and connection errors.

    Waits grow exponentially from initial_wait_s (plus up to initial_wait_s of jitter), capped at
    max_wait_s; a Retry-After header from the server lengthens a wait, within the same cap. `sleep` (by
    default one that Ctrl-C ends at once, with harness.cancel.Cancelled) is injectable for tests; `log` is a
    structlog logger (the run's, with its context bound) or None. `wall_left`: the seconds of the wall
    budget left (None: no limit), which bound every attempt's timeout and wait (see the module doc); `clock`
    (monotonic seconds) is injectable for tests.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    log = _log if log is None else log
    deadline = None if wall_left is None else clock() + max(wall_left, 0.0)
    own_timeout = _timeout(model)
    timeout_cut = False  # the last attempt ran under a timeout the budget shortened
    wall_stopped = False  # the budget ended the attempts (no time left to send one, or to wait for the next)

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        backoff = initial_wait_s * 2 ** (state.attempt_number - 1) + random.uniform(0, initial_wait_s)
        return min(max(backoff, _retry_after(error)), max_wait_s)

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.warning(
            "model_retry",
            attempt=state.attempt_number,
            attempts=attempts,
            wait_s=round(state.upcoming_sleep, 3),
            status=_status(error),
            url=_url(error),
            error=_one_line(error),
        )

    def stop(state: RetryCallState) -> bool:
        nonlocal wall_stopped
        if stop_after_attempt(attempts)(state):
            return True
        if deadline is not None and clock() + state.upcoming_sleep >= deadline:
            wall_stopped = True  # the wait alone reaches the end of the budget: no attempt fits after it
            return True
        return False

    retrying = Retrying(
        stop=stop,
        wait=wait,
        # a timeout the budget cut spent all the time left: never retried
        retry=retry_if_exception(lambda e: is_retryable(e) and not (timeout_cut and isinstance(e, timeout_errors()))),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    calls = 0

    def call() -> BaseMessage:
        nonlocal calls, timeout_cut
        calls += 1
        if deadline is None:
            return model.invoke(list(messages))
        timeout = min(max(deadline - clock(), LEAST_TIMEOUT_S), own_timeout)
        timeout_cut = timeout < own_timeout
        return model.invoke(list(messages), timeout=timeout)

    answered_errors: tuple[type[BaseException], ...] = (*status_errors(), *connection_errors(), ContextOverflowError)
    try:
        reply = retrying(call)
    except answered_errors as error:
        if is_retryable(error) and (wall_stopped or (timeout_cut and isinstance(error, timeout_errors()))):
            raise wall_error(error, attempts=calls, wall_left=wall_left) from error
        raise to_provider_error(error, attempts=calls, model=model) from error
    if not isinstance(reply, AIMessage):
        raise ProviderError(f"the model returned a {type(reply).__name__}, not an AIMessage", kind="request")
    return reply


def wall_error(error: BaseException, *, attempts: int, wall_left: float | None) -> ProviderError:
    """The ProviderError (kind WALL) of a request the wall budget cut or left no retry for."""
    budget = f"the {wall_left:.1f} s" if wall_left is not None else "the time"
    tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    return ProviderError(f"the wall budget ran out during the model request: {budget} left of it were spent "
                         f"in {tries} (last: {_one_line(error)})", kind=WALL)


def is_retryable(error: BaseException) -> bool:
    status = _status(error)
    if status is not None:
        return status == 429 or status >= 500
    return isinstance(error, connection_errors())


def to_provider_error(error: BaseException, *, attempts: int, model: Any = None) -> ProviderError:
    """The one-line ProviderError for an SDK error after `attempts` calls."""
    status, url, detail = _status(error), _url(error), _one_line(error)
    tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
    base_url = _metadata(model).get("pkb_base_url")
    server = f"base URL {base_url}" if base_url else (url or "the model server")
    if isinstance(error, ContextOverflowError) or (status == 400 and CONTEXT_WORDS.search(detail)):
        where = f" from {url}" if url else ""
        return ProviderError(f"the prompt is longer than the model's context (HTTP {status or 400}){where}: {detail}",
                             kind="context", status=status or 400)
    if status is None and isinstance(error, timeout_errors()):
        return ProviderError(f"{server} did not answer within the timeout {tries}", kind="timeout")
    if status is None:
        return ProviderError(f"{server} is unreachable {tries} ({detail})", kind="unreachable")
    where = f" from {url}" if url else ""
    if status == 429:
        return ProviderError(f"rate limited (HTTP 429){where} {tries}: {detail}", kind="rate_limit", status=status)
    if status >= 500:
        return ProviderError(f"server error (HTTP {status}){where} {tries}: {detail}", kind="server", status=status)
    hint = ""
    if status in (401, 403):
        hint = f"; check the API key in {_metadata(model).get('pkb_api_key_env') or 'the key variable'}"
    elif status == 404 and url and "/v1/" not in url:
        hint = "; does the base URL need a /v1 suffix?"
    return ProviderError(f"request refused (HTTP {status}){where}: {detail}{hint}", kind="request", status=status)


def _status(error: BaseException | None) -> int | None:
    if not isinstance(error, status_errors()):
        return None
    code: Any = getattr(error, "status_code", None)  # every SDK's APIStatusError carries the HTTP status
    return int(code)


def _url(error: BaseException | None) -> str | None:
    request = getattr(error, "request", None)
    try:
        return str(request.url) if request is not None else None
    except RuntimeError:  # httpx raises when an exception carries no request
        return None


def _retry_after(error: BaseException | None) -> float:
    headers = getattr(getattr(error, "response", None), "headers", None)  # httpx or httpx2, by SDK version
    header = headers.get("retry-after") if headers is not None else None
    try:
        return max(float(header), 0.0) if header else 0.0
    except ValueError:  # an HTTP date: rare enough to ignore
        return 0.0


def _one_line(error: BaseException | None) -> str:
    """The server's own error message where the body has one (both wire formats), else the exception's."""
    if error is None:
        return ""
    body = getattr(error, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    text = inner.get("message") if isinstance(inner, dict) else None
    if not isinstance(text, str) or not text:
        text = getattr(error, "message", None) or str(error) or type(error).__name__
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def _timeout(model: Any) -> float:
    """The client's own timeout of one request (ChatOpenAI's request_timeout, ChatAnthropic's
    default_request_timeout), else DEFAULT_TIMEOUT_S."""
    while model is not None:
        for name in ("request_timeout", "default_request_timeout"):
            value = getattr(model, name, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                return float(value)
        model = getattr(model, "bound", None)  # bind_tools wraps the model in a RunnableBinding
    return DEFAULT_TIMEOUT_S


def _metadata(model: Any) -> dict[str, Any]:
    while model is not None and not isinstance(getattr(model, "metadata", None), dict):
        model = getattr(model, "bound", None)  # bind_tools wraps the model in a RunnableBinding
    return model.metadata if model is not None else {}
