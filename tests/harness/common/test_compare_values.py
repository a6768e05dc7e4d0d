"""harness.common.compare: the chunked comparison of floating tensors says exactly what the comparison of
the whole tensors at once said (the verdict, the counts, the maxima, the worst element and its message),
for every dtype, layout and special value, whatever the chunk size."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch

from harness.common import compare, failures


def whole_tensor_values(where: str, expected: torch.Tensor, got: torch.Tensor, atol: float,
                        rtol: float) -> dict[str, Any]:
    """The oracle: the floating-point comparison as it was made before chunking, on the whole tensors."""
    is_complex = got.is_complex()
    g = got.to(torch.complex128 if is_complex else torch.float64)
    e = expected.to(torch.complex128 if is_complex else torch.float64)
    nan = torch.isnan(g) | torch.isnan(e)
    if is_complex:
        nan = torch.isnan(g.real) | torch.isnan(g.imag) | torch.isnan(e.real) | torch.isnan(e.imag)
    if bool(nan.any()):
        idx = int(nan.flatten().nonzero()[0])
        return {"ok": False, "kind": "nan", "verdict": failures.OUTPUT_MISMATCH, "where": where,
                "message": f"{where}: NaN at flat index {idx} ({int(nan.sum())} NaNs in all)", "index": idx}
    diff = (g - e).abs()
    if is_complex:
        diff = diff.real
    inf_mismatch = torch.isinf(diff) | (torch.isinf(g.abs() if is_complex else g) ^ torch.isinf(
        e.abs() if is_complex else e))
    limit = atol + rtol * e.abs()
    if is_complex:
        limit = limit.real
    bad = (diff > limit) | inf_mismatch
    finite_diff = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))
    max_abs = float(finite_diff.max())
    rel = finite_diff / e.abs().clamp_min(1e-12)
    if is_complex:
        rel = rel.real
    max_rel = float(rel.max())
    if bool(bad.any()):
        n_bad = int(bad.sum())
        worst = int((diff - limit).flatten().argmax())
        return {"ok": False, "kind": "values", "verdict": failures.OUTPUT_MISMATCH, "where": where,
                "message": f"{where}: {n_bad} of {got.numel()} elements outside atol={atol:g} rtol={rtol:g}; "
                           f"max abs err {max_abs:.4g}, max rel err {max_rel:.4g}; worst at flat index {worst}: "
                           f"got {g.flatten()[worst].item():.6g}, expected {e.flatten()[worst].item():.6g}",
                "max_abs_err": max_abs, "max_rel_err": max_rel, "mismatched": n_bad, "index": worst}
    return {"ok": True, "max_abs_err": max_abs, "max_rel_err": max_rel}


SPECIALS = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-30, 3e38, -7.5]


def sprinkle(t: torch.Tensor, gen: torch.Generator, specials: list[float], share: float) -> torch.Tensor:
    """`t` with a share of its elements replaced by special values, at places drawn from `gen`."""
    flat = t.clone().reshape(-1)
    picks = torch.rand(flat.numel(), generator=gen) < share
    for i in picks.nonzero().flatten().tolist():
        value = specials[int(torch.randint(len(specials), (1,), generator=gen))]
        flat[i] = torch.tensor(complex(value, value) if flat.is_complex() else value)
    return flat.reshape(t.shape)


def pairs(dtype: torch.dtype, seed: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, expected, got) cases of one dtype: equal, close, far, with infinities, with NaN, strided."""
    gen = torch.Generator().manual_seed(seed)
    real = torch.float32 if dtype.is_complex else dtype
    base = torch.randn(5, 7, 3, generator=gen).to(real)
    if dtype.is_complex:
        base = torch.complex(base, torch.randn(5, 7, 3, generator=gen).to(real)).to(dtype)
    near = (base.to(torch.complex128 if dtype.is_complex else torch.float64)
            + 3e-3 * torch.randn(5, 7, 3, generator=gen)).to(dtype)
    far = (base * 4 + 1).to(dtype)
    no_nan = [v for v in SPECIALS if not math.isnan(v)]
    infinite = sprinkle(base, gen, no_nan, 0.15)
    cases = [
        ("equal", base, base.clone()),
        ("near", base, near),
        ("far", base, far),
        ("infinities in got", base, sprinkle(near, gen, no_nan, 0.15)),
        ("the same infinities", infinite, infinite.clone()),
        ("infinities on both sides", infinite, sprinkle(near, gen, no_nan, 0.15)),
        ("NaN", base, sprinkle(near, gen, SPECIALS, 0.1)),
        ("NaN expected", sprinkle(base, gen, SPECIALS, 0.1), near),
        ("strided", base.transpose(0, 2), near.transpose(0, 2)),
        ("a slice", base[:, 2:5], far[:, 1:4]),
        ("one element", base.reshape(-1)[:1], near.reshape(-1)[:1]),
        ("zero-dimensional", base.reshape(-1)[3].clone(), far.reshape(-1)[3].clone()),
    ]
    return cases


DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]
TOLERANCES = [(0.0, 0.0), (1e-2, 1e-2), (1e-5, 1e-3), (-1.0, 0.0)]


@pytest.mark.parametrize("chunk", [1, 4, 7, 64, 1 << 18])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chunks_of_any_size_say_what_the_whole_tensor_said(monkeypatch, chunk, dtype):
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", chunk)
    seen = set()
    for seed, (atol, rtol) in itertools.product(range(3), TOLERANCES):
        for name, expected, got in pairs(dtype, seed):
            want = whole_tensor_values("out", expected, got, atol, rtol)
            assert compare.compare_tensors("out", expected, got, atol, rtol) == want, (name, atol, rtol)
            seen.add((want["ok"], want.get("kind")))
    assert seen == {(True, None), (False, "values"), (False, "nan")}  # the cases reach every outcome


def test_the_worst_element_follows_argmax_through_an_infinity_on_both_sides(monkeypatch):
    """inf against inf has a NaN distance, which argmax takes for the largest: the whole-tensor comparison
    named it the worst element, so the chunks must too, wherever the chunk boundaries fall."""
    expected = torch.tensor([1.0, 2.0, float("inf"), 5.0, 6.0])
    got = torch.tensor([1.0, 90.0, float("inf"), 100.0, 6.0])
    for chunk in (1, 2, 3, 8):
        monkeypatch.setattr(compare, "CHUNK_ELEMENTS", chunk)
        result = compare.compare_tensors("out", expected, got, 1e-3, 1e-3)
        assert result == whole_tensor_values("out", expected, got, 1e-3, 1e-3)
        assert result["index"] == 2 and result["mismatched"] == 2


def test_the_first_nan_and_the_count_span_every_chunk(monkeypatch):
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 3)
    expected = torch.arange(10, dtype=torch.float32)
    got = expected.clone()
    got[[4, 8, 9]] = float("nan")
    got[1] = 50.0  # a value mismatch before the first NaN: the NaN is still the verdict
    result = compare.compare_tensors("out", expected, got, 0.0, 0.0)
    assert result["kind"] == "nan" and result["index"] == 4
    assert result["message"] == "out: NaN at flat index 4 (3 NaNs in all)"


def test_equal_outputs_report_no_error_without_an_element_pass():
    value = torch.tensor([1.5, float("inf"), -0.0, 3.0], dtype=torch.bfloat16)
    assert compare.compare_tensors("out", value, value.clone(), 0.0, 0.0) == \
        {"ok": True, "max_abs_err": 0.0, "max_rel_err": 0.0} == whole_tensor_values("out", value, value, 0.0, 0.0)
    # -0.0 and 0.0 are equal values: no error either way
    assert compare.compare_tensors("out", torch.zeros(3), -torch.zeros(3), 0.0, 0.0)["ok"]


@pytest.mark.parametrize("chunk", [1, 5, 1 << 18])
def test_matches_is_the_comparisons_yes_or_no(monkeypatch, chunk):
    """`matches` stops at the first chunk out of tolerance; its answer is still compare_outputs's, for every
    case above and for structures (a shape, a dtype, a scalar, a container)."""
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", chunk)
    answers = set()
    for dtype, (atol, rtol) in itertools.product(DTYPES, TOLERANCES):
        for name, expected, got in pairs(dtype, 7):
            want = compare.compare_outputs(expected, got, atol, rtol)["ok"]
            assert compare.matches(expected, got, atol, rtol) is want, (name, dtype, atol, rtol)
            answers.add(want)
    assert answers == {True, False}
    value = {"x": torch.ones(4), "n": [2, 3.0]}
    assert compare.matches(value, {"x": torch.ones(4), "n": [2, 3.0]}, 0.0, 0.0)
    assert not compare.matches(value, {"x": torch.ones(5), "n": [2, 3.0]}, 0.0, 0.0)
    assert not compare.matches(value, {"x": torch.ones(4, dtype=torch.float64), "n": [2, 3.0]}, 0.0, 0.0)
    assert not compare.matches(value, {"x": torch.ones(4), "n": [2, 3.5]}, 0.0, 0.0)
    assert not compare.matches(value, {"x": torch.ones(4)}, 0.0, 0.0)


def test_a_scan_stopped_early_reads_only_up_to_the_first_bad_chunk(monkeypatch):
    """What makes `matches` cheap on a wrong output: the chunks after the first bad one are never compared."""
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 4)
    seen: list[int] = []
    add = compare._ValueStats.add

    def counting(self, got, expected, atol, rtol, offset):
        seen.append(offset)
        return add(self, got, expected, atol, rtol, offset)

    monkeypatch.setattr(compare._ValueStats, "add", counting)
    expected = torch.zeros(40)
    got = expected.clone()
    got[9] = 1.0
    assert not compare.matches(expected, got, 0.0, 0.0)
    assert seen == [0, 4, 8]
    seen.clear()
    assert compare.compare_outputs(expected, got, 0.0, 0.0)["mismatched"] == 1
    assert seen == list(range(0, 40, 4))  # the full comparison reads every chunk
