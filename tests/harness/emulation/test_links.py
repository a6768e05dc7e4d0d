"""Who reads the host collectives' connections (harness.emulation.collectives.links): inside an operation its
caller does, also while a send of its would block, and the draining thread only between operations. Two
ranks' links in one process, over an in-process store."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from harness.emulation.collectives.links import COLLECTIVE, Links

META = {"op": "t", "dtype": "torch.uint8", "numel": 0}


@pytest.fixture
def pair() -> Iterator[tuple[Links, Links]]:
    store = dist.HashStore()  # type: ignore[attr-defined]  # exported by torch, not listed in its stubs
    made: dict[int, Links] = {}
    threads = [threading.Thread(target=lambda r=r: made.__setitem__(r, Links(store, r, 2, timedelta(seconds=60))))
               for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(made) == [0, 1]
    yield made[0], made[1]
    for links in made.values():
        links.close()


def _filed(links: Links, key: int) -> bool:
    with links._cond:
        return (1, COLLECTIVE, key) in links._box


def test_inside_an_operation_a_message_waits_for_its_caller_and_between_them_the_thread_drains(pair) -> None:
    a, b = pair
    with a.owned():
        b.send(0, COLLECTIVE, 1, META, b"x" * 1024)
        time.sleep(0.3)  # room for a draining thread that was wrongly woken to file it (it must not be)
        assert not _filed(a, 1)
        assert bytes(a.take(1, COLLECTIVE, 1, "t").payload) == b"x" * 1024
    b.send(0, COLLECTIVE, 2, META, b"y" * 1024)  # no operation under way on rank 0: its thread files it
    deadline = time.monotonic() + 60
    while not _filed(a, 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _filed(a, 2)


@pytest.mark.parametrize("size, count", [(512 << 10, 64), (32 << 20, 1)], ids=["pieces", "large"])
def test_two_ranks_that_send_each_other_more_than_the_sockets_hold_both_finish(pair, size, count) -> None:
    """Both inside an operation (their threads kept off), both sending 32 MiB first: each send of a piece
    reads while it would block, a large send hands the connections to the draining thread meanwhile, so
    neither waits for the other forever."""
    a, b = pair
    data = b"z" * size
    got: dict[int, list[bytes]] = {}

    def exchange(me: Links, peer: int) -> None:
        with me.owned():
            for key in range(count):
                me.send(peer, COLLECTIVE, key, META, data)
            got[me.rank] = [bytes(me.take(peer, COLLECTIVE, key, "t").payload) for key in range(count)]

    threads = [threading.Thread(target=exchange, args=(a, 1), daemon=True),
               threading.Thread(target=exchange, args=(b, 0), daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert got == {0: [data] * count, 1: [data] * count}
