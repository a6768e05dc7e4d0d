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


def compare_tensors(where: str, expected: torch.Tensor, got: Any, atol: float, rtol: float) -> dict[str, Any]:
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
    g = got_cpu.to(torch.complex128 if got.is_complex() else torch.float64)
    e = exp_cpu.to(torch.complex128 if expected.is_complex() else torch.float64)
    nan = torch.isnan(g) | torch.isnan(e)
    if got.is_complex():
        nan = torch.isnan(g.real) | torch.isnan(g.imag) | torch.isnan(e.real) | torch.isnan(e.imag)
    if bool(nan.any()):
        idx = int(nan.flatten().nonzero()[0])
        return _mismatch(
            "nan",
            failures.OUTPUT_MISMATCH,
            where,
            f"{where}: NaN at flat index {idx} ({int(nan.sum())} NaNs in all)",
            index=idx,
        )
    diff = (g - e).abs()
    if got.is_complex():
        diff = diff.real
    inf_mismatch = torch.isinf(diff) | (torch.isinf(g.abs() if got.is_complex() else g) ^ torch.isinf(
        e.abs() if got.is_complex() else e))
    limit = atol + rtol * e.abs()
    if got.is_complex():
        limit = limit.real
    bad = (diff > limit) | inf_mismatch
    finite_diff = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))
    max_abs = float(finite_diff.max())
    rel = finite_diff / e.abs().clamp_min(1e-12)
    if got.is_complex():
        rel = rel.real
    max_rel = float(rel.max())
    if bool(bad.any()):
        n_bad = int(bad.sum())
        worst = int((diff - limit).flatten().argmax())
        return _mismatch(
            "values",
            failures.OUTPUT_MISMATCH,
            where,
            f"{where}: {n_bad} of {got.numel()} elements outside atol={atol:g} rtol={rtol:g}; "
            f"max abs err {max_abs:.4g}, max rel err {max_rel:.4g}; worst at flat index {worst}: "
            f"got {g.flatten()[worst].item():.6g}, expected {e.flatten()[worst].item():.6g}",
            max_abs_err=max_abs,
            max_rel_err=max_rel,
            mismatched=n_bad,
            index=worst,
        )
    return {"ok": True, "max_abs_err": max_abs, "max_rel_err": max_rel}


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


def compare_outputs(expected: Any, got: Any, atol: float, rtol: float) -> dict[str, Any]:
    """Compare a whole output structure. Returns {"ok": True, ...} or the first mismatch."""
    issue = structure_issue(expected, got)
    if issue:
        return _mismatch("structure", failures.SHAPE_MISMATCH, "out", issue)
    worst_abs = 0.0
    worst_rel = 0.0
    for (where, e), (_, g) in zip(flatten(expected), flatten(got)):
        if isinstance(e, torch.Tensor):
            result = compare_tensors(where, e, g, atol, rtol)
        else:
            result = _compare_scalar(where, e, g, atol, rtol)
        if not result["ok"]:
            return result
        worst_abs = max(worst_abs, result.get("max_abs_err", 0.0))
        worst_rel = max(worst_rel, result.get("max_rel_err", 0.0))
    return {"ok": True, "max_abs_err": worst_abs, "max_rel_err": worst_rel}


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
