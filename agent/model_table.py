"""What pkb knows about each model: context window, output limit, how it reasons (agent/models.json by default).

The table is data, like the price table: "provider:model" -> ModelInfo. A dated snapshot falls back to its
undated name (the same rule as agent.usage.PriceTable). A model the table does not list gets None: pkb then
manages no context unless the user gives a window, and sends the reasoning settings as asked. Command-line
overrides (--context-window) are applied by `with_overrides`, never written back to the table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

DEFAULT_MODELS = Path(__file__).with_name("models.json")
_DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")
Reasoning = Literal["effort", "adaptive", "budget"]
REASONING_KINDS: tuple[str, ...] = ("effort", "adaptive", "budget")


class ModelTableError(ValueError):
    """A model table file that cannot be used; the message is one line naming the file."""


@dataclass(frozen=True)
class ModelInfo:
    context_window: int | None = None  # input tokens the model accepts in one request
    max_output_tokens: int | None = None  # the most one reply may generate (reasoning included)
    reasoning: Reasoning | None = None
    temperature: bool = True  # whether a non-default temperature is accepted
    effort_levels: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelTable:
    version: str
    models: dict[str, ModelInfo]
    thinking_budgets: dict[str, int]  # --reasoning-effort -> budget_tokens, for "budget" models
    source: str

    def info(self, model: str) -> ModelInfo | None:
        if model in self.models:
            return self.models[model]
        return self.models.get(_DATE_SUFFIX.sub("", model))

    @classmethod
    def from_dict(cls, data: Any, source: str) -> ModelTable:
        def bad(why: str) -> ModelTableError:
            return ModelTableError(f"model table {source}: {why}")

        if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
            raise bad('expected a JSON object with a "models" object of "provider:model": {...}')
        version = data.get("version")
        if not isinstance(version, str) or not version:
            raise bad('needs a "version" string')
        models = {}
        for name, entry in data["models"].items():
            if name.startswith("_"):
                continue
            if ":" not in name:
                raise bad(f'model {name!r} must be written "provider:model"')
            models[name] = _info(entry, lambda why, m=name: bad(f"{m}: {why}"))
        budgets: dict[str, int] = {}
        for effort, value in (data.get("thinking_budget_for_effort") or {}).items():
            if effort.startswith("_"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1024:
                raise bad(f"thinking_budget_for_effort.{effort} must be an integer of at least 1024, got {value!r}")
            budgets[effort] = value
        return cls(version=version, models=models, thinking_budgets=budgets, source=source)


def _positive(entry: dict[str, Any], key: str, bad: Any) -> int | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise bad(f'"{key}" must be a positive integer, got {value!r}')
    return value


def _info(entry: Any, bad: Any) -> ModelInfo:
    if not isinstance(entry, dict):
        raise bad("expected an object")
    reasoning = entry.get("reasoning")
    if reasoning is not None and reasoning not in REASONING_KINDS:
        raise bad(f'"reasoning" must be one of {", ".join(REASONING_KINDS)} or null, got {reasoning!r}')
    levels = entry.get("effort_levels") or []
    if not isinstance(levels, list) or not all(isinstance(x, str) for x in levels):
        raise bad('"effort_levels" must be a list of strings')
    temperature = entry.get("temperature", True)
    if not isinstance(temperature, bool):
        raise bad(f'"temperature" must be true or false, got {temperature!r}')
    return ModelInfo(context_window=_positive(entry, "context_window", bad),
                     max_output_tokens=_positive(entry, "max_output_tokens", bad),
                     reasoning=reasoning, temperature=temperature, effort_levels=tuple(levels))


def load_model_table(path: str | Path | None = None) -> ModelTable:
    """The table in `path` (--models FILE), or the packaged agent/models.json."""
    file = DEFAULT_MODELS if path is None else Path(path)
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ModelTableError(f"model table {file} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ModelTableError(f"model table {file} cannot be read: {err}") from None
    except json.JSONDecodeError as err:
        raise ModelTableError(f"model table {file} is not valid JSON: {err}") from None
    return ModelTable.from_dict(data, str(file))
