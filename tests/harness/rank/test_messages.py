"""The typed messages between the judge and its ranks (harness.common.messages): what each role serves, how a
request travels, and how strictly a reply a hostile rank wrote is read."""

from __future__ import annotations

from typing import Any

import pytest

from harness.common import failures, messages
from harness.common.flags import TAMPERING
from harness.launch.exchange import Exchange, outgoing
from harness.launch.replies import RankPipes
from harness.rank.worker import HANDLERS

SERVED_BY_THE_LOOP = {"exit", "seal"}  # the serving loop's own; every other op goes through the table


def test_every_op_a_role_serves_has_a_handler_and_nothing_else_does():
    for role, table in messages.REQUESTS.items():
        assert set(table) - SERVED_BY_THE_LOOP == set(HANDLERS[role]), role
    # One op, two meanings: the reference's timing set-up and the candidate's.
    assert messages.REQUESTS["trusted"]["time_begin"] is messages.RefTimeBegin
    assert messages.REQUESTS["candidate"]["time_begin"] is messages.CallTimeBegin
    assert "call" not in messages.REQUESTS["trusted"] and "ref_trials" not in messages.REQUESTS["candidate"]


EXAMPLES: list[tuple[str, messages.Request]] = [
    ("trusted", messages.RefTrials(problem="p", shape="small", seed=3, dir="/d",
                                   trials=[messages.TrialSpec(id=1, kind="probe")])),
    ("trusted", messages.RefSets(problem="p", shape="small", seed=3, trial_base=100, dir="/d", fresh=2,
                                 judged=[messages.JudgedCall(trial=7, probe=True)], config={"min_input_sets": 2})),
    ("trusted", messages.RefTimeBegin(problem="p", clone_inputs=True)),
    ("candidate", messages.Setup(problem="p", shape="small", groups=[None, [0, 1]])),
    ("candidate", messages.Call(candidate="c.py", inputs="i.pt", output="o.bin", delay_s=0.5)),
    ("candidate", messages.CallTimeBegin(candidate="c.py", set_fills=[{"shared": 1, "private": 2, "probe": None}])),
    ("candidate", messages.TimePrepare(kind="timed", set=1, fill={"shared": 1, "private": 2}, keep_previous="k")),
    ("candidate", messages.TimeEnd(keep_previous=None, check_previous=False)),
]


@pytest.mark.parametrize(("role", "message"), EXAMPLES, ids=[type(m).__name__ for _, m in EXAMPLES])
def test_a_request_arrives_as_it_was_sent(role, message):
    wire = {**messages.to_wire(message), "nonce": "n1"}
    assert wire["op"] == message.op and all(isinstance(k, str) for k in wire)
    assert messages.parse_request(wire, role) == (message, "n1")


@pytest.mark.parametrize(("raw", "why"), [
    ([("op", "ping")], "must be a dict"),
    ({"op": "ref_trials"}, "not served by a candidate rank"),
    ({"op": "nope"}, "not served"),
    ({"op": "call", "candidate": "c", "inputs": "i"}, "'output' is missing"),
    ({"op": "ping", "extra": 1}, "unknown field 'extra'"),
    ({"op": "call", "candidate": "c", "inputs": "i", "output": "o", "busy_bytes": True}, "busy_bytes must be int"),
    ({"op": "call", "candidate": "c", "inputs": "i", "output": "o", "delay_s": "1"}, "delay_s must be float"),
    ({"op": "time_prepare", "kind": "sideways", "set": 0}, "kind is not one of"),
    ({"op": "time_prepare", "kind": "timed", "set": 0, "fill": {"shared": 1}}, "'private' is missing"),
    ({"op": "time_prepare", "kind": "timed", "set": 0, "fill": {"shared": 1, "private": 2, "x": 3}}, "unknown field"),
    ({"op": "setup", "groups": [[0, "1"]]}, r"groups\[0\]\[1\] must be int"),
    ({"op": "ping", "nonce": 5}, "nonce"),
])
def test_a_request_that_does_not_fit_is_refused_by_name(raw, why):
    with pytest.raises(messages.ProtocolError, match=why):
        messages.parse_request(raw, "candidate")


def test_the_judge_checks_a_request_before_it_is_sent():
    assert outgoing({"op": "ping"}, 2, "trusted") == {0: messages.Ping(), 1: messages.Ping()}
    mixed: dict[int, messages.Request | dict[str, Any]] = {0: messages.TimeEnd(),
                                                           1: {"op": "time_end", "keep_previous": "k"}}
    per_rank = outgoing(mixed, 2, "candidate")
    assert per_rank[1] == messages.TimeEnd(keep_previous="k")
    with pytest.raises(messages.ProtocolError, match="does not serve"):
        outgoing(messages.Call(candidate="c", inputs="i", output="o"), 2, "trusted")
    with pytest.raises(messages.ProtocolError, match="unknown field"):
        outgoing({"op": "validate", "problem": "p", "shape": "s", "seed": 0, "trials": 1, "trial": 2}, 1, "trusted")


def test_a_reply_is_read_only_when_it_fits_its_ops_type():
    good = {"ok": True, "rank": 1, "seconds": 0.1, "collectives": {"calls": {"all_reduce": 2}, "sequence": 2},
            "counted": True, "previous_changed": False, "input_fingerprint": [1, 2], "flags": []}
    assert messages.check_reply("call", good) is good
    for bad, why in [
        ({"ok": True, "rank": 0, "max_abs_err": 0.0}, "unknown field 'max_abs_err'"),  # a verdict it may not state
        ({"ok": 1, "rank": 0}, "ok must be bool"),
        ({"rank": 0}, "'ok' is missing"),
        ({"ok": True, "rank": 0, "input_fingerprint": [1.5]}, r"input_fingerprint\[0\] must be int"),
        ({"ok": True, "rank": 0, "message": "x" * (messages.MAX_TEXT + 1)}, "message must be str"),
        ({"ok": True, "rank": 0, "collectives": {"calls": {"x": "1"}}}, "must be int"),
        (["ok"], "not a JSON object"),
    ]:
        with pytest.raises(messages.ProtocolError, match=why):
            messages.check_reply("call", bad)


def test_a_summary_reply_is_bounded_json_under_a_typed_envelope():
    assert messages.check_reply("trace", {"ok": True, "rank": 0, "collectives": [{"op": "all_reduce"}], "flops": 3})
    deep: Any = 0
    for _ in range(messages.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(messages.ProtocolError, match="too deep"):
        messages.check_reply("profile", {"ok": True, "rank": 0, "spans": deep})
    with pytest.raises(messages.ProtocolError, match="ok must be bool"):
        messages.check_reply("profile", {"ok": "yes", "rank": 0})


class _Quiet:
    """Oversight that finds nothing (the exchange's checks of a reply need no processes)."""

    def over_cap(self, r: RankPipes, /) -> None:
        return None

    def check_processes(self) -> None:
        return None

    def limit_reached(self, failed: bool, sealed: bool, /) -> None:
        return None

    def stacks(self) -> dict[int, str]:
        return {}


@pytest.mark.parametrize(("role", "verdict", "flags"), [("candidate", failures.RUNTIME_ERROR, [TAMPERING]),
                                                        ("trusted", failures.INFRA_ERROR, None)])
def test_a_reply_that_does_not_fit_is_the_ranks_failure_not_the_judges(role, verdict, flags):
    exchange = Exchange([], 0, role, _Quiet())
    exchange.ops[1] = "call"
    reply = exchange._checked(1, {"ok": True, "rank": 1, "max_abs_err": 0.0, "input_fingerprint": []})
    assert reply["ok"] is False and reply["verdict"] == verdict and reply.get("flags") == flags
    assert "rank 1" in reply["message"] and "'call'" in reply["message"] and "max_abs_err" in reply["message"]
    fine = {"ok": True, "rank": 1, "input_fingerprint": []}
    assert exchange._checked(1, fine) is fine
