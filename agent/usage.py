"""Token usage of a model reply, and its cost from a versioned price table (agent/prices.json by default).

Token counts follow LangChain's usage_metadata: input_tokens counts every input token, cache reads and
cache writes included (the OpenAI and Anthropic integrations both normalise to that), so the uncached
part is input - cache_read - cache_write. output_tokens include reasoning (OpenAI's reasoning tokens,
Anthropic's thinking): both providers bill them as output, so they are priced at the output rate;
reasoning_tokens is the part the server reported as reasoning (OpenAI's completion_tokens_details,
Anthropic's output_tokens_details.thinking_tokens; 0 where a server reports no split). Cache writes are
Anthropic's cache_creation tokens, or the sum of its 5-minute and 1-hour parts where it splits them
(LangChain then zeroes the undivided figure). A price table gives USD per million
tokens for each "provider:model"; a cache rate the table leaves out is charged at the input rate. A model
the table does not list costs None (unknown, never zero). Prices are the standard tier: no batch
discount, no long-context surcharge.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # usage_of reads a reply's metadata; this module itself needs no LangChain (pkb --help reads it)
    from langchain_core.messages import AIMessage

DEFAULT_PRICES = Path(__file__).with_name("prices.json")
_DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")  # dated snapshots: claude-x-20250929, gpt-x-2025-08-07


class PriceTableError(ValueError):
    """A price table file that cannot be used; the message is one line naming the file."""


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0  # part of output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple[int, int, int, int, int]:
        return (self.input_tokens, self.output_tokens, self.cache_read_tokens, self.cache_write_tokens,
                self.reasoning_tokens)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def usage_of(message: AIMessage) -> Usage | None:
    """The reply's token usage, or None where the server reported none (some compatible servers don't)."""
    meta = message.usage_metadata
    if not meta:
        return None
    details: Mapping[str, Any] = meta.get("input_token_details") or {}
    out: Mapping[str, Any] = meta.get("output_token_details") or {}
    return Usage(
        input_tokens=int(meta.get("input_tokens") or 0),
        output_tokens=int(meta.get("output_tokens") or 0),
        cache_read_tokens=int(details.get("cache_read") or 0),
        cache_write_tokens=int(details.get("cache_creation") or 0)
        or sum(int(details.get(k) or 0) for k in ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")),
        reasoning_tokens=int(out.get("reasoning") or 0),
    )


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None

    def cost(self, usage: Usage) -> float:
        cached = usage.cache_read_tokens + usage.cache_write_tokens
        uncached = max(usage.input_tokens - cached, 0)
        read = self.input if self.cache_read is None else self.cache_read
        write = self.input if self.cache_write is None else self.cache_write
        total = (
            uncached * self.input
            + usage.cache_read_tokens * read
            + usage.cache_write_tokens * write
            + usage.output_tokens * self.output
        )
        return total / 1_000_000


@dataclass(frozen=True)
class PriceTable:
    version: str
    currency: str
    prices: Mapping[str, Price]
    source: str  # the file it came from, for run.json

    def price(self, model: str) -> Price | None:
        """The price of "provider:model"; a dated snapshot falls back to its undated name."""
        if model in self.prices:
            return self.prices[model]
        return self.prices.get(_DATE_SUFFIX.sub("", model))

    def cost(self, model: str, usage: Usage) -> float | None:
        price = self.price(model)
        return None if price is None else price.cost(usage)

    @classmethod
    def from_dict(cls, data: Any, source: str) -> PriceTable:
        def bad(why: str) -> PriceTableError:
            return PriceTableError(f"price table {source}: {why}")

        def bad_in(model: str) -> Callable[[str], PriceTableError]:
            return lambda why: bad(f"{model}: {why}")

        if not isinstance(data, dict):
            raise bad("expected a JSON object")
        version, currency, table = data.get("version"), data.get("currency"), data.get("per_million_tokens")
        if not isinstance(version, str) or not version:
            raise bad('needs a "version" string')
        if currency != "USD":
            raise bad(f'"currency" must be "USD" (budgets are in dollars), got {currency!r}')
        if not isinstance(table, dict):
            raise bad('needs a "per_million_tokens" object of "provider:model": {"input": .., "output": ..}')
        prices = {}
        for model, entry in table.items():
            if model.startswith("_"):
                continue  # comments
            if ":" not in model:
                raise bad(f'model {model!r} must be written "provider:model"')
            prices[model] = _price(entry, bad_in(model))
        return cls(version=version, currency=currency, prices=prices, source=source)


def load_price_table(path: str | Path | None = None) -> PriceTable:
    """The price table in `path` (the user's --prices FILE), or the packaged agent/prices.json."""
    file = DEFAULT_PRICES if path is None else Path(path)
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise PriceTableError(f"price table {file} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise PriceTableError(f"price table {file} cannot be read: {err}") from None
    except json.JSONDecodeError as err:
        raise PriceTableError(f"price table {file} is not valid JSON: {err}") from None
    return PriceTable.from_dict(data, str(file))


def _price(entry: Any, bad: Callable[[str], PriceTableError]) -> Price:
    if not isinstance(entry, dict):
        raise bad('expected {"input": .., "output": ..}')
    values: dict[str, float | None] = {}
    for field in ("input", "output", "cache_read", "cache_write"):
        value = entry.get(field)
        required = field in ("input", "output")
        if value is None and not required:
            values[field] = None
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise bad(f'"{field}" must be a non-negative number, got {value!r}')
        values[field] = float(value)
    return Price(**values)  # type: ignore[arg-type]  # input and output are checked above
