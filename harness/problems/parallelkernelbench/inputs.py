"""Which of a PKB problem's inputs may be re-drawn per trial, and the record of what was done to them.

PKB's generators fill many inputs with constants that do not change between trials (its collective
problems fill rank + 1 everywhere), so a solution that returns the right constant without communicating
passes PKB's own check. The harness re-draws such inputs per trial, but only where that cannot change
what the problem means:

- a *fill* (a float tensor holding one value, not zero) becomes value * (1 + NOISE * N(0, 1)), element
  by element;
- a *stacked fill* (a float tensor whose every slice along the first dimension holds one value, as
  PKB's scatter and all-to-all inputs are built from per-destination fills) keeps that structure: each
  slice gets a new value of its own, value_i * (1 + NOISE * N(0, 1));
- everything else that stays identical across trials is left exactly as PKB made it, and the problem
  is flagged: integer and boolean tensors (indices, counts, masks), zeros (buffers), tensors that
  require grad, sparse tensors, and float constants of any other structure (identity view matrices,
  camera intrinsics whose K[2,2] = 1, identity covariances). Re-drawing those element by element
  would make a different problem.

The noise is seeded by the trial, the input's position and the tensor's own values, so tensors that are
equal across ranks stay equal (replicated parameters stay replicated) and ranks that differ still differ.

Worker-safe: the standard library and torch only.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch

NOISE = 0.25  # relative spread of a re-drawn fill
FLAG_PERTURBED = "pkb_inputs_perturbed"
FLAG_CONSTANT = "pkb_inputs_constant"
FILL = "fill"
STACKED_FILL = "stacked fill"
MAX_DISTINCT_NAMED = 64  # above this many distinct values a constant is called "not a fill" without counting

Key = int | str
Where = tuple[Key, ...]  # where a value sits in the input tuple: (argument index, item index or key, ...)
_Inputs = TypeVar("_Inputs")


def where_text(path: Where) -> str:
    """'#0', '#0[1]', "#2['weights']": argument index first, then positions or keys inside it."""
    out = f"#{path[0]}" if path else "#"
    for key in path[1:]:
        out += f"[{key!r}]" if isinstance(key, str) else f"[{key}]"
    return out


@dataclass
class InputPlan:
    """What make_inputs does to one rank's PKB inputs, decided once per shape, world size and rank."""

    perturb: list[Where] = field(default_factory=list)
    constant: list[tuple[Where, str]] = field(default_factory=list)  # identical across trials, left alone
    kinds: dict[Where, str] = field(default_factory=dict)  # FILL or STACKED_FILL, for each of `perturb`

    def rows(self) -> list[tuple[str, str, str]]:
        """(input, action, reason) for each input this plan touches or leaves constant."""
        out = [(where_text(p), "perturbed", _perturb_reason(self.kinds.get(p, FILL))) for p in self.perturb]
        out += [(where_text(p), "constant", why) for p, why in self.constant]
        return out

    def notes(self) -> list[str]:
        out = [f"input {where_text(p)} is a {self.kinds.get(p, FILL)} identical across trials in PKB: "
               f"re-drawn per trial" for p in self.perturb]
        out += [f"input {where_text(p)} stays identical across trials ({why}): cannot perturb it safely"
                for p, why in self.constant]
        return out


def _perturb_reason(kind: str) -> str:
    if kind == STACKED_FILL:
        return "a stacked fill (one value per slice of the first dimension) identical across trials in PKB: " \
               "re-drawn per trial, a new value per slice"
    return "a fill (one value) identical across trials in PKB: re-drawn per trial, element by element"


def leaves(value: Any, path: Where = ()) -> list[tuple[Where, Any]]:
    """Every value inside tuples, lists and dicts, with where it sits."""
    if isinstance(value, (tuple, list)):
        out: list[tuple[Where, Any]] = []
        for i, v in enumerate(value):
            out.extend(leaves(v, (*path, i)))
        return out
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out.extend(leaves(v, (*path, k if isinstance(k, (int, str)) else repr(k))))
        return out
    return [(path, value)]


def replace(value: Any, path: Where, new: Any) -> Any:
    """`value` with the leaf at `path` replaced (containers rebuilt, their types kept)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        key = next((k for k in value if k == head or repr(k) == head), head)
        return {k: (replace(v, rest, new) if k == key else v) for k, v in value.items()}
    items = list(value)
    items[int(head)] = replace(items[int(head)], rest, new)
    return tuple(items) if isinstance(value, tuple) else items


def same_value(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical (NaNs included), for strided and sparse tensors alike."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device or a.layout != b.layout:
        return False
    if a.layout == torch.sparse_coo:
        a, b = a.detach().coalesce(), b.detach().coalesce()
        return torch.equal(a.indices(), b.indices()) and same_value(a.values(), b.values())
    if a.layout != torch.strided:
        return False  # CSR and other layouts: treated as different (never re-drawn)
    return torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8),
                       b.detach().contiguous().reshape(-1).view(torch.uint8))


def _is_identity(t: torch.Tensor) -> bool:
    if t.dim() < 2 or t.shape[-1] != t.shape[-2]:
        return False
    eye = torch.eye(t.shape[-1], dtype=t.dtype, device=t.device).expand_as(t)
    return torch.equal(t.detach(), eye)


def classify(t: torch.Tensor) -> tuple[str | None, str]:
    """For a tensor identical across trials: (FILL / STACKED_FILL, "") when it may be re-drawn, else
    (None, why it stays)."""
    if t.layout != torch.strided:
        return None, f"a {str(t.layout).replace('torch.', '')} tensor"
    if not t.is_floating_point():
        return None, f"{str(t.dtype).replace('torch.', '')} tensor"
    if isinstance(t, torch.nn.Parameter) or t.requires_grad:
        return None, "a tensor that requires grad"
    flat = t.detach().reshape(-1)
    if not bool(flat.ne(0).any()):
        return None, "all zeros, likely a buffer"
    if bool(flat.eq(flat[0]).all()):
        return FILL, ""
    if t.dim() >= 2 and t.shape[0] > 1:
        rows = t.detach().reshape(t.shape[0], -1)
        if bool(rows.eq(rows[:, :1]).all()):
            return STACKED_FILL, ""
    if _is_identity(t):
        return None, "an identity matrix, a structured constant"
    distinct = flat.float().unique().numel() if flat.numel() <= 1 << 22 else MAX_DISTINCT_NAMED + 1
    if distinct > MAX_DISTINCT_NAMED:
        return None, "a float tensor that is not a fill, of unknown structure"
    return None, (f"a float constant with {distinct} distinct values, not a fill: its structure (a ramp, "
                  "a camera matrix, a mask...) is unknown, and re-drawing it element by element could change "
                  "the problem")


def plan_inputs(first: Any, second: Any) -> InputPlan:
    """Compare two trials' PKB inputs of one rank and decide which tensors to re-draw per trial."""
    plan = InputPlan()
    other = dict(leaves(second))
    for path, t in leaves(first):
        u = other.get(path)
        if not isinstance(t, torch.Tensor) or not isinstance(u, torch.Tensor) or t.numel() < 2:
            continue  # scalars, modules, process groups: parameters of the problem, passed as PKB made them
        if t.device.type == "meta" or not same_value(t, u):
            continue  # PKB already draws this one per trial
        kind, why = classify(t)
        if kind is None:
            plan.constant.append((path, why))
        else:
            plan.perturb.append(path)
            plan.kinds[path] = kind
    return plan


def _generator(t: torch.Tensor, trial_seed: int, path: Where, values: list[float]) -> torch.Generator:
    key = f"{trial_seed}|{path}|{tuple(t.shape)}|{t.dtype}|{values}"
    gen = torch.Generator(device=t.device)
    gen.manual_seed(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 1)
    return gen


def redraw(t: torch.Tensor, trial_seed: int, path: Where, kind: str = FILL) -> torch.Tensor:
    """A fill re-drawn element by element; a stacked fill re-drawn one value per slice."""
    source = t.detach().float()
    if kind == STACKED_FILL:
        firsts = source.reshape(t.shape[0], -1)[:, 0]
        gen = _generator(t, trial_seed, path, firsts.tolist())
        noise = torch.randn(firsts.shape, generator=gen, device=t.device, dtype=torch.float32)
        scale = (1.0 + NOISE * noise).reshape(-1, *([1] * (t.dim() - 1)))
        values = source * scale
    else:
        gen = _generator(t, trial_seed, path, source.unique().tolist())
        noise = torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32)
        values = source * (1.0 + NOISE * noise)
    out = torch.empty_like(t)
    out.copy_(values)
    return out


def apply_plan(inputs: _Inputs, plan: InputPlan, trial_seed: int) -> _Inputs:
    """The inputs with every tensor the plan perturbs re-drawn for this trial (replace keeps container types)."""
    for path in plan.perturb:
        leaf = dict(leaves(inputs))[path]
        inputs = replace(inputs, path, redraw(leaf, trial_seed, path, plan.kinds.get(path, FILL)))
    return inputs


# -- the record ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InputNote:
    """One input of a PKB problem that was re-drawn or left constant, on which ranks and why."""

    input: str  # where_text: '#0', '#1[2]'
    action: str  # "perturbed" or "constant"
    reason: str
    ranks: tuple[int, ...]

    def line(self) -> str:
        ranks = f"rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}"
        if self.action == "perturbed":
            return f"input {self.input} ({ranks}): {self.reason}"
        return f"input {self.input} ({ranks}) stays identical across trials ({self.reason}): left as PKB made it"


@dataclass(frozen=True)
class InputReport:
    """What the harness does to a PKB problem's inputs at one shape and world size (for the result record)."""

    problem: str
    shape: str
    world_size: int
    notes: tuple[InputNote, ...] = ()
    error: str | None = None  # why the inputs could not be examined; then nothing is known

    @property
    def perturbed(self) -> list[InputNote]:
        return [n for n in self.notes if n.action == "perturbed"]

    @property
    def constant(self) -> list[InputNote]:
        return [n for n in self.notes if n.action == "constant"]

    def flags(self) -> list[str]:
        out = []
        if self.perturbed:
            out.append(FLAG_PERTURBED)
        if self.constant:
            out.append(FLAG_CONSTANT)
        return out

    def lines(self) -> list[str]:
        return [n.line() for n in self.notes] + ([self.error] if self.error else [])

    def as_dict(self) -> dict[str, Any]:
        """JSON for a result record: {"perturbed": [...], "constant": [...], "error": ...}."""
        def rows(notes: list[InputNote]) -> list[dict[str, Any]]:
            return [{k: v for k, v in asdict(n).items() if k != "action"} | {"ranks": list(n.ranks)} for n in notes]

        return {"shape": self.shape, "world_size": self.world_size, "perturbed": rows(self.perturbed),
                "constant": rows(self.constant), "error": self.error}


def merge_rows(problem: str, shape: str, world_size: int, rows_by_rank: dict[int, list[tuple[str, str, str]]],
               error: str | None = None) -> InputReport:
    """One report from each rank's InputPlan.rows() (a rank worker can send its rows back as JSON)."""
    ranks: dict[tuple[str, str, str], list[int]] = {}
    for rank in sorted(rows_by_rank):
        for row in rows_by_rank[rank]:
            ranks.setdefault(tuple(row), []).append(rank)  # type: ignore[arg-type]
    notes = sorted((InputNote(i, a, r, tuple(rs)) for (i, a, r), rs in ranks.items()),
                   key=lambda n: (n.action != "perturbed", _natural(n.input), n.ranks))
    return InputReport(problem, shape, world_size, tuple(notes), error)


def _natural(text: str) -> list[Any]:
    """'#10' after '#9': digits compared as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]
