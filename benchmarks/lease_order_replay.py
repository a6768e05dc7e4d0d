"""A recorded run's lease requests served again under agent.lease_order's policy, in simulated time: how long
the same GPU work would have taken, and how long samples would have waited, for each `long_hold_s`.

    python benchmarks/lease_order_replay.py docs/measurements/2026-12-02-one-h200/replay-shared-4b.events.jsonl.gz \
        --long-hold-s inf 30 15 60

Each sample (the first word of a lease's label) is a chain of requests read from the run's events.jsonl:
its first request comes when it did in the run (its build finished), each later one as long after the
previous return as it did in the run, and each holds the GPU for as long as it did. What the log does not
say is estimated and counted: a request never granted (or never returned) holds for the median hold of its
kind. The estimate leaves out everything a policy changes besides the order: a sample that waits less
frees its concurrency slot sooner and the next build starts sooner; holds are kept at the length they had
beside the neighbours they had. `--long-hold-s inf` is the plain exclusive-first order the run had until
2026-12-02; its figure beside the run's own shows how close the simulation comes.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent import lease_order  # noqa: E402
from agent.report.leases import event_seconds, last_pass, lease_use, read_events  # noqa: E402


@dataclass
class Step:
    gap_s: float  # the first step: when it was asked, from the log's start; later ones: after the last return
    shared: bool
    hold_s: float | None  # None: the log does not say (estimated before simulating)


@dataclass
class Outcome:
    end_s: float  # the last return
    waited_s: float  # summed over requests: sample-seconds spent waiting for a lease
    held_s: float  # wall seconds at least one lease was held
    lease_s: float  # summed lease-seconds (evaluations at once = lease_s / end_s)


def chains(events: list[dict[str, object]]) -> dict[str, list[Step]]:
    """Each sample's requests in the order it made them, with the gaps and holds of the run."""
    stamped = [(t, e) for e in events if (t := event_seconds(e.get("timestamp"))) is not None]
    origin = stamped[0][0]
    steps: dict[str, list[Step]] = {}
    returned_at: dict[str, float] = {}
    granted_at: dict[str, float] = {}
    for at, event in stamped:
        kind, key = event.get("event"), str(event.get("label", "")).split(" ")[0]
        if kind == "lease_asked":
            gap = at - origin - returned_at.get(key, 0.0) if key in returned_at else at - origin
            steps.setdefault(key, []).append(Step(gap_s=gap, shared=bool(event.get("shared")), hold_s=None))
        elif kind == "lease_granted":
            granted_at[key] = at - origin
        elif kind == "lease_returned" and key in granted_at and steps.get(key):
            steps[key][-1].hold_s = float(str(event.get("held_s")))
            returned_at[key] = at - origin
    return steps


def estimate_missing(steps: dict[str, list[Step]]) -> int:
    """Fills the holds the log does not give with the median of their kind; returns how many it filled."""
    medians = {}
    for shared in (True, False):
        known = [s.hold_s for chain in steps.values() for s in chain if s.shared == shared and s.hold_s is not None]
        medians[shared] = statistics.median(known) if known else 10.0
    filled = 0
    for chain in steps.values():
        for step in chain:
            if step.hold_s is None:
                step.hold_s, filled = medians[step.shared], filled + 1
    return filled


def simulate(steps: dict[str, list[Step]], *, groups: int, room: int, long_hold_s: float) -> Outcome:
    """Discrete events: asks, returns, and the moments a hold turns long (the policy looks again then)."""
    position = {key: 0 for key in steps}
    asks: list[tuple[float, str]] = [(chain[0].gap_s, key) for key, chain in steps.items() if chain]
    heapq.heapify(asks)
    queue: list[lease_order.Request] = []
    waiting: dict[int, tuple[str, float]] = {}  # ticket -> (sample, asked at)
    live: list[list[tuple[float, float, str]]] = [[] for _ in range(groups)]  # (start, end, sample) per group
    exclusive: set[int] = set()
    now, waited, held, lease_s, last_end, ticket = 0.0, 0.0, 0.0, 0.0, 0.0, 0
    while asks or queue or any(live):
        while asks and asks[0][0] <= now:
            _, key = heapq.heappop(asks)
            queue.append(lease_order.Request(ticket=ticket, shared=steps[key][position[key]].shared))
            waiting[ticket] = (key, now)
            ticket += 1
        while True:
            view = [lease_order.Group(started=tuple(s for s, _, _ in held_by), exclusive=i in exclusive)
                    for i, held_by in enumerate(live)]
            grant = lease_order.next_grant(queue, view, room=room, now=now, long_hold_s=long_hold_s)
            if grant is None:
                break
            request = next(r for r in queue if r.ticket == grant[0])
            queue.remove(request)
            key, asked = waiting.pop(request.ticket)
            waited += now - asked
            hold = steps[key][position[key]].hold_s or 0.0
            live[grant[1]].append((now, now + hold, key))
            if not request.shared:
                exclusive.add(grant[1])
        moments = [end for held_by in live for _, end, _ in held_by]
        moments += [start + long_hold_s for held_by in live for start, _, _ in held_by if start + long_hold_s > now]
        moments += [asks[0][0]] if asks else []
        if not moments:
            break  # requests that can never be served (cannot happen with a valid policy): stop, do not spin
        later = min(moments)
        if any(live):
            held += later - now
        lease_s += sum(len(held_by) for held_by in live) * (later - now)
        now = later
        for index, held_by in enumerate(live):
            for lease in [lease for lease in held_by if lease[1] <= now]:
                held_by.remove(lease)
                exclusive.discard(index)
                key = lease[2]
                last_end = max(last_end, now)
                position[key] += 1
                if position[key] < len(steps[key]):
                    heapq.heappush(asks, (now + steps[key][position[key]].gap_s, key))
    return Outcome(end_s=last_end, waited_s=waited, held_s=held, lease_s=lease_s)


def recorded(events: list[dict[str, object]]) -> Outcome:
    """The run's own figures, for the calibration row."""
    waits = sum(float(str(e.get("waited_s"))) for e in events if e.get("event") == "lease_granted")
    holds = sum(float(str(e.get("held_s"))) for e in events if e.get("event") == "lease_returned")
    use = lease_use(events)
    return Outcome(end_s=use.wall_s, waited_s=waits, held_s=(use.busy_fraction or 0.0) * use.wall_s, lease_s=holds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("events", type=Path, help="a run's events.jsonl (or .jsonl.gz)")
    parser.add_argument("--long-hold-s", type=float, nargs="+", default=[math.inf, lease_order.LONG_HOLD_S])
    parser.add_argument("--groups", type=int, default=1, help="GPU groups of the run (one H200: 1)")
    parser.add_argument("--room", type=int, default=None,
                        help="shared leases per group (default: the run's capacity over --groups)")
    parser.add_argument("--out", type=Path, default=None, help="a folder for lease_order.json")
    args = parser.parse_args(argv)
    events = last_pass(read_events(args.events))
    started = next((e for e in events if e.get("event") == "run_started"), {})
    room = args.room or max(1, int(str(started.get("capacity", 1))) // args.groups)
    steps = chains(events)
    filled = estimate_missing(steps)
    print(f"{args.events}: {len(steps)} samples, {sum(map(len, steps.values()))} lease requests "
          f"({filled} holds estimated), {args.groups} group(s) of {room}")
    print("| order | last return s | sample-s waiting for a lease | evaluations at once |")
    print("|---|---|---|---|")
    own = recorded(events)
    print(f"| the run itself (log end; unfinished requests left out) | {own.end_s:.0f} | {own.waited_s:.0f} "
          f"| {own.lease_s / own.end_s:.2f} |")
    rows = []
    for long_hold_s in args.long_hold_s:
        outcome = simulate(steps, groups=args.groups, room=room, long_hold_s=long_hold_s)
        name = "exclusive first (until 2026-12-02)" if math.isinf(long_hold_s) else f"beside holds >= {long_hold_s:g} s"
        print(f"| {name} | {outcome.end_s:.0f} | {outcome.waited_s:.0f} | {outcome.lease_s / outcome.end_s:.2f} |")
        rows.append({"long_hold_s": None if math.isinf(long_hold_s) else long_hold_s, **asdict(outcome)})
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "lease_order.json").write_text(json.dumps(
            {"events": str(args.events), "samples": len(steps), "estimated_holds": filled, "groups": args.groups,
             "room": room, "recorded": asdict(own), "simulated": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
