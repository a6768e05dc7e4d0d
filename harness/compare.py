"""Comparing one rank's outputs with the expected ones. Worker-safe: torch and the standard library.

A mismatch is described, not just detected: which output, what kind (structure, shape, dtype, values,
NaN), the largest absolute and relative error and where it sits. NaN never passes.

`count_mismatches` is the same rule without the description and without a host synchronization: the
timing loop uses it to verify every timed call's output on the device, outside the timed window.
"""

from __future__ import annotations

from typing import Any

import torch

from harness import failures


def flatten(value: Any, prefix: str = "out") -> list[tuple[str, Any]]:
    """Outputs as (path, leaf) pairs: a tensor, or tuples/lists of them, or plain scalars."""
    if isinstance(value, (tuple, list)):
        items: list[tuple[str, Any]] = []
        for i, v in enumerate(value):
            items.extend(flatten(v, f"{prefix}[{i}]"))
        return items
    return [(prefix, value)]


def _mismatch(kind: str, verdict: str, where: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "kind": kind, "verdict": verdict, "where": where, "message": message, **extra}


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


def compare_outputs(expected: Any, got: Any, atol: float, rtol: float) -> dict[str, Any]:
    """Compare a whole output structure. Returns {"ok": True, ...} or the first mismatch."""
    exp_items, got_items = flatten(expected), flatten(got)
    if len(exp_items) != len(got_items):
        return _mismatch(
            "structure",
            failures.SHAPE_MISMATCH,
            "out",
            f"expected {len(exp_items)} output(s), got {len(got_items)}",
        )
    worst_abs = 0.0
    worst_rel = 0.0
    for (where, e), (_, g) in zip(exp_items, got_items):
        if isinstance(e, torch.Tensor):
            result = compare_tensors(where, e, g, atol, rtol)
        elif e != g:
            result = _mismatch(
                "values", failures.OUTPUT_MISMATCH, where, f"{where}: got {g!r}, expected {e!r}"
            )
        else:
            result = {"ok": True}
        if not result["ok"]:
            return result
        worst_abs = max(worst_abs, result.get("max_abs_err", 0.0))
        worst_rel = max(worst_rel, result.get("max_rel_err", 0.0))
    return {"ok": True, "max_abs_err": worst_abs, "max_rel_err": worst_rel}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().view(-1).view(torch.uint8)


def same_values(a: Any, b: Any) -> bool:
    """Bitwise equality of two structures (detects mutated inputs and stale outputs; NaN-safe)."""
    a_items, b_items = flatten(a), flatten(b)
    if len(a_items) != len(b_items):
        return False
    for (_, x), (_, y) in zip(a_items, b_items):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(_bytes(x), _bytes(y)):
                return False
        elif x != y:
            return False
    return True


def structure_issue(expected: Any, got: Any) -> str | None:
    """Why `got` cannot be compared element-wise with `expected` (structure, type, shape, dtype,
    non-tensor values), or None. Host-only: reads metadata, never tensor contents."""
    exp_items, got_items = flatten(expected), flatten(got)
    if len(exp_items) != len(got_items):
        return f"expected {len(exp_items)} output(s), got {len(got_items)}"
    for (where, e), (_, g) in zip(exp_items, got_items):
        if isinstance(e, torch.Tensor):
            if type(g) is not torch.Tensor:  # noqa: E721 - subclasses (lazy tensors) are not plain outputs
                return f"{where}: expected a plain tensor, got {type(g).__name__}"
            if tuple(g.shape) != tuple(e.shape):
                return f"{where}: shape {tuple(g.shape)} but expected {tuple(e.shape)}"
            if g.dtype != e.dtype:
                return f"{where}: dtype {g.dtype} but expected {e.dtype}"
        elif isinstance(g, torch.Tensor) or e != g:
            return f"{where}: got {g!r}, expected {e!r}"
    return None


def count_mismatches(expected: Any, got: Any, atol: float, rtol: float, chunk: int = 1 << 24) -> torch.Tensor:
    """Number of elements of `got` outside tolerance, as a 0-dim int64 tensor on the outputs' device.

    The rule of compare_tensors (NaN never passes, an infinity must match an infinity of the same
    sign, integers compare exactly), queued on the current stream without synchronizing, in chunks so
    the float64 temporaries stay small. Call structure_issue first: this assumes matching structure,
    shapes and dtypes.
    """
    total: torch.Tensor | None = None
    for (_, e), (_, g) in zip(flatten(expected), flatten(got)):
        if not isinstance(e, torch.Tensor) or e.numel() == 0:
            continue
        e_flat, g_flat = e.detach().reshape(-1), g.detach().to(e.device).reshape(-1)
        for start in range(0, e_flat.numel(), chunk):
            bad = _bad_elements(e_flat[start:start + chunk], g_flat[start:start + chunk], atol, rtol).sum()
            total = bad if total is None else total + bad
    if total is None:
        return torch.zeros((), dtype=torch.int64)
    return total


def _bad_elements(e: torch.Tensor, g: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    if not (e.is_floating_point() or e.is_complex()):
        return g != e
    wide = torch.complex128 if e.is_complex() else torch.float64
    gd, ed = g.to(wide), e.to(wide)
    diff = (gd - ed).abs()
    if e.is_complex():
        nan = torch.isnan(gd.real) | torch.isnan(gd.imag) | torch.isnan(ed.real) | torch.isnan(ed.imag)
        inf = torch.isinf(gd.abs()) ^ torch.isinf(ed.abs())
        diff, limit = diff.real, (atol + rtol * ed.abs()).real
    else:
        nan = torch.isnan(gd) | torch.isnan(ed)
        inf = torch.isinf(gd) ^ torch.isinf(ed)
        limit = atol + rtol * ed.abs()
    # Two infinities of the same sign match (their diff is NaN, as in compare_tensors); of opposite
    # signs, or an infinity against a finite value, the diff is infinite.
    return nan | inf | torch.isinf(diff) | (diff > limit)
