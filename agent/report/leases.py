"""How a run used its devices, from the scheduler's lease events in events.jsonl (agent.scheduler:
`lease_asked`, `lease_granted`, `lease_returned`): the share of the wall time some evaluation held them, how
many held them at once, how long requests queued, the longest holds, and what was open when the log ends (a
run stopped at its budget: which evaluations held the devices and which were still waiting for them).

Events are read as the runner wrote them (one JSON object per line, ISO timestamps). A line that is not such
an object is skipped: a run killed mid-write leaves half a line.
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any


@dataclass
class Hold:
    label: str
    start_s: float  # seconds since the first event of the log
    end_s: float | None  # None: not returned when the log ends
    waited_s: float
    shared: bool


@dataclass
class LeaseUse:
    wall_s: float  # first event to last
    holds: list[Hold] = field(default_factory=list)
    waiting: list[tuple[str, float]] = field(default_factory=list)  # (label, asked at) never granted in the log

    @property
    def busy_fraction(self) -> float | None:
        """The share of the wall time at least one evaluation held the devices (open holds until the end)."""
        if self.wall_s <= 0:
            return None
        spans = sorted((h.start_s, self.wall_s if h.end_s is None else h.end_s) for h in self.holds)
        busy, reach = 0.0, 0.0
        for start, end in spans:
            start = max(start, reach)
            if end > start:
                busy += end - start
                reach = end
        return busy / self.wall_s

    @property
    def mean_at_once(self) -> float | None:
        """Evaluations holding the devices at once, averaged over the wall time."""
        if self.wall_s <= 0:
            return None
        return sum((self.wall_s if h.end_s is None else h.end_s) - h.start_s for h in self.holds) / self.wall_s

    @property
    def median_wait_s(self) -> float | None:
        return statistics.median(h.waited_s for h in self.holds) if self.holds else None

    @property
    def waited_in_all_s(self) -> float:
        """Sample-seconds spent waiting for a lease, requests still waiting at the end counted until then: set
        beside the builds' time, it says whether the samples' concurrency went to the GPU's queue."""
        return sum(h.waited_s for h in self.holds) + sum(self.wall_s - at for _, at in self.waiting)

    def median_hold_s(self, shared: bool) -> float | None:
        """The median length of the returned shared (or exclusive) holds: sharing lengthens each hold as much
        as the evaluations slow each other down."""
        held = [h.end_s - h.start_s for h in self.holds if h.shared == shared and h.end_s is not None]
        return statistics.median(held) if held else None

    def longest(self, n: int = 5) -> list[Hold]:
        return sorted(self.holds, key=lambda h: (h.end_s if h.end_s is not None else self.wall_s) - h.start_s,
                      reverse=True)[:n]

    @property
    def still_held(self) -> list[Hold]:
        return [h for h in self.holds if h.end_s is None]


def event_seconds(stamp: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def lease_use(events: Iterable[dict[str, Any]]) -> LeaseUse:
    """Holds matched grant to return by label, first in first out (one label can hold more than one lease:
    a problem's visible and held-out shapes, a second judgement alone)."""
    timed = [(t, e) for e in events if (t := event_seconds(e.get("timestamp"))) is not None]
    if not timed:
        return LeaseUse(wall_s=0.0)
    origin = timed[0][0]
    use = LeaseUse(wall_s=timed[-1][0] - origin)
    open_by_label: dict[str, list[Hold]] = {}
    asked_by_label: dict[str, list[float]] = {}
    for at, event in timed:
        label = str(event.get("label", ""))
        if event.get("event") == "lease_asked":
            asked_by_label.setdefault(label, []).append(at - origin)
        elif event.get("event") == "lease_granted":
            if asked_by_label.get(label):
                asked_by_label[label].pop(0)
            hold = Hold(label=label, start_s=at - origin, end_s=None, waited_s=float(event.get("waited_s") or 0.0),
                        shared=bool(event.get("shared")))
            use.holds.append(hold)
            open_by_label.setdefault(label, []).append(hold)
        elif event.get("event") == "lease_returned" and open_by_label.get(label):
            open_by_label[label].pop(0).end_s = at - origin
    use.waiting = sorted((label, at) for label, times in asked_by_label.items() for at in times)
    return use


def last_pass(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of the run's last pass (from its last `run_started`): a resumed run's earlier passes may lie
    days before, and their gap is not time the devices stood idle."""
    starts = [i for i, e in enumerate(events) if e.get("event") == "run_started"]
    return events[starts[-1]:] if starts else events


def read_events(path: Path) -> list[dict[str, Any]]:
    """events.jsonl's objects, torn or foreign lines skipped; a `.gz` file (as kept in docs/measurements) is
    read through gzip."""
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode(errors="replace")
    events = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            events.append(value)
    return events


def summary_lines(use: LeaseUse) -> list[str]:
    """A few lines a person reads: busy share, at once, waits, the longest holds, what was open at the end."""
    if not use.holds and not use.waiting:
        return ["no lease events (a run from before they were logged, or one that took no lease)"]

    def pct(x: float | None) -> str:
        return f"{100 * x:.0f}%" if x is not None else "-"

    lines = [f"devices held {pct(use.busy_fraction)} of {use.wall_s:.0f} s; evaluations at once "
             f"{use.mean_at_once or 0:.2f} on average; {len(use.holds)} leases, median wait "
             f"{use.median_wait_s or 0:.1f} s, {use.waited_in_all_s:.0f} s in all"]
    if any(h.shared for h in use.holds):
        kinds = [(f"{median:.1f} s {name} ({sum(1 for h in use.holds if h.shared == shared)})")
                 for name, shared in (("shared", True), ("alone", False))
                 if (median := use.median_hold_s(shared)) is not None]
        lines.append("held per lease, median: " + ", ".join(kinds))
    lines.append("longest: " + "; ".join(
        f"{h.label or '?'} {((h.end_s if h.end_s is not None else use.wall_s) - h.start_s):.0f} s"
        + (" (still held)" if h.end_s is None else "") for h in use.longest()))
    if use.still_held:
        lines.append("held when the log ends: " + "; ".join(
            f"{h.label or '?'} since {h.start_s:.0f} s" for h in use.still_held))
    if use.waiting:
        lines.append("waiting when the log ends: " + "; ".join(
            f"{label or '?'} since {at:.0f} s" for label, at in sorted(use.waiting, key=lambda w: w[1])))
    return lines


def last_pass_summary(events_path: Path) -> list[str]:
    """summary_lines of the last pass of the run whose events.jsonl this is (what `pkb run` prints after a
    CUDA run and the replay benchmark writes)."""
    return summary_lines(lease_use(last_pass(read_events(events_path))))
