"""A recorded run's lease requests served again under agent.lease_order's policy, in simulated time: how long
the same samples would have taken, and how long they would have waited for the GPU, for each `long_hold_s`.

    python benchmarks/lease_order_replay.py docs/measurements/2026-12-02-one-h200/replay-shared-4b.events.jsonl.gz \
        --long-hold-s inf 15 30 60 90

What is kept from the run, per sample (the first word of a lease's label, the `problem` of its
`sample_started`): its build (from its start to its first request), each later request as long after the
previous return as it was in the run, each hold as long as it was, and the time from its last return to its
end. Samples start in the run's order, at most the run's `concurrency` at once, each when a place frees
(so a sample that waits less lets the next build start sooner); `--as-recorded` instead asks each sample's
first lease when the run did. What the log does not say is estimated and counted: a hold never granted or
never returned lasts the median hold of its kind, and a sample unfinished when the log ends asks for
nothing more than it had asked. Left out: a policy changes who shares with whom, and so each hold's length
and each build's (builds were slower beside more work); builds are as long as they were. `--long-hold-s inf`
is the plain exclusive-first order the run had until 2026-12-02; its row beside the run's own shows how
close the simulation comes.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent import lease_order  # noqa: E402
from agent.report.leases import event_seconds, last_pass, lease_use, read_events  # noqa: E402


@dataclass
class Step:
    gap_s: float  # after the previous return (the first request: after the sample started)
    shared: bool
    hold_s: float | None  # None: the log does not say (estimated before simulating)


@dataclass
class Sample:
    started_s: float  # when the run started it (for --as-recorded and the order)
    steps: list[Step] = field(default_factory=list)
    tail_s: float = 0.0  # last return to the sample's end (0 when the log does not say)


@dataclass
class Outcome:
    end_s: float  # the last sample's end (or the last return)
    waited_s: float  # summed over requests: sample-seconds spent waiting for a lease
    held_s: float  # wall seconds at least one lease was held
    lease_s: float  # summed lease-seconds (evaluations at once = lease_s / end_s)
    finished_s: list[float] = field(default_factory=list)  # each sample's end, sorted


def samples_of(events: list[dict[str, object]]) -> dict[str, Sample]:
    """Each sample's build, requests and tail, in the order the run started them."""
    stamped = [(t, e) for e in events if (t := event_seconds(e.get("timestamp"))) is not None]
    origin = stamped[0][0]
    samples: dict[str, Sample] = {}
    last: dict[str, float] = {}  # the sample's start, then its last return
    for at, event in stamped:
        kind, now = event.get("event"), at - origin
        key = str(event.get("problem") or event.get("label", "")).split(" ")[0]
        if kind == "sample_started":
            samples.setdefault(key, Sample(started_s=now))
            last[key] = now
        elif kind == "lease_asked":
            sample = samples.setdefault(key, Sample(started_s=now))
            sample.steps.append(Step(gap_s=now - last.get(key, now), shared=bool(event.get("shared")), hold_s=None))
        elif kind == "lease_returned" and samples.get(key) and samples[key].steps:
            samples[key].steps[-1].hold_s = float(str(event.get("held_s")))
            last[key] = now
        elif kind == "sample_finished" and key in samples:
            samples[key].tail_s = now - last.get(key, now)  # no lease (a failed build): its whole time
    return samples


def estimate_missing(samples: dict[str, Sample]) -> int:
    """Fills the holds the log does not give with the median of their kind; returns how many it filled."""
    steps = [step for sample in samples.values() for step in sample.steps]
    medians = {}
    for shared in (True, False):
        known = [s.hold_s for s in steps if s.shared == shared and s.hold_s is not None]
        medians[shared] = statistics.median(known) if known else 10.0
    missing = [step for step in steps if step.hold_s is None]
    for step in missing:
        step.hold_s = medians[step.shared]
    return len(missing)


def simulate(samples: dict[str, Sample], *, groups: int, room: int, long_hold_s: float,
             concurrency: int | None) -> Outcome:
    """Discrete events: starts, asks, returns, ends, and the moments a hold turns long (the policy looks again
    then). `concurrency` None: each sample's first request comes when it came in the run."""
    order = list(samples)
    position = {key: 0 for key in samples}
    asks: list[tuple[float, int, str]] = []  # (when, start order, sample)
    ends: list[tuple[float, str]] = []  # samples between their last return and their end
    queue: list[lease_order.Request] = []
    waiting: dict[int, tuple[str, float]] = {}  # ticket -> (sample, asked at)
    live: list[list[tuple[float, float, str]]] = [[] for _ in range(groups)]  # (start, end, sample) per group
    exclusive: set[int] = set()
    outcome = Outcome(end_s=0.0, waited_s=0.0, held_s=0.0, lease_s=0.0)
    running, ticket, now = 0, 0, 0.0

    def start_next(at: float) -> None:
        nonlocal running
        while order and (concurrency is None or running < concurrency):
            key = order.pop(0)
            sample = samples[key]
            begin = sample.started_s if concurrency is None else at
            if sample.steps:
                heapq.heappush(asks, (begin + sample.steps[0].gap_s, len(samples) - len(order), key))
            else:
                ends.append((begin + sample.tail_s, key))
            running += 1

    start_next(0.0)
    while asks or queue or ends or any(live):
        while asks and asks[0][0] <= now:
            _, _, key = heapq.heappop(asks)
            queue.append(lease_order.Request(ticket=ticket, shared=samples[key].steps[position[key]].shared))
            waiting[ticket] = (key, now)
            ticket += 1
        while (grant := lease_order.next_grant(
                queue, [lease_order.Group(started=tuple(s for s, _, _ in held), exclusive=i in exclusive)
                        for i, held in enumerate(live)], room=room, now=now, long_hold_s=long_hold_s)) is not None:
            request = next(r for r in queue if r.ticket == grant[0])
            queue.remove(request)
            key, asked = waiting.pop(request.ticket)
            outcome.waited_s += now - asked
            live[grant[1]].append((now, now + (samples[key].steps[position[key]].hold_s or 0.0), key))
            if not request.shared:
                exclusive.add(grant[1])
        moments = [end for held in live for _, end, _ in held] + [end for end, _ in ends]
        moments += [start + long_hold_s for held in live for start, _, _ in held if start + long_hold_s > now]
        moments += [asks[0][0]] if asks else []
        if not moments:
            break  # requests no order can serve (a policy that never grants): stop rather than spin
        later = min(moments)
        outcome.held_s += later - now if any(live) else 0.0
        outcome.lease_s += sum(len(held) for held in live) * (later - now)
        now = later
        for index, held in enumerate(live):
            for lease in [lease for lease in held if lease[1] <= now]:
                held.remove(lease)
                exclusive.discard(index)
                key = lease[2]
                position[key] += 1
                if position[key] < len(samples[key].steps):
                    heapq.heappush(asks, (now + samples[key].steps[position[key]].gap_s, 0, key))
                else:
                    ends.append((now + samples[key].tail_s, key))
        for end in [end for end in ends if end[0] <= now]:
            ends.remove(end)
            outcome.finished_s.append(now)
            running -= 1
            start_next(now)
    outcome.finished_s.sort()
    outcome.end_s = outcome.finished_s[-1] if outcome.finished_s else now
    return outcome


def recorded(events: list[dict[str, object]]) -> Outcome:
    """The run's own figures, for the calibration row."""
    use = lease_use(events)
    stamps = [t for e in events if (t := event_seconds(e.get("timestamp"))) is not None]
    finished = sorted(t - stamps[0] for e in events if e.get("event") == "sample_finished"
                      and (t := event_seconds(e.get("timestamp"))) is not None)
    return Outcome(end_s=use.wall_s, held_s=(use.busy_fraction or 0.0) * use.wall_s, finished_s=finished,
                   waited_s=sum(h.waited_s for h in use.holds),
                   lease_s=sum(float(str(e.get("held_s"))) for e in events if e.get("event") == "lease_returned"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("events", type=Path, help="a run's events.jsonl (or .jsonl.gz)")
    parser.add_argument("--long-hold-s", type=float, nargs="+", default=[math.inf, lease_order.LONG_HOLD_S])
    parser.add_argument("--groups", type=int, default=1, help="GPU groups of the run (one H200: 1)")
    parser.add_argument("--room", type=int, default=None,
                        help="shared leases per group (default: the run's capacity over --groups)")
    parser.add_argument("--as-recorded", action="store_true",
                        help="each sample's first request when the run made it (no concurrency limit)")
    parser.add_argument("--out", type=Path, default=None, help="a folder for lease_order.json")
    args = parser.parse_args(argv)
    events = last_pass(read_events(args.events))
    started = next((e for e in events if e.get("event") == "run_started"), {})
    room = args.room or max(1, int(str(started.get("capacity", 1))) // args.groups)
    concurrency = None if args.as_recorded else int(str(started.get("concurrency", 1)))
    samples = samples_of(events)
    filled = estimate_missing(samples)
    own = recorded(events)
    print(f"{args.events}: {len(samples)} samples, {sum(len(s.steps) for s in samples.values())} lease requests "
          f"({filled} holds estimated), {args.groups} group(s) of {room}, "
          + ("first requests as recorded" if concurrency is None else f"{concurrency} samples at once"))
    print(f"| order | last sample done s | samples done by {own.end_s:.0f} s | sample-s waiting for a lease "
          "| evaluations at once |")
    print("|---|---|---|---|---|")

    def row(name: str, outcome: Outcome) -> None:
        done = sum(1 for t in outcome.finished_s if t <= own.end_s + 1e-6)
        print(f"| {name} | {outcome.end_s:.0f} | {done} | {outcome.waited_s:.0f} "
              f"| {outcome.lease_s / outcome.end_s:.2f} |")

    row("the run itself (unfinished samples left out)", own)
    rows = []
    for long_hold_s in args.long_hold_s:
        outcome = simulate(samples, groups=args.groups, room=room, long_hold_s=long_hold_s, concurrency=concurrency)
        row("exclusive first (until 2026-12-02)" if math.isinf(long_hold_s) else f"beside holds >= {long_hold_s:g} s",
            outcome)
        rows.append({"long_hold_s": None if math.isinf(long_hold_s) else long_hold_s, **asdict(outcome)})
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "lease_order.json").write_text(json.dumps(
            {"events": str(args.events), "samples": len(samples), "estimated_holds": filled, "groups": args.groups,
             "room": room, "concurrency": concurrency, "recorded": asdict(own), "simulated": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
