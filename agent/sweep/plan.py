"""The budget ceiling of a sweep: the most its cells may spend, from the per-sample budgets (`pkb sweep --dry-run`).

Per run cell: samples = problems x samples; per sample the budget's limits (agent.budgets.Budget):

- tokens: max_input_tokens + max_output_tokens (unbounded where either is not set: turns alone do not bound
  how long a reply or a prompt is);
- dollars: max_cost_usd where set; else, with both token limits and the model's price, the tokens at the
  dearest rate each could be billed at (input at the higher of the input and cache-write rates); else
  unbounded;
- wall: max_wall_s, the cell's samples running `concurrency` at a time; the final scoring of each sample
  comes on top of it (it is never cut short by the budget);
- GPU: max_gpu_s where set; else, on CUDA, every evaluation slot's GPUs held for the whole wall ceiling; on
  CPU there is no GPU time.

Per search cell: the search's own budgets (`pkb search --budget-*`), else its per-problem budgets times the
problems; what neither bounds is unbounded. A ceiling is a bound, not an estimate: a zero-shot sample spends
one reply, far below it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.budgets import Budget
from agent.usage import Price, Usage


@dataclass(frozen=True)
class Ceiling:
    """What cells may spend at most; None: unbounded (the reason in `why`)."""

    cells: int
    samples: int  # a search's: candidates (0 when no candidate budget bounds them)
    tokens: float | None
    cost_usd: float | None
    wall_s: float | None
    gpu_s: float | None
    why: tuple[str, ...] = ()

    def __add__(self, other: Ceiling) -> Ceiling:
        def add(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else a + b

        return Ceiling(self.cells + other.cells, self.samples + other.samples, add(self.tokens, other.tokens),
                       add(self.cost_usd, other.cost_usd), add(self.wall_s, other.wall_s),
                       add(self.gpu_s, other.gpu_s), tuple(dict.fromkeys(self.why + other.why)))

    def as_dict(self) -> dict[str, Any]:
        return {"cells": self.cells, "samples": self.samples, "tokens": self.tokens, "cost_usd": self.cost_usd,
                "wall_s": self.wall_s, "gpu_s": self.gpu_s, "unbounded": list(self.why)}


ZERO = Ceiling(0, 0, 0.0, 0.0, 0.0, 0.0)


def sample_cost(budget: Budget, price: Price | None) -> float | None:
    """The most one sample can be billed (see the module doc)."""
    if budget.max_cost_usd is not None:
        return budget.max_cost_usd
    if price is None or budget.max_input_tokens is None or budget.max_output_tokens is None:
        return None
    tokens_in, tokens_out = budget.max_input_tokens, budget.max_output_tokens
    plain = price.cost(Usage(input_tokens=tokens_in, output_tokens=tokens_out))
    written = price.cost(Usage(input_tokens=tokens_in, output_tokens=tokens_out, cache_write_tokens=tokens_in))
    return max(plain, written)


def run_cells(budget: Budget, *, cells: int, samples_per_cell: int, price: Price | None, device: str,
              gpus_per_evaluation: int, concurrency: int) -> Ceiling:
    """The ceiling of `cells` run cells of one model (each `samples_per_cell` samples)."""
    samples = cells * samples_per_cell
    why: list[str] = []
    tokens = None
    if budget.max_input_tokens is not None and budget.max_output_tokens is not None:
        tokens = float(samples * (budget.max_input_tokens + budget.max_output_tokens))
    else:
        why.append("tokens: set budgets.input_tokens and budgets.output_tokens (or budgets.tokens)")
    per_cost = sample_cost(budget, price)
    cost = None if per_cost is None else samples * per_cost
    if cost is None:
        why.append("dollars: set budgets.cost_usd, or token budgets for a model with a price")
    wall = None
    if budget.max_wall_s is not None:
        waves = -(-samples_per_cell // max(1, concurrency))  # samples of a cell run `concurrency` at a time
        wall = float(cells * waves * budget.max_wall_s)
    else:
        why.append("wall: set budgets.wall_s")
    gpu: float | None
    if device != "cuda":
        gpu = 0.0
    elif budget.max_gpu_s is not None:
        gpu = float(samples * budget.max_gpu_s)
    elif wall is not None:
        gpu = wall * gpus_per_evaluation * max(1, concurrency)
    else:
        gpu = None
        why.append("GPU: set budgets.gpu_s or budgets.wall_s")
    return Ceiling(cells, samples, tokens, cost, wall, gpu, tuple(why))


def search_cells(options: dict[str, Any], *, cells: int, problems: int, device: str) -> Ceiling:
    """The ceiling of `cells` searches with these `pkb search` budgets (dest names: budget_cost, ...)."""
    def limit(whole: str, each: str, scale: float = 1.0) -> float | None:
        if options.get(whole) is not None:
            return float(options[whole]) * scale * cells
        if options.get(each) is not None:
            return float(options[each]) * scale * cells * problems
        return None

    why: list[str] = []
    candidates = limit("budget_candidates", "problem_candidates")
    tokens = limit("budget_tokens", "problem_tokens")
    cost = limit("budget_cost", "problem_cost")
    wall = limit("budget_hours", "problem_hours", 3600.0)
    gpu = 0.0 if device != "cuda" else limit("budget_gpu_hours", "problem_gpu_hours", 3600.0)
    for name, value in (("search tokens", tokens), ("search dollars", cost), ("search wall", wall),
                        ("search GPU", gpu)):
        if value is None:
            why.append(f"{name}: set the [search] table's budget_* (or problem_*) key")
    return Ceiling(cells, int(candidates or 0), tokens, cost, wall, gpu, tuple(why))
