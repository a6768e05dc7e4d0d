"""`pkb run` loads a provider's SDK only when it builds that provider's model.

A run with a replayed or scripted model never talks to a provider; importing both SDKs (and their LangChain
wrappers) cost every such run, and every `pkb run` a test starts, seconds of start-up. The retry loop still
knows each SDK's errors once the SDK is there (agent.retry reads them from sys.modules).
"""

from __future__ import annotations

import json
import subprocess
import sys

SDKS = ("openai", "anthropic", "langchain_openai", "langchain_anthropic")


def _fresh(script: str) -> dict[str, object]:
    """What `script` prints as its last line (JSON), run in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_run_code_and_a_scripted_model_load_no_provider_sdk() -> None:
    loaded = _fresh(
        "import json, sys\n"
        "import agent.cli.run, agent.runner, agent.graph, agent.retry, agent.search.loop\n"
        "from agent.providers import make_chat_model, parse_model_spec\n"
        "from agent.scripted import register_script\n"
        "register_script('hello', [('text', 'hello')])\n"
        "make_chat_model(parse_model_spec('scripted:hello')).invoke('hi')\n"
        f"print(json.dumps({{'loaded': sorted(m for m in {SDKS!r} if m in sys.modules)}}))\n")
    assert loaded == {"loaded": []}


def test_the_retry_loop_knows_an_sdks_errors_once_its_model_is_built() -> None:
    """Building an OpenAI-compatible model imports its SDK; from then on its status, connection and timeout errors
    are the retry loop's (a 503 is retried, a 401 is not)."""
    found = _fresh(
        "import json, sys, httpx\n"
        "from agent import retry\n"
        "before = [c.__module__ for c in retry.status_errors()]\n"
        "from agent.providers import make_chat_model, parse_model_spec\n"
        "make_chat_model(parse_model_spec('openai:gpt-4o'), base_url='http://127.0.0.1:9/v1',\n"
        "                env={'OPENAI_API_KEY': 'x'})\n"
        "import openai\n"
        "request = httpx.Request('POST', 'http://127.0.0.1:9/v1/chat/completions')\n"
        "def status(code):\n"
        "    return openai.APIStatusError('e', response=httpx.Response(code, request=request), body=None)\n"
        "print(json.dumps({'before': before,\n"
        "    'status': openai.APIStatusError in retry.status_errors(),\n"
        "    'connection': openai.APIConnectionError in retry.connection_errors(),\n"
        "    'timeout': openai.APITimeoutError in retry.timeout_errors(),\n"
        "    'retry_503': retry.is_retryable(status(503)), 'retry_401': retry.is_retryable(status(401)),\n"
        "    'anthropic': 'anthropic' in sys.modules}))\n")
    assert found == {"before": [], "status": True, "connection": True, "timeout": True, "retry_503": True,
                     "retry_401": False, "anthropic": False}
