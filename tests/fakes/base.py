"""What the fake API servers share: a threaded HTTP server on 127.0.0.1 (a free port), request records,
a tokenizer unlike tiktoken's, and error bodies.

The fakes count tokens as UTF-8 bytes / 3, rounded up per text: deliberately not tiktoken, so the agent's
own counter (tiktoken, calibrated by what the server reports) is tested against a model whose tokenizer
it does not know, as it is against Claude's or SmolLM's.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


def fake_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 3) if text else 0


@dataclass
class Answer:
    status: int
    body: dict[str, Any]


class ApiError(Exception):
    """Raised inside a fake's handler: becomes the HTTP error answer."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(json.dumps(body))
        self.status = status
        self.body = body


@dataclass
class Exchange:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int = 0
    answer: dict[str, Any] = field(default_factory=dict)


class FakeApi:
    """A server on 127.0.0.1 whose `handle(path, headers, body) -> Answer` subclasses write; every exchange
    (request and answer) is kept in `exchanges`. Use as a context manager: the port is closed on exit."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def handle(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Answer:
        raise NotImplementedError

    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def rejected(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.status >= 400]

    def start(self) -> Self:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {}
                exchange = Exchange(self.path, headers, body)
                with api._lock:  # one request at a time: the caches are shared state
                    try:
                        answer = api.handle(self.path, headers, body)
                    except ApiError as err:
                        answer = Answer(err.status, err.body)
                    exchange.status, exchange.answer = answer.status, answer.body
                    api.exchanges.append(exchange)
                payload = json.dumps(answer.body).encode()
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# A model's turn, decided from the request: what the fake "model" answers.
@dataclass
class Turn:
    text: str = ""
    tool: tuple[str, dict[str, Any]] | None = None  # (name, args)
    thinking: str = ""  # reasoning text (Anthropic thinking block, or a compatible server's reasoning_content)
    reasoning_tokens: int = 0


Brain = Callable[[int, dict[str, Any]], Turn]  # (assistant turns so far, request body) -> Turn
