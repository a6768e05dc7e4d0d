"""Comparing one rank's outputs with the expected ones. Judge side: it runs only in processes that never
loaded candidate code, on values parsed from files (harness.rank.transport), never on live objects a
candidate made.

Structures: tensors (strided, and sparse COO compared as dense), lists and tuples (a list and a tuple of
the same items compare equal, as PKB's torch.save round trip does), dicts compared key by key, Python
scalars (floats within tolerance, everything else exactly), None. A mismatch is described, not just
detected: which output, what kind (structure, shape, dtype, values, NaN), the largest absolute and
relative error and where it sits. NaN never passes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.common import failures

SPARSE_DENSE_LIMIT = 1 << 28  # elements: a sparse output larger than this when dense is compared by its entries
# Elements compared at once: the float64 copies and masks of a chunk stay in the caches, where those of a
# whole output (600 MB apiece for 75M elements) would go through memory ten times.
CHUNK_ELEMENTS = 1 << 18


def flatten(value: Any, prefix: str = "out") -> list[tuple[str, Any]]:
    """Outputs as (path, leaf) pairs. Dicts flatten in key order (sorted by str(key)), so two dicts with
    the same keys in another insertion order flatten alike."""
    if isinstance(value, (tuple, list)):
        items: list[tuple[str, Any]] = []
        for i, v in enumerate(value):
            items.extend(flatten(v, f"{prefix}[{i}]"))
        return items
    if isinstance(value, dict):
        items = []
        for key in sorted(value, key=str):
            items.extend(flatten(value[key], f"{prefix}[{key!r}]"))
        return items
    return [(prefix, value)]


def _mismatch(kind: str, verdict: str, where: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "kind": kind, "verdict": verdict, "where": where, "message": message, **extra}


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.to_dense() if t.layout == torch.sparse_coo else t


def compare_tensors(where: str, expected: torch.Tensor, got: Any, atol: float, rtol: float,
                    stop_at_first: bool = False) -> dict[str, Any]:
    """`stop_at_first`: the scan ends at the first chunk with a NaN or a value out of tolerance, so the counts
    of a mismatch cover the elements seen so far (for `matches`, which needs only the yes or no)."""
    if not isinstance(got, torch.Tensor):
        return _mismatch(
            "structure", failures.SHAPE_MISMATCH, where, f"{where}: expected a tensor, got {type(got).__name__}"
        )
    if tuple(got.shape) != tuple(expected.shape):
        return _mismatch(
            "shape",
            failures.SHAPE_MISMATCH,
            where,
            f"{where}: shape {tuple(got.shape)} but expected {tuple(expected.shape)}",
        )
    if got.dtype != expected.dtype:
        return _mismatch(
            "dtype", failures.SHAPE_MISMATCH, where, f"{where}: dtype {got.dtype} but expected {expected.dtype}"
        )
    if expected.layout == torch.sparse_coo or got.layout == torch.sparse_coo:
        if expected.numel() > SPARSE_DENSE_LIMIT:
            return _compare_sparse_entries(where, expected, got, atol, rtol)
        expected, got = _dense(expected), _dense(got)
    if got.numel() == 0:
        return {"ok": True}
    got_cpu = got.detach()
    exp_cpu = expected.detach()
    if got_cpu.device != exp_cpu.device:
        got_cpu = got_cpu.to(exp_cpu.device)
    exact = not (expected.is_floating_point() or expected.is_complex())
    if exact:
        bad = got_cpu != exp_cpu
        if bool(bad.any()):
            idx = int(bad.flatten().nonzero()[0])
            n_bad = int(bad.sum())
            return _mismatch(
                "values",
                failures.OUTPUT_MISMATCH,
                where,
                f"{where}: {n_bad} of {got.numel()} elements differ (exact dtype {got.dtype}); first at flat "
                f"index {idx}: got {got_cpu.flatten()[idx].item()}, expected {exp_cpu.flatten()[idx].item()}",
                mismatched=n_bad,
                index=idx,
            )
        return {"ok": True}
    stats = _ValueStats()
    if got_cpu.layout == torch.strided and exp_cpu.layout == torch.strided:
        if atol >= 0 and rtol >= 0 and torch.equal(got_cpu, exp_cpu):
            return {"ok": True, "max_abs_err": 0.0, "max_rel_err": 0.0}  # what the element pass finds then
        g_flat, e_flat = got_cpu.reshape(-1), exp_cpu.reshape(-1)
        for start in range(0, g_flat.numel(), CHUNK_ELEMENTS):
            stats.add(g_flat[start:start + CHUNK_ELEMENTS], e_flat[start:start + CHUNK_ELEMENTS], atol, rtol, start)
            if stop_at_first and (stats.nans or stats.n_bad):
                break
    else:
        stats.add(got_cpu, exp_cpu, atol, rtol, 0)
    if stats.nans:
        return _mismatch("nan", failures.OUTPUT_MISMATCH, where,
                         f"{where}: NaN at flat index {stats.first_nan} ({stats.nans} NaNs in all)",
                         index=stats.first_nan)
    if stats.n_bad:
        worst = stats.worst_index
        g_worst, e_worst = (_as_wide(t.flatten()[worst]).item() for t in (got_cpu, exp_cpu))
        return _mismatch(
            "values",
            failures.OUTPUT_MISMATCH,
            where,
            f"{where}: {stats.n_bad} of {got.numel()} elements outside atol={atol:g} rtol={rtol:g}; "
            f"max abs err {stats.max_abs:.4g}, max rel err {stats.max_rel:.4g}; worst at flat index {worst}: "
            f"got {g_worst:.6g}, expected {e_worst:.6g}",
            max_abs_err=stats.max_abs,
            max_rel_err=stats.max_rel,
            mismatched=stats.n_bad,
            index=worst,
        )
    return {"ok": True, "max_abs_err": stats.max_abs, "max_rel_err": stats.max_rel}


def _as_wide(t: torch.Tensor) -> torch.Tensor:
    """Values in the precision every comparison is made in."""
    return t.to(torch.complex128 if t.is_complex() else torch.float64)


class _ValueStats:
    """What the comparison of two floating tensors reports, gathered chunk by chunk: each chunk is judged
    exactly as the whole tensor would be, and the totals, maxima and first positions merge to the whole
    tensor's (argmax's rule included: the first NaN, else the first maximum)."""

    def __init__(self) -> None:
        self.nans = 0
        self.first_nan: int | None = None
        self.n_bad = 0
        self.max_abs = float("-inf")
        self.max_rel = float("-inf")
        self.worst_value: float | None = None
        self.worst_index = 0

    def add(self, got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float, offset: int) -> None:
        complex_ = got.is_complex()
        g, e = _as_wide(got), _as_wide(expected)
        nan = torch.isnan(g) | torch.isnan(e)
        if complex_:
            nan = torch.isnan(g.real) | torch.isnan(g.imag) | torch.isnan(e.real) | torch.isnan(e.imag)
        nans = int(nan.sum())
        if nans:
            if self.first_nan is None:
                self.first_nan = offset + int(nan.flatten().nonzero()[0])
            self.nans += nans
        if self.nans:
            return  # a NaN anywhere is the verdict: the values are not needed any more
        diff = (g - e).abs()
        if complex_:
            diff = diff.real
        e_abs = e.abs()
        inf_mismatch = torch.isinf(diff) | (torch.isinf(g.abs() if complex_ else g) ^ torch.isinf(
            e_abs if complex_ else e))
        limit = atol + rtol * e_abs
        if complex_:
            limit = limit.real
        self.n_bad += int(((diff > limit) | inf_mismatch).sum())
        finite_diff = torch.nan_to_num(diff, nan=0.0, posinf=0.0, neginf=0.0)  # |g - e| where it is finite, else 0
        self.max_abs = max(self.max_abs, float(finite_diff.max()))
        rel = finite_diff / e_abs.clamp_min(1e-12)
        if complex_:
            rel = rel.real
        self.max_rel = max(self.max_rel, float(rel.max()))
        over = (diff - limit).flatten()
        at = int(over.argmax())
        value = float(over[at])
        if self.worst_value is None or (not math.isnan(self.worst_value)
                                        and (math.isnan(value) or value > self.worst_value)):
            self.worst_value, self.worst_index = value, offset + at


def _compare_sparse_entries(where: str, expected: torch.Tensor, got: torch.Tensor, atol: float,
                            rtol: float) -> dict[str, Any]:
    """Huge sparse outputs: the same nonzero pattern, then the values within tolerance."""
    e, g = expected.coalesce(), got.coalesce()
    if e.indices().shape != g.indices().shape or not torch.equal(e.indices(), g.indices()):
        return _mismatch("values", failures.OUTPUT_MISMATCH, where, f"{where}: sparse pattern differs from the "
                                                                     f"expected one ({g._nnz()} vs {e._nnz()} entries)")
    return compare_tensors(f"{where}.values()", e.values(), g.values(), atol, rtol)


def _compare_scalar(where: str, expected: Any, got: Any, atol: float, rtol: float) -> dict[str, Any]:
    if isinstance(expected, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        g, e = float(got), expected
        if math.isnan(g) or math.isnan(e):
            return _mismatch("nan", failures.OUTPUT_MISMATCH, where, f"{where}: got {g!r}, expected {e!r} (NaN)")
        if math.isinf(e) or math.isinf(g):
            ok = g == e
        else:
            ok = abs(g - e) <= atol + rtol * abs(e)
        if ok:
            return {"ok": True, "max_abs_err": 0.0 if math.isinf(e) else abs(g - e)}
        return _mismatch("values", failures.OUTPUT_MISMATCH, where, f"{where}: got {g!r}, expected {e!r}",
                         max_abs_err=abs(g - e))
    if type(got) is not type(expected):
        return _mismatch("structure", failures.SHAPE_MISMATCH, where,
                         f"{where}: got a {type(got).__name__}, expected a {type(expected).__name__}")
    if got != expected:
        return _mismatch("values", failures.OUTPUT_MISMATCH, where, f"{where}: got {got!r}, expected {expected!r}")
    return {"ok": True}


def structure_issue(expected: Any, got: Any, where: str = "out") -> str | None:
    """Why `got` does not have `expected`'s structure (containers, dict keys, leaf kinds), or None."""
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"{where}: expected a {type(expected).__name__} of {len(expected)}, got {type(got).__name__}"
        if len(got) != len(expected):
            return f"{where}: expected {len(expected)} item(s), got {len(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            issue = structure_issue(e, g, f"{where}[{i}]")
            if issue:
                return issue
        return None
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{where}: expected a dict, got {type(got).__name__}"
        if set(map(str, got)) != set(map(str, expected)):
            missing = sorted(set(map(str, expected)) - set(map(str, got)))
            extra = sorted(set(map(str, got)) - set(map(str, expected)))
            return f"{where}: dict keys differ (missing {missing[:5]}, unexpected {extra[:5]})"
        by_str = {str(k): v for k, v in got.items()}
        for key in sorted(expected, key=str):
            issue = structure_issue(expected[key], by_str[str(key)], f"{where}[{key!r}]")
            if issue:
                return issue
        return None
    if isinstance(expected, torch.Tensor) and not isinstance(got, torch.Tensor):
        return f"{where}: expected a tensor, got {type(got).__name__}"
    return None


def compare_outputs(expected: Any, got: Any, atol: float, rtol: float, stop_at_first: bool = False) -> dict[str, Any]:
    """Compare a whole output structure. Returns {"ok": True, ...} or the first mismatch."""
    issue = structure_issue(expected, got)
    if issue:
        return _mismatch("structure", failures.SHAPE_MISMATCH, "out", issue)
    worst_abs = 0.0
    worst_rel = 0.0
    for (where, e), (_, g) in zip(flatten(expected), flatten(got)):
        if isinstance(e, torch.Tensor):
            result = compare_tensors(where, e, g, atol, rtol, stop_at_first)
        else:
            result = _compare_scalar(where, e, g, atol, rtol)
        if not result["ok"]:
            return result
        worst_abs = max(worst_abs, result.get("max_abs_err", 0.0))
        worst_rel = max(worst_rel, result.get("max_rel_err", 0.0))
    return {"ok": True, "max_abs_err": worst_abs, "max_rel_err": worst_rel}


def matches(expected: Any, got: Any, atol: float, rtol: float) -> bool:
    """compare_outputs(...)["ok"], found sooner when it is False (the scan stops at the first chunk out of
    tolerance): for the judge's questions that need only a yes or no (is a wrong output the previous call's
    answer, is a late one right)."""
    return bool(compare_outputs(expected, got, atol, rtol, stop_at_first=True)["ok"])


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = _dense(t)
    return t.detach().cpu().contiguous().view(-1).view(torch.uint8)


def same_values(a: Any, b: Any) -> bool:
    """Bitwise equality of two structures (NaN-safe)."""
    if structure_issue(a, b) is not None:
        return False
    a_items, b_items = flatten(a), flatten(b)
    if len(a_items) != len(b_items):
        return False
    for (_, x), (_, y) in zip(a_items, b_items):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(_bytes(x), _bytes(y)):
                return False
        elif x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
            return False
    return True
