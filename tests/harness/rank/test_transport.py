"""What leaves a candidate's rank is data, and the judge reads it without trusting it: round trips of
every structure PKB references use, refusals of anything else, files a hostile rank could shape
(symbolic links, hard links, oversized, corrupted), and the comparison of the structures that come back."""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from harness.common import failures
from harness.common.compare import compare_outputs, structure_issue
from harness.rank import transport


def _tree() -> dict[Any, Any]:
    gen = torch.Generator().manual_seed(0)
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2, 3], [1, 0, 2]]), torch.randn(3, generator=gen), (4, 3))
    return {"loss": torch.randn((), generator=gen), "parts": [torch.randn(3, 2, generator=gen).bfloat16(),
                                                             (torch.arange(5), torch.zeros(0, 4))],
            7: sparse, "scale": 0.5, "name": "x", "none": None, "flag": True, "bad": float("nan"),
            "big": float("-inf"), "mask": torch.tensor([True, False])}


def test_every_structure_round_trips(tmp_path):
    value = _tree()
    path = tmp_path / "out.bin"
    transport.write_tree(path, value)
    back = transport.read_tree(path, 1 << 30)
    assert isinstance(back, dict) and set(back) == set(value)
    assert back["parts"][0].dtype == torch.bfloat16 and torch.equal(back["parts"][0], value["parts"][0])
    assert isinstance(back["parts"], list) and isinstance(back["parts"][1], tuple)
    assert back[7].layout == torch.sparse_coo and torch.equal(back[7].to_dense(), value[7].to_dense())
    assert back["scale"] == 0.5 and back["name"] == "x" and back["none"] is None and back["flag"] is True
    assert math.isnan(back["bad"]) and back["big"] == float("-inf")
    assert back["parts"][1][1].shape == (0, 4)
    ok = compare_outputs({k: v for k, v in value.items() if k != "bad"},
                         {k: v for k, v in back.items() if k != "bad"}, 1e-6, 1e-6)
    assert ok["ok"], ok


class _Sub(torch.Tensor):
    pass


@pytest.mark.parametrize("value, words", [
    (object(), "builtins.object"),
    ({(1, 2): torch.zeros(1)}, "key of type tuple"),
    ([torch.zeros(2).as_subclass(_Sub)], "not a plain torch.Tensor"),
    (torch.zeros(2, 2).to_sparse_csr(), "layout"),
    (torch.nn.Linear(2, 2), "torch.nn.modules.linear.Linear"),
])
def test_anything_else_is_refused_with_a_reason(tmp_path, value, words):
    assert words in (transport.describe_unsupported(value) or "")
    with pytest.raises(transport.UnsupportedValue):
        transport.write_tree(tmp_path / "x.bin", value)


def test_corrupted_files_raise_transport_errors_only(tmp_path):
    """A rank can write any bytes there: every corruption is a TransportError (the candidate's failure),
    never another exception inside the judge."""
    path = tmp_path / "out.bin"
    transport.write_tree(path, _tree())
    good = path.read_bytes()
    rng = random.Random(1)
    outcomes = {"parsed": 0, "refused": 0}
    for trial in range(400):
        data = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if trial % 5 == 0:
            data = data[:rng.randrange(len(data))]
        try:
            transport.parse_tree(bytes(data))
            outcomes["parsed"] += 1
        except transport.TransportError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 50 and sum(outcomes.values()) == 400
    header = transport.MAGIC + (1 << 62).to_bytes(8, "little") + b"{}"
    with pytest.raises(transport.TransportError, match="header size"):
        transport.parse_tree(header)
    with pytest.raises(transport.TransportError, match="nesting|malformed"):
        nested = b'{"seq": [' * 100 + b'{"value": 1}' + b']}' * 100
        transport.parse_tree(transport.MAGIC + len(nested).to_bytes(8, "little") + nested)


def test_the_judge_opens_only_plain_files_of_bounded_size(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not for candidates")
    link = tmp_path / "out.bin"
    os.symlink(secret, link)
    with pytest.raises(transport.TransportError, match="not a plain file"):
        transport.read_tree(link, 1 << 20)
    hard = tmp_path / "hard.bin"
    os.link(secret, hard)
    with pytest.raises(transport.TransportError, match="not a plain file"):
        transport.read_tree(hard, 1 << 20)
    big = tmp_path / "big.bin"
    transport.write_tree(big, torch.zeros(1 << 16))
    with pytest.raises(transport.TransportError, match="more than"):
        transport.read_tree(big, 1024)
    with pytest.raises(transport.TransportError, match="was not written"):
        transport.read_tree(tmp_path / "missing.bin", 1024)
    os.mkfifo(tmp_path / "fifo.bin")
    with pytest.raises(transport.TransportError):
        transport.read_tree(tmp_path / "fifo.bin", 1024)  # no blocking read on a FIFO


def test_structure_comparison_names_what_differs():
    expected = {"a": torch.zeros(2), "b": [torch.ones(1), 3]}
    assert "dict keys differ" in (structure_issue(expected, {"a": torch.zeros(2)}) or "")
    assert "expected 2 item(s)" in (structure_issue(expected, {"a": torch.zeros(2), "b": [torch.ones(1)]}) or "")
    wrong = compare_outputs(expected, {"a": torch.zeros(2), "b": [torch.ones(1), 4]}, 0.0, 0.0)
    assert not wrong["ok"] and wrong["verdict"] == failures.OUTPUT_MISMATCH and "out['b'][1]" in wrong["message"]
    close = compare_outputs({"loss": 1.0}, {"loss": 1.001}, 1e-2, 1e-2)
    assert close["ok"]
    assert not compare_outputs({"loss": 1.0}, {"loss": float("nan")}, 1.0, 1.0)["ok"]  # NaN never passes
    assert compare_outputs((torch.ones(2),), [torch.ones(2)], 0.0, 0.0)["ok"]  # a list for a tuple is fine


def test_inputs_carry_process_groups_as_their_ranks(tmp_path):
    path = tmp_path / "in.pt"
    inputs = (torch.arange(3), {"n": 2, "lin": torch.nn.Linear(2, 2)}, transport.GroupRef((0, 1)))
    transport.save_inputs(path, inputs)
    back = transport.load_inputs(path, torch.device("cpu"), {(0, 1): "the group", None: "world"})
    assert back[2] == "the group" and torch.equal(back[0], inputs[0])
    assert isinstance(back[1]["lin"], torch.nn.Linear)
    with pytest.raises(transport.TransportError, match="did not make"):
        transport.load_inputs(path, torch.device("cpu"), {None: "world"})


def test_scalar_and_dtype_mismatches_are_shape_mismatches():
    assert compare_outputs(torch.zeros(2), torch.zeros(2, dtype=torch.float64), 1, 1)["verdict"] == \
        failures.SHAPE_MISMATCH
    assert compare_outputs(1, "1", 0, 0)["verdict"] == failures.SHAPE_MISMATCH


def _with_header(good: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """`good` (a written output file) with its JSON header changed by `edit`; the data kept."""
    start = len(transport.MAGIC) + 8
    size = int.from_bytes(good[len(transport.MAGIC):start], "little")
    header = json.loads(good[start:start + size])
    edit(header)
    raw = json.dumps(header).encode()
    return transport.MAGIC + len(raw).to_bytes(8, "little") + raw + good[start + size:]


def test_hostile_headers_raise_transport_errors_only(tmp_path):
    """Headers a rank crafted (a dtype that is not a name, a sparse shape its indices cannot fill) are
    refused as TransportError, which the judge charges to the candidate, not any other exception."""
    path = tmp_path / "out.bin"
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.ones(2), (4,))
    transport.write_tree(path, {"a": torch.ones(2), "s": sparse})
    good = path.read_bytes()
    assert torch.equal(transport.parse_tree(good)["a"], torch.ones(2))

    def unhashable_dtype(h: dict[str, Any]) -> None:
        h["dict"][0][1]["tensor"]["dtype"] = []

    def sparse_shape_too_deep(h: dict[str, Any]) -> None:
        h["dict"][1][1]["sparse"]["shape"] = [4, 3]

    for edit in (unhashable_dtype, sparse_shape_too_deep):
        with pytest.raises(transport.TransportError):
            transport.parse_tree(_with_header(good, edit))


def test_tuple_subclasses_travel_as_tuples(tmp_path):
    """torch.Size (PKB's 28 returns one) and torch.return_types named tuples come back as plain tuples."""
    path = tmp_path / "out.bin"
    top = torch.max(torch.tensor([[1.0, 5.0], [2.0, 0.0]]), dim=1)
    transport.write_tree(path, (torch.Size([3, 4]), top))
    size, (values, indices) = transport.parse_tree(path.read_bytes())
    assert size == (3, 4) and type(size) is tuple
    assert torch.equal(values, torch.tensor([5.0, 2.0])) and torch.equal(indices, torch.tensor([1, 0]))
    assert compare_outputs((torch.Size([3, 4]),), ((3, 4),), 0.0, 0.0)["ok"]
