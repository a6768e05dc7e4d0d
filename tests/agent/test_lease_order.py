"""agent.lease_order: which waiting request is served next. Exclusive requests first and alone, shared ones
up to the room of a group, and shared ones beside a lease held for long while an exclusive request waits."""

from __future__ import annotations

import math

from agent.lease_order import Group, Request, next_grant

EXCLUSIVE, SHARED = False, True


def queue(*kinds: bool) -> list[Request]:
    return [Request(ticket=t, shared=kind) for t, kind in enumerate(kinds)]


def test_the_oldest_request_of_a_plain_scheduler_takes_the_first_empty_group():
    groups = [Group(started=(0.0,), exclusive=True), Group(), Group()]
    assert next_grant(queue(EXCLUSIVE, EXCLUSIVE), groups, room=1, now=100.0) == (0, 1)
    assert next_grant(queue(EXCLUSIVE), [Group(started=(0.0,), exclusive=True)], room=1, now=100.0) is None


def test_an_exclusive_request_goes_before_older_shared_ones_and_only_onto_an_empty_group():
    empty_one = [Group(started=(5.0,)), Group()]
    assert next_grant(queue(SHARED, SHARED, EXCLUSIVE), empty_one, room=4, now=10.0) == (2, 1)
    # no group is empty: it waits, and so do the shared requests while the holders are recent
    busy = [Group(started=(5.0,)), Group(started=(6.0, 7.0))]
    assert next_grant(queue(SHARED, EXCLUSIVE, SHARED), busy, room=4, now=10.0) is None


def test_shared_requests_fill_the_least_held_group_up_to_its_room_and_never_an_exclusive_one():
    groups = [Group(started=(1.0, 2.0)), Group(started=(3.0,)), Group(started=(4.0,), exclusive=True)]
    assert next_grant(queue(SHARED, SHARED), groups, room=2, now=5.0) == (0, 1)
    full = [Group(started=(1.0, 2.0)), Group(started=(3.0,), exclusive=True)]
    assert next_grant(queue(SHARED), full, room=2, now=5.0) is None


def test_while_an_exclusive_request_waits_the_oldest_shared_one_goes_beside_a_lease_held_for_long():
    groups = [Group(started=(0.0,))]
    waiting = queue(SHARED, EXCLUSIVE, SHARED)
    assert next_grant(waiting, groups, room=4, now=29.9, long_hold_s=30.0) is None
    assert next_grant(waiting, groups, room=4, now=30.0, long_hold_s=30.0) == (0, 0)
    assert next_grant(waiting, groups, room=4, now=1e6, long_hold_s=math.inf) is None  # the plain order
    # only onto a group that will not empty soon: the other, recently taken group is left to empty
    two = [Group(started=(50.0,)), Group(started=(0.0, 45.0))]
    assert next_grant(waiting, two, room=4, now=60.0, long_hold_s=30.0) == (0, 1)
    # ...and only where there is room
    full = [Group(started=(0.0, 1.0, 2.0, 3.0))]
    assert next_grant(waiting, full, room=4, now=60.0, long_hold_s=30.0) is None


def test_an_exclusive_request_still_takes_a_group_the_moment_it_empties():
    waiting = queue(SHARED, EXCLUSIVE)
    assert next_grant(waiting, [Group(started=(0.0,)), Group()], room=4, now=100.0) == (1, 1)
