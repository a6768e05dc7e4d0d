"""harness.compiling.slots: at most N builds at once, each knows how many ran beside it, and a build alone waits
for the running ones, keeps new ones out (ahead of them, so it cannot starve) and gives way to Ctrl-C."""

from __future__ import annotations

import threading
import time

import pytest

from harness import cancel
from harness.compiling.slots import BuildSlots


def _eventually(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_no_more_than_the_slots_and_each_hold_counts_its_neighbours():
    slots = BuildSlots(2)
    with slots.shared() as first:
        assert first.beside == 0
        with slots.shared() as second:
            assert first.beside == 1 and second.beside == 1
            third_in = threading.Event()

            def third() -> None:
                with slots.shared():
                    third_in.set()

            waiter = threading.Thread(target=third)
            waiter.start()
            assert not third_in.wait(0.3) and slots.running() == 2  # both slots taken: it waits
        waiter.join(10)  # the second's slot went to it
        assert third_in.is_set() and first.beside == 1
    assert slots.running() == 0
    with slots.shared() as lone:
        assert lone.beside == 0


def test_a_build_alone_waits_for_the_running_ones_and_goes_before_later_ones():
    slots = BuildSlots(4)
    order: list[str] = []
    running = slots.shared()
    running.__enter__()

    def alone() -> None:
        with slots.alone() as hold:
            order.append(f"alone {slots.running()}")
            time.sleep(0.2)
            assert hold.beside == 0

    def later() -> None:
        with slots.shared():
            order.append("later")

    first = threading.Thread(target=alone)
    first.start()
    time.sleep(0.2)
    second = threading.Thread(target=later)  # asks after the build alone did: it must wait behind it
    second.start()
    time.sleep(0.2)
    assert order == [] and slots.running() == 1  # free slots, yet neither started beside the running build
    running.__exit__(None, None, None)
    first.join(10)
    second.join(10)
    assert order == ["alone 1", "later"]


def test_a_wait_for_a_slot_gives_way_to_an_interruption():
    slots = BuildSlots(1)
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            with slots.alone():
                pass
        except cancel.Cancelled as exc:
            raised.append(exc)

    with slots.shared():
        waiter = threading.Thread(target=wait)
        waiter.start()
        try:
            cancel.request()
            assert _eventually(lambda: bool(raised))
        finally:
            cancel.reset()
        waiter.join(10)
    with slots.shared() as hold:  # the interrupted wait left nothing behind: a new build starts at once
        assert hold.beside == 0


def test_no_slot_is_refused():
    with pytest.raises(ValueError):
        BuildSlots(0)
