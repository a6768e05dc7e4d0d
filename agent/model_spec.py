"""Model strings and the error every provider failure becomes: light, so that the CLI checks `--model`
before the model stack is imported (agent.providers builds the chat model behind a string)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Provider = Literal["openai", "anthropic", "scripted", "replay"]
PROVIDERS: tuple[Provider, ...] = ("openai", "anthropic", "scripted", "replay")
VALID_FORMS = "openai:MODEL, anthropic:MODEL, replay:DIR or scripted:NAME"


class ProviderError(Exception):
    """A model-provider failure the user must act on; its message is one line, fit for the CLI.

    kind: "config" (bad model string, missing key, bad URL), "request" (the server refused the request:
    400, 401, 404, ...), "rate_limit", "server" (5xx), "unreachable" (no connection), "timeout" (no
    answer in time), "script" (a scripted model ran out). status is the HTTP status where there was one.
    """

    def __init__(self, message: str, *, kind: str = "config", status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


@dataclass(frozen=True)
class ModelSpec:
    provider: Provider
    name: str  # the model name, the script name, or the replay directory

    @property
    def text(self) -> str:
        """The canonical model string; also the key of the price table."""
        return f"{self.provider}:{self.name}"

    @property
    def is_chat_model(self) -> bool:
        return self.provider != "replay"


def parse_model_spec(text: str) -> ModelSpec:
    """Parse "provider:name". Only the first colon splits (model names may contain colons)."""
    provider, sep, name = text.strip().partition(":")
    provider, name = provider.strip().lower(), name.strip()
    if not sep or provider not in PROVIDERS:
        raise ProviderError(f"unknown model {text!r}: use {VALID_FORMS}")
    if not name:
        raise ProviderError(f"model {text!r} has nothing after '{provider}:': use {VALID_FORMS}")
    return ModelSpec(provider, name)  # `not in PROVIDERS` above narrows provider to a Provider
