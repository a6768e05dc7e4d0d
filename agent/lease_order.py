"""Which waiting lease request the scheduler serves next, and on which group: its whole policy as one pure
function of the queue, the groups' live leases and the time, so a recorded run's lease log can be replayed
under it (benchmarks/lease_order_replay.py) as well as run by agent.scheduler.

Exclusive requests (a re-judge alone, a profile) go before shared ones, each kind oldest first: the group is
emptied once for every exclusive request waiting, not refilled between two of them. While an exclusive
request waits for a group to empty, shared requests are held back, with one exception: a group where a lease
has already been held for `long_hold_s` takes shared requests beside it. Such a group does not empty soon
whatever waits, and holding its other places idle cost the most in the shared replay on one H200
(2026-12-02, docs/measurements/pkb-runs.md): one evaluation building its extension inside the call (89 s) or judging a
75-million-element output (132 s), or one deadlock running out its 120 s check, held the GPU alone while
eleven samples waited, and the samples waiting for a lease spent as many slot-seconds there as in building.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# How long a lease must have been held before its group takes shared requests ahead of a waiting exclusive one.
# The evaluations of the shared replay held a median 11.3 s (p90 under 30 s); the holds that idled the GPU ran
# 60-130 s. `math.inf` gives the plain exclusive-first order.
LONG_HOLD_S = 30.0


@dataclass(frozen=True)
class Request:
    ticket: int  # asked order: lower asked earlier
    shared: bool


@dataclass(frozen=True)
class Group:
    started: tuple[float, ...] = ()  # when each live lease on the group was granted (same clock as `now`)
    exclusive: bool = False  # held by an exclusive lease


def next_grant(queue: Sequence[Request], groups: Sequence[Group], *, room: int, now: float,
               long_hold_s: float = LONG_HOLD_S) -> tuple[int, int] | None:
    """(ticket, group index) of the request to serve now, or None while every waiting request must wait.
    `room`: how many shared leases a group holds at most."""
    exclusive = sorted((r for r in queue if not r.shared), key=lambda r: r.ticket)
    shared = sorted((r for r in queue if r.shared), key=lambda r: r.ticket)
    if exclusive:
        empty = next((i for i, group in enumerate(groups) if not group.started), None)
        if empty is not None:
            return exclusive[0].ticket, empty
        places = [i for i in _with_room(groups, room)
                  if now - min(groups[i].started) >= long_hold_s]  # groups that will not empty soon
    else:
        places = _with_room(groups, room)
    if not shared or not places:
        return None
    # the least held group first: evaluations share a GPU only when every group holds some
    return shared[0].ticket, min(places, key=lambda i: (len(groups[i].started), i))


def _with_room(groups: Sequence[Group], room: int) -> list[int]:
    return [i for i, group in enumerate(groups) if not group.exclusive and len(group.started) < room]

