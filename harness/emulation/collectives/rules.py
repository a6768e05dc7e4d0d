"""What NCCL accepts and how it reduces, for the host collectives. Rank side; torch only.

The backend stands in for NCCL (ranks that share a GPU) and for gloo (CPU runs), so its rules are
NCCL's for CUDA tensors, where a reference written for NCCL must behave as it would there, and a
superset on CPU tensors (gloo's bitwise reductions as well; NCCL's AVG and PREMUL_SUM as well).

Facts taken from torch's ProcessGroupNCCL (data: the tables below):
- dtypes: int8, uint8, int32, int64, float16, float32, float64, bfloat16, bool (as uint8) and the
  float8 types; anything else is a TypeError ("Input tensor data type is not supported for NCCL process
  group").
- reductions: SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM; BAND, BOR and BXOR are a ValueError. Booleans
  reduce as uint8 with SUM -> MAX and PRODUCT -> MIN (logical or / and); AVG of booleans is refused.
- tensors must be dense and contiguous.

Reductions run on the host, in rank order 0..W-1 on every rank, so every rank gets the same bits (as a
ring all-reduce gives every rank the same bits); each step rounds to the tensor's dtype, as each hop of
NCCL's ring does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

NCCL_DTYPES = frozenset({
    torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64,
    torch.bfloat16, torch.bool, torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
})
NCCL_REDUCTIONS = frozenset({"SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM"})
BITWISE = frozenset({"BAND", "BOR", "BXOR"})
_FLOAT8 = frozenset({torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz})


def op_name(reduce_op: Any) -> str:
    """'SUM', 'AVG', ... from a ReduceOp, its RedOpType, or an options object's reduceOp."""
    kind = getattr(reduce_op, "op", reduce_op)
    name = getattr(kind, "name", None) or str(kind).rsplit(".", 1)[-1]
    return str(name).upper()


def premul_factor(reduce_op: Any) -> float | torch.Tensor:
    factor = getattr(reduce_op, "factor", None)
    if factor is None:
        raise ValueError("PREMUL_SUM: this torch does not expose the ReduceOp's factor to Python backends")
    return factor  # type: ignore[no-any-return]  # a float or a one-element tensor, torch says which


def check_tensor(t: torch.Tensor, what: str) -> None:
    """NCCL's refusals for one tensor, on CUDA tensors; CPU tensors only need to be dense and contiguous
    (gloo refuses the rest too)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"{what}: only dense tensors are supported, got layout {t.layout}")
    if not t.is_contiguous():
        raise ValueError(f"{what}: Tensors must be contiguous")
    if t.device.type == "cuda" and t.dtype not in NCCL_DTYPES:
        raise TypeError(f"{what}: Input tensor data type is not supported for NCCL process group: {t.dtype}")


def check_reduction(name: str, dtype: torch.dtype, device_type: str) -> None:
    if name in BITWISE:
        if device_type == "cuda":
            raise ValueError(f"Cannot use ReduceOp.{name} with NCCL")
        if dtype.is_floating_point or dtype.is_complex:
            raise ValueError(f"Cannot use ReduceOp.{name} with non-integral dtype {dtype}")
        return
    if name not in NCCL_REDUCTIONS:
        raise ValueError(f"unsupported reduction ReduceOp.{name}")
    if dtype == torch.bool and name in ("AVG", "PREMUL_SUM"):
        raise ValueError(f"Cannot use ReduceOp.{name} with boolean inputs")


def combine(parts: Sequence[torch.Tensor], name: str, reduce_op: Any = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce equal-shaped host tensors given in rank order into `out` (a new tensor of their dtype where
    None). `out` may be one of the parts: each step reads an element before it writes that element, and the
    last part is read in the last step only."""
    dtype = parts[0].dtype
    if dtype == torch.bool:  # NCCL reduces booleans as uint8: SUM is MAX (or), PRODUCT is MIN (and)
        name = {"SUM": "MAX", "PRODUCT": "MIN"}.get(name, name)
    if name == "PREMUL_SUM":
        factor = premul_factor(reduce_op)
        return _fold([_mul(p, factor) for p in parts], "SUM", out)
    result = _fold(parts, name, out)
    if name == "AVG":
        n = len(parts)
        if dtype in _FLOAT8:
            result.copy_(_cast(_wide(result) / n, dtype))
        elif dtype.is_floating_point or dtype.is_complex:
            result.div_(n)  # in the dtype, rounded once: the same bits as `result / n`
        else:
            result.copy_(torch.div(result, n, rounding_mode="trunc"))
    return result


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in _FLOAT8 else t


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype) if t.dtype != dtype else t


def _mul(t: torch.Tensor, factor: float | torch.Tensor) -> torch.Tensor:
    f = factor.to("cpu") if isinstance(factor, torch.Tensor) else factor
    return _cast(_wide(t) * f, t.dtype)


_STEPS: dict[str, Callable[..., torch.Tensor]] = {
    "SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum,
    "BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor,
}


def _fold(parts: Sequence[torch.Tensor], name: str, out: torch.Tensor | None) -> torch.Tensor:
    """((p0 op p1) op p2) ..., rounding to the dtype after every step (each step is one torch op in the
    dtype, which rounds once; float8 steps go through float32, where torch has no float8 arithmetic)."""
    step = _STEPS.get(name)
    if step is None:
        raise ValueError(f"unsupported reduction ReduceOp.{name}")
    dtype = parts[0].dtype
    result = out if out is not None else torch.empty_like(parts[0])
    if len(parts) == 1:
        return result.copy_(parts[0]) if result.data_ptr() != parts[0].data_ptr() else result
    if dtype in _FLOAT8:
        acc = parts[0]
        for part in parts[1:]:
            acc = _cast(step(_wide(acc), _wide(part)), dtype)
        return result.copy_(acc)
    # Every step but the last into a scratch: `out` may be a later part, which must be read intact.
    acc = parts[0]
    if len(parts) > 2:
        acc = step(parts[0], parts[1])
        for part in parts[2:-1]:
            step(acc, part, out=acc)
    return step(acc, parts[-1], out=result)
