"""The sweep file (TOML, docs/sweep.md): what it may say, its checks, and the matrix of cells it expands to.

Read with tomllib and checked by pydantic models that forbid unknown keys, so a misspelt key, an unknown
tool or condition, and a malformed model string are one-line SweepErrors naming the file before anything
runs. What needs the suite or the model stack (problem names, model tables, script files) is checked by
agent.sweep.checks.

A cell is one run in today's layout (agent.runner): one model, one condition, one seed, every problem of the
sweep, `samples` each. A search cell (the optional [search] table) is one `pkb search` per model, proposer
and seed. Cells are named `<model label>--<condition>--seed<N>` (condition: ':' becomes '_' and '+' '.'),
names `pkb run --run-id` accepts.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agent.conditions import AGENT_TOOLS, REPLAY, Condition, ConditionError, parse_condition, parse_tools
from agent.model_spec import ProviderError, parse_model_spec
from harness.common.hostile_files import HostileFile, Missing, read_given

SWEEP_SCHEMA = "pkb-sweep/1"
LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class SweepError(ValueError):
    """A sweep file that cannot be run as written; one line, naming the file."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budgets(_Strict):
    """Per sample, as `pkb run --budget-*` (0: no limit; a key left out: pkb run's default)."""

    turns: int | None = Field(None, ge=0)
    tokens: int | None = Field(None, ge=0)
    input_tokens: int | None = Field(None, ge=0)
    output_tokens: int | None = Field(None, ge=0)
    cost_usd: float | None = Field(None, ge=0)
    wall_s: float | None = Field(None, ge=0)
    gpu_s: float | None = Field(None, ge=0)

    def run_options(self) -> list[str]:
        options = {"turns": "--budget-turns", "tokens": "--budget-tokens", "input_tokens": "--budget-input-tokens",
                   "output_tokens": "--budget-output-tokens", "cost_usd": "--budget-cost", "wall_s": "--budget-wall",
                   "gpu_s": "--budget-gpu"}
        return [part for key, option in options.items() if (value := getattr(self, key)) is not None
                for part in (option, str(value))]


class ModelEntry(_Strict):
    """One model and its settings; every key but `label` is the `pkb run` option of the same name."""

    model: str
    label: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    temperature: float | None = None
    max_reply_tokens: int | None = Field(None, ge=1)
    reasoning_effort: str | None = None
    thinking_budget: int | None = Field(None, ge=1024)
    context_window: int | None = Field(None, ge=1)
    context_share: float | None = Field(None, gt=0, le=1)
    prompt_cache: bool = True
    prices: str | None = None
    models: str | None = None
    retries: int | None = Field(None, ge=1)

    @field_validator("model")
    @classmethod
    def _known_form(cls, value: str) -> str:
        spec = parse_model_spec(value)  # ProviderError (a ValueError's sibling) is turned into one line below
        if spec.provider == "replay":
            raise ValueError("replay:DIR scores existing files; a sweep needs models that write code")
        return value

    def run_options(self, base: Path) -> list[str]:
        """This model's `pkb run` options; relative file paths are read from the sweep file's folder."""
        out = ["--model", self.model_text(base)]
        for key in ("base_url", "api_key_env", "temperature", "max_reply_tokens", "reasoning_effort",
                    "thinking_budget", "context_window", "context_share"):
            value = getattr(self, key)
            if value is not None:
                out += [f"--{key.replace('_', '-')}", str(value)]
        for key in ("prices", "models"):
            value = getattr(self, key)
            if value is not None:
                out += [f"--{key}", str(_resolve(base, value))]
        if self.retries is not None:
            out += ["--model-retries", str(self.retries)]
        if not self.prompt_cache:
            out.append("--no-prompt-cache")
        return out

    def model_text(self, base: Path) -> str:
        """The model string, a scripted .json file's path read from the sweep file's folder."""
        spec = parse_model_spec(self.model)
        if spec.provider == "scripted" and spec.name.endswith(".json"):
            return f"scripted:{_resolve(base, spec.name)}"
        return spec.text


class Conditions(_Strict):
    """Conditions listed by name, and families generated from `tools` (default: every ablatable tool)."""

    names: list[str] = Field(default_factory=list)
    tools: list[str] | None = None
    families: list[Literal["single", "all-but-one", "all"]] = Field(default_factory=list)

    def expand(self) -> list[Condition]:
        """The listed conditions, then each family's, in order, each once."""
        out: list[Condition] = []

        def add(condition: Condition) -> None:
            if condition not in out:
                out.append(condition)

        for text in self.names:
            condition = parse_condition(text)
            if condition.kind == REPLAY:
                raise ConditionError("replay scores existing files; a sweep's conditions are zero-shot and agent:...")
            add(condition)
        pool = parse_tools(self.tools) if self.tools is not None else AGENT_TOOLS
        for family in self.families:
            if family == "single":
                for tool in pool:
                    add(parse_condition(f"agent:{tool}"))
            elif family == "all-but-one":
                if len(pool) < 2:
                    raise ConditionError("the all-but-one family needs at least two tools")
                for tool in pool:
                    add(parse_condition("agent:" + "+".join(t for t in pool if t != tool)))
            else:
                add(parse_condition("agent:" + "+".join(pool)))
        return out


# `pkb search` options a sweep's [search] table may set (its own keys, with '_' for '-'); the rest (model,
# problems, device, world size, shape, seed, trials, timing) come from the sweep.
SEARCH_KEYS = ("strategy", "islands", "migration_interval", "top_k", "explore", "inspirations", "window", "warmup",
               "budget_candidates", "budget_gpu_hours", "budget_cost", "budget_tokens", "budget_hours",
               "problem_candidates", "problem_gpu_hours", "problem_cost", "problem_tokens", "problem_hours",
               "target_fraction", "target_speedup", "patience", "min_gain", "remeasure", "remeasure_top",
               "rescore_seeds", "rescore_candidates", "phase_timeout", "timing_iters", "fresh_reference", "keep_logs",
               "proposer_turns")


class SearchTable(_Strict):
    """[search]: a search per model, seed and proposer (a condition: zero-shot or agent:<tools>)."""

    proposers: list[str] = Field(default_factory=lambda: ["zero-shot"])
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _gather(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        options = {k: v for k, v in data.items() if k != "proposers"}
        unknown = [k for k in options if k not in SEARCH_KEYS]
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}; known: proposers, {', '.join(SEARCH_KEYS)}")
        return {"proposers": data.get("proposers", ["zero-shot"]), "options": options}

    def conditions(self) -> list[Condition]:
        out = [parse_condition(p) for p in self.proposers]
        if any(c.kind == REPLAY for c in out):
            raise ConditionError("a search's proposer is zero-shot or agent:<tools>, not replay")
        return list(dict.fromkeys(out))

    def search_options(self) -> list[str]:
        out: list[str] = []
        for key, value in self.options.items():
            option = f"--{key.replace('_', '-')}"
            if isinstance(value, bool):
                out += [option] if value else []
            else:
                out += [option, str(value)]
        return out


class SweepSpec(_Strict):
    name: str | None = None
    problems: list[str] = Field(default_factory=list)
    source: str | None = None
    samples: int = Field(1, ge=1)
    seeds: list[int] = Field(default_factory=lambda: [0])
    device: Literal["cpu", "cuda"] = "cpu"
    world_size: int = Field(2, ge=1)
    ranks_per_gpu: int = Field(1, ge=1)
    shape: str | None = None
    trials: int = Field(5, ge=2)
    timing: bool = True
    guide: bool = True
    concurrency: int = Field(1, ge=1)
    budgets: Budgets = Field(default_factory=Budgets)
    models: list[ModelEntry]
    conditions: Conditions = Field(default_factory=lambda: Conditions(names=["zero-shot"]))
    search: SearchTable | None = None

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: list[int]) -> list[int]:
        if not value or len(set(value)) != len(value):
            raise ValueError("give at least one seed, each once")
        return value


@dataclass(frozen=True)
class Cell:
    """One run (kind "run") or search (kind "search") of the matrix."""

    id: str
    kind: Literal["run", "search"]
    model: str  # the model's label
    condition: str  # the run's condition, or the search's proposer
    seed: int


@dataclass(frozen=True)
class Sweep:
    """A checked sweep file: its spec, where it was read from, and its matrix."""

    path: Path
    spec: SweepSpec
    labels: list[str]  # one per model, in the file's order
    conditions: list[Condition]
    proposers: list[Condition]
    text: str  # the file as read

    @property
    def name(self) -> str:
        return self.spec.name or self.path.stem

    @property
    def base(self) -> Path:
        return self.path.parent

    @property
    def shape(self) -> str:
        return self.spec.shape or ("default" if self.spec.device == "cuda" else "small")

    def model(self, label: str) -> ModelEntry:
        return self.spec.models[self.labels.index(label)]

    def cells(self) -> list[Cell]:
        """Every cell, seed first, then model, then condition (early cells cover every model)."""
        out = [Cell(cell_id(label, c.name, seed), "run", label, c.name, seed)
               for seed in self.spec.seeds for label in self.labels for c in self.conditions]
        out += [Cell(cell_id(label, f"search-{c.name}", seed), "search", label, c.name, seed)
                for seed in self.spec.seeds for label in self.labels for c in self.proposers]
        return out


def cell_id(label: str, condition: str, seed: int) -> str:
    return f"{label}--{condition.replace(':', '_').replace('+', '.')}--seed{seed}"


def _resolve(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def default_label(model: str) -> str:
    name = parse_model_spec(model).name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(name).stem if name.endswith(".json") else name).strip("-.")[:40] \
        or "model"


def _one_line(path: Path, err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = f"unknown key {first['loc'][-1]!r}"
    elif first["type"] == "missing":
        message = "is required"
    return f"{path}: {where}: {message}"


def parse(text: str, path: Path) -> Sweep:
    """A sweep from its TOML text (`path` names it in errors and anchors its relative paths)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SweepError(f"{path}: not valid TOML: {err}") from None
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise SweepError(_one_line(path, err)) from None
    except ProviderError as err:
        raise SweepError(f"{path}: models: {err}") from None
    if spec.name is not None and not NAME.match(spec.name):
        raise SweepError(f"{path}: name {spec.name!r}: use letters, digits, '.', '_' and '-'")
    if not spec.models:
        raise SweepError(f"{path}: models: give at least one [[models]] entry")
    labels = [m.label or default_label(m.model) for m in spec.models]
    for label in labels:
        if not LABEL.match(label):
            raise SweepError(f"{path}: model label {label!r}: use letters, digits, '.', '_' and '-' (40 at most)")
    twice = next((x for x in labels if labels.count(x) > 1), None)
    if twice is not None:
        raise SweepError(f"{path}: two models have the label {twice!r}; give each [[models]] entry its own label")
    try:
        conditions = spec.conditions.expand()
        proposers = spec.search.conditions() if spec.search is not None else []
    except ConditionError as err:
        raise SweepError(f"{path}: {err}") from None
    if not conditions and not proposers:
        raise SweepError(f"{path}: no condition: give conditions.names and/or conditions.families (or a [search] "
                         "table)")
    return Sweep(path=path, spec=spec, labels=labels, conditions=conditions, proposers=proposers, text=text)


def load(path: str | Path) -> Sweep:
    file = Path(path)
    try:  # a plain file, opened without blocking, bounded (a FIFO named here once made the sweep wait forever)
        text = read_given(file).decode()
    except Missing:
        raise SweepError(f"sweep file {file} does not exist") from None
    except HostileFile as err:
        raise SweepError(f"sweep file {err}") from None
    except UnicodeDecodeError as err:
        raise SweepError(f"sweep file {file} cannot be read: {err}") from None
    return parse(text, file.resolve())
