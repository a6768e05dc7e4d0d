"""Model providers: parse a model string and build the LangChain chat model behind it.

Model strings:

    openai:MODEL      OpenAI, or any OpenAI-compatible server (vLLM, SGLang, Together, ...) with base_url
    anthropic:MODEL   Anthropic (optionally through base_url)
    scripted:NAME     a ScriptedChatModel for tests: a registered script name or a path to a .json script
    replay:DIR        existing solution files; the runner reads them, no chat model is built

API keys come from the environment only: OPENAI_API_KEY / ANTHROPIC_API_KEY, or the variable named by
`api_key_env`. A missing key is a ProviderError that names the variable, with one exception: when a
base_url is given and `api_key_env` is not, a placeholder key is sent, because local servers (vLLM,
SGLang) accept any key; a server that does want one answers 401, and that error names the variable.

The SDKs' own retries are off (max_retries=0): agent.retry.invoke_model is the only retry loop, so the
two never stack. Temperature, the output-token limit and reasoning settings are mapped per model by
agent.reasoning (from the model table, agent/models.json), and sent only when given, since reasoning
models refuse sampling parameters.

OpenAI-compatible servers that reason (vLLM with a reasoning parser, llama.cpp, DeepSeek) return the
reasoning text as `reasoning_content` beside the answer; LangChain's ChatOpenAI drops it, so the model
built here keeps it in `additional_kwargs["reasoning_content"]` for the transcript (it is never sent back).
OpenAI's own chat completions return no reasoning text, only its token count.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache

from langchain_core.language_models import BaseChatModel

from agent.model_spec import PROVIDERS, VALID_FORMS, ModelSpec, Provider, ProviderError, parse_model_spec
from agent.model_table import ModelTable, load_model_table
from agent.reasoning import ReasoningConfig, request_options
from agent.scripted import scripted_model

__all__ = ["PROVIDERS", "VALID_FORMS", "ModelSpec", "Provider", "ProviderError", "make_chat_model", "parse_model_spec"]

DEFAULT_KEY_ENV: dict[str, str] = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
PLACEHOLDER_KEY = "EMPTY"  # what vLLM's and SGLang's docs pass when the server runs without --api-key
DEFAULT_TIMEOUT_S = 600.0


def make_chat_model(
    spec: ModelSpec,
    *,
    base_url: str | None = None,
    api_key_env: str | None = None,
    temperature: float | None = None,
    max_output_tokens: int | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    reasoning: ReasoningConfig | None = None,
    models: ModelTable | None = None,
) -> BaseChatModel:
    """The chat model for `spec` (parsed once, where the text came in: agent.model_spec.parse_model_spec), with
    SDK retries off. `env` defaults to os.environ (tests pass their own); `models` defaults to the packaged model
    table."""
    env = os.environ if env is None else env
    if spec.provider == "replay":
        raise ProviderError(f"{spec.text} replays solution files; it has no chat model (the runner reads DIR)")
    if spec.provider == "scripted":
        return scripted_model(spec.name)
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        raise ProviderError(f"base URL must start with http:// or https://, got {base_url!r}")
    key_env = api_key_env or DEFAULT_KEY_ENV[spec.provider]
    api_key = _api_key(key_env, explicit=api_key_env is not None, base_url=base_url, env=env)
    metadata = {"pkb_model": spec.text, "pkb_api_key_env": key_env, "pkb_base_url": base_url}
    table = models if models is not None else load_model_table()
    optional = request_options(spec.provider, spec.name, table.info(spec.text), table, reasoning or ReasoningConfig(),
                               temperature=temperature, max_output_tokens=max_output_tokens)
    if spec.provider == "openai":
        return _chat_openai_class()(
            model=spec.name,
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=0,
            use_responses_api=False,  # chat completions: the wire format every compatible server speaks
            metadata=metadata,
            **optional,
        )
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(
        model=spec.name,
        api_key=api_key,
        base_url=base_url,
        timeout=timeout,
        max_retries=0,
        metadata=metadata,
        **optional,
    )


def _api_key(key_env: str, *, explicit: bool, base_url: str | None, env: Mapping[str, str]) -> str:
    key = env.get(key_env, "").strip()
    if key:
        return key
    if base_url is not None and not explicit:
        return PLACEHOLDER_KEY
    raise ProviderError(f"no API key: set the environment variable {key_env}")


@lru_cache(maxsize=1)
def _chat_openai_class() -> type[BaseChatModel]:
    """ChatOpenAI that keeps a compatible server's `reasoning_content` (built once, on first use)."""
    import openai
    from langchain_core.outputs import ChatResult
    from langchain_openai import ChatOpenAI

    class ChatOpenAIKeepingReasoning(ChatOpenAI):
        def _create_chat_result(self, response: dict | openai.BaseModel,
                                generation_info: dict | None = None) -> ChatResult:
            result = super()._create_chat_result(response, generation_info)
            data = response if isinstance(response, dict) else response.model_dump()
            for generation, choice in zip(result.generations, data.get("choices") or []):
                message = choice.get("message") or {}
                text = message.get("reasoning_content") or message.get("reasoning")
                if isinstance(text, str) and text:
                    generation.message.additional_kwargs["reasoning_content"] = text
            return result

    return ChatOpenAIKeepingReasoning
