"""harness.rank.calls: the copies, fingerprints and comparisons a rank makes around a call, and the delay that
makes one rank late."""

from __future__ import annotations

import time
from typing import Any

import torch

from harness.rank import calls
from harness.rank.calls import call_with_snapshots, clone_tree, delay, fingerprint, leaves, same_bytes, snapshot

CPU = torch.device("cpu")


def test_leaves_walk_containers_in_a_fixed_order():
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    assert [t.item() for t in leaves({"z": a, "a": [b, (c,)]})] == [1.0, 2.0, 0.0]  # dict keys sorted
    assert list(leaves(3)) == [3]


def test_a_clone_can_be_modified_without_touching_the_original():
    original: dict[str, Any] = {"x": torch.arange(3.0), "rest": [torch.ones(2), 5]}
    copy = clone_tree(original)
    copy["x"].add_(1)
    copy["rest"][0].zero_()
    assert original["x"].tolist() == [0.0, 1.0, 2.0] and original["rest"][0].tolist() == [1.0, 1.0]
    assert copy["rest"][1] == 5 and isinstance(copy["rest"], list)


def test_same_bytes_and_fingerprints_see_one_changed_bit():
    x = torch.arange(1000, dtype=torch.float32)
    y = x.clone()
    assert same_bytes((x,), (y,)) and fingerprint((x,)) == fingerprint((y,))
    y.view(torch.int32)[500] ^= 1  # the lowest bit of one element
    assert not same_bytes((x,), (y,)) and fingerprint((x,)) != fingerprint((y,))


def test_a_snapshot_is_a_private_plain_copy():
    class Tagged(tuple):  # a subclass the candidate controls: the copy is a plain tuple
        pass

    live = Tagged((torch.ones(2),))
    copy = snapshot(live)
    live[0].zero_()
    assert type(copy) is tuple and copy[0].tolist() == [1.0, 1.0]


def test_a_late_rank_on_the_cpu_sleeps(monkeypatch):
    started = time.perf_counter()
    delay(0.05, CPU)
    assert time.perf_counter() - started >= 0.05  # a lower bound: load only makes it longer
    # No delay sleeps not at all: seen by the sleeps asked for, not by a clock a loaded machine would stretch.
    asked: list[float] = []
    monkeypatch.setattr(calls, "_sleep", asked.append)
    delay(0.0, CPU)
    delay(-1.0, CPU)
    assert asked == []
    delay(0.01, CPU)
    assert asked == [0.01]


def test_the_output_is_copied_at_return_and_again_later():
    held = torch.zeros(2)

    def call(x: torch.Tensor) -> torch.Tensor:
        held.copy_(x)
        return held

    live, at_return, later = call_with_snapshots(call, (torch.ones(2),), CPU, 0.0, 0, lambda out: True)
    live.fill_(7.0)  # what the candidate does to its output afterwards never reaches the copies
    assert at_return.tolist() == [1.0, 1.0] and later.tolist() == [1.0, 1.0]
    _, not_plain, none_later = call_with_snapshots(call, (torch.ones(2),), CPU, 0.0, 0, lambda out: False)
    assert not_plain is None and none_later is None


def test_a_fingerprint_is_the_same_for_any_chunk_and_is_the_exact_sums_of_the_bytes():
    """The reference pool and a candidate rank may sum in different chunks (by device): the numbers must
    not depend on it. Two per tensor leaf; empty tensors and non-tensors add none."""
    value = (torch.arange(-5000, 5000, dtype=torch.int64) * (1 << 40), torch.randn(3, 333), [torch.ones(0)], 7)
    prints = {tuple(fingerprint(value, chunk)) for chunk in (1, 3, 1000, 1 << 16, 1 << 24)}
    assert prints == {tuple(fingerprint(value))}

    expected = []
    for leaf in value[:2]:
        data = leaf.contiguous().view(-1).view(torch.uint8).tolist()
        expected += [sum(data), sum(b * ((i + 1) % 1_000_003) for i, b in enumerate(data))]
    assert fingerprint(value) == expected
