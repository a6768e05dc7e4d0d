"""agent.scheduler: leases first come first served; untimed evaluations sharing a GPU group up to the limit,
exclusive ones alone; what the listener hears. Threads on CPU with GPU indices given by hand (no GPU needed)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from agent.scheduler import DeviceScheduler, SchedulerError


def hold(scheduler: DeviceScheduler, until: threading.Event, seen: list[Any], **kwargs: Any) -> threading.Thread:
    """A thread that takes a lease, notes it in `seen` and holds it until `until` is set."""

    def body() -> None:
        with scheduler.lease(**kwargs) as lease:
            seen.append(lease)
            until.wait(10)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the scheduler"
        time.sleep(0.01)


def test_leases_are_granted_in_the_order_they_were_asked_for():
    scheduler = DeviceScheduler("cuda", 2, gpus=[0, 1])
    order: list[int] = []
    first = scheduler.lease()
    first.__enter__()  # the only group is held: every request below queues
    threads = []
    for k in range(6):
        def body(k: int = k) -> None:
            with scheduler.lease():
                order.append(k)
        threads.append(threading.Thread(target=body))
        threads[-1].start()
        wait_for(lambda k=k: len(scheduler._queue) == k + 1)  # asked one after the other
    first.__exit__(None, None, None)
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3, 4, 5]


def test_untimed_evaluations_share_a_group_up_to_the_limit_and_say_so():
    scheduler = DeviceScheduler("cuda", 2, gpus=[0], ranks_per_gpu=2, shared_evaluations=3)
    assert scheduler.shares and scheduler.capacity == 3
    release, seen = threading.Event(), list[Any]()
    threads = [hold(scheduler, release, seen, shared=True) for _ in range(4)]
    wait_for(lambda: len(seen) == 3)
    time.sleep(0.1)
    assert len(seen) == 3 and len(scheduler._queue) == 1  # the fourth waits for room
    assert all(lease.gpus == [0, 0] and lease.shared for lease in seen)
    release.set()
    for t in threads:
        t.join(10)
    assert len(seen) == 4 and all(lease.overlapped for lease in seen[:3])
    assert scheduler.in_use == {}


def test_a_shared_lease_alone_on_its_group_did_not_overlap():
    scheduler = DeviceScheduler("cuda", 2, gpus=[0, 1, 2, 3], shared_evaluations=2)
    with scheduler.lease(shared=True) as a, scheduler.lease(shared=True) as b:
        # two groups: each evaluation gets a group of its own before any group is shared
        assert a.gpus == [0, 1] and b.gpus == [2, 3]
        with scheduler.lease(shared=True) as c:
            assert c.gpus == [0, 1] and c.overlapped and a.overlapped
    assert not b.overlapped


def test_an_exclusive_lease_waits_for_its_group_to_empty_and_holds_it_alone():
    scheduler = DeviceScheduler("cuda", 2, gpus=[0, 1], shared_evaluations=2)
    release_shared, seen = threading.Event(), list[Any]()
    hold(scheduler, release_shared, seen, shared=True)
    wait_for(lambda: len(seen) == 1)
    release_exclusive, exclusive = threading.Event(), list[Any]()
    hold(scheduler, release_exclusive, exclusive)
    wait_for(lambda: len(scheduler._queue) == 1)
    late: list[Any] = []
    hold(scheduler, threading.Event(), late, shared=True)  # asked after the exclusive one: waits behind it
    wait_for(lambda: len(scheduler._queue) == 2)
    time.sleep(0.1)
    assert exclusive == [] and late == []
    release_shared.set()
    wait_for(lambda: len(exclusive) == 1)
    time.sleep(0.1)
    assert late == [] and not exclusive[0].shared  # nothing shares an exclusive lease
    release_exclusive.set()
    wait_for(lambda: len(late) == 1)
    assert not exclusive[0].overlapped and not seen[0].overlapped


def test_exclusive_requests_go_before_shared_ones_so_one_emptied_group_serves_them_all():
    """A re-judge empties the group; a second re-judge asked later runs next, before the shared request asked
    between them, which would otherwise refill the group and make the second wait for it to empty again."""
    scheduler = DeviceScheduler("cuda", 2, gpus=[0], ranks_per_gpu=2, shared_evaluations=2)
    order: list[str] = []
    release = {name: threading.Event() for name in ("held", "first", "shared", "second")}

    def take(name: str, shared: bool) -> threading.Thread:
        def body() -> None:
            with scheduler.lease(shared=shared, label=name):
                order.append(name)
                release[name].wait(10)
        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        return thread

    heard: list[tuple[str, dict[str, object]]] = []
    scheduler.listener = lambda event, fields: heard.append((event, fields))
    take("held", True)
    wait_for(lambda: order == ["held"])
    for waiting, (name, shared) in enumerate((("first", False), ("shared", True), ("second", False)), start=1):
        take(name, shared)
        wait_for(lambda n=waiting: len(scheduler._queue) == n)  # the shared one too: an exclusive one waits
    assert [f["ahead"] for e, f in heard if e == "lease_asked"] == [0, 0, 1, 1]  # the second: behind the first only
    for name in ("held", "first", "second"):
        wait_for(lambda n=name: n in order)
        release[name].set()
    wait_for(lambda: len(order) == 4)
    release["shared"].set()
    assert order == ["held", "first", "second", "shared"]


def test_a_shared_request_goes_beside_a_long_hold_while_a_re_judge_waits_for_the_group_to_empty():
    """A holder that has held for long keeps the group from emptying anyway: a shared request asked after a
    waiting exclusive one takes a place beside it instead of idling, and the grant says why."""
    scheduler = DeviceScheduler("cuda", 2, gpus=[0], ranks_per_gpu=2, shared_evaluations=2, long_hold_s=1.0)
    heard: list[tuple[str, dict[str, object]]] = []
    scheduler.listener = lambda event, fields: heard.append((event, fields))
    release_long, long = threading.Event(), list[Any]()
    hold(scheduler, release_long, long, shared=True, label="long")
    wait_for(lambda: len(long) == 1)
    release_rejudge, rejudge = threading.Event(), list[Any]()
    hold(scheduler, release_rejudge, rejudge, label="re-judge")
    wait_for(lambda: len(scheduler._queue) == 1)
    release_beside, beside = threading.Event(), list[Any]()
    hold(scheduler, release_beside, beside, shared=True, label="beside")
    wait_for(lambda: len(beside) == 1)  # once the first lease has held 1 s
    assert rejudge == [] and beside[0].overlapped and long[0].overlapped
    assert time.perf_counter() - long[0].started >= 1.0
    granted = {f["label"]: f["beside_long_hold"] for e, f in heard if e == "lease_granted"}
    assert granted == {"long": False, "beside": True}
    late: list[Any] = []
    hold(scheduler, threading.Event(), late, shared=True)  # no room left beside the long hold: it waits
    release_long.set()
    wait_for(lambda: ("lease_returned", "long") in [(e, f["label"]) for e, f in heard])
    release_beside.set()  # held for less than 1 s: nothing goes beside it
    wait_for(lambda: len(rejudge) == 1)  # the group empties: the re-judge goes, alone
    time.sleep(0.1)
    assert late == [] and not rejudge[0].overlapped
    release_rejudge.set()
    wait_for(lambda: len(late) == 1)


def test_a_timed_request_is_never_shared_even_on_a_sharing_scheduler():
    scheduler = DeviceScheduler("cuda", 2, gpus=[0, 1], shared_evaluations=4)
    with scheduler.lease(shared=True) as shared:
        assert shared.shared
    with scheduler.lease() as alone:
        assert not alone.shared
    plain = DeviceScheduler("cuda", 2, gpus=[0, 1])
    with plain.lease(shared=True) as asked:  # a scheduler that does not share grants exclusive leases
        assert not asked.shared and not plain.shares


def test_the_listener_hears_every_request_grant_and_return():
    heard: list[tuple[str, dict[str, object]]] = []
    scheduler = DeviceScheduler("cuda", 2, gpus=[0, 1], shared_evaluations=2,
                                listener=lambda event, fields: heard.append((event, fields)))
    with scheduler.lease(shared=True, label="all_reduce small"):
        with scheduler.lease(shared=True, label="all_gather small"):
            pass
    assert [(e, f["label"]) for e, f in heard] == [
        ("lease_asked", "all_reduce small"), ("lease_granted", "all_reduce small"),
        ("lease_asked", "all_gather small"), ("lease_granted", "all_gather small"),
        ("lease_returned", "all_gather small"), ("lease_returned", "all_reduce small")]
    assert heard[3][1]["holders"] == 2 and heard[4][1]["overlapped"] is True
    assert isinstance(heard[5][1]["held_s"], float) and isinstance(heard[1][1]["waited_s"], float)
    assert heard[0][1]["ahead"] == 0

    def broken(event: str, fields: dict[str, object]) -> None:
        raise OSError("disk full")

    quiet = DeviceScheduler("cuda", 2, gpus=[0, 1], listener=broken)
    with quiet.lease() as lease:  # a log that cannot be written does not take the lease down
        assert lease.gpus == [0, 1]
    assert quiet.in_use == {}


def test_sharing_is_refused_where_it_means_nothing():
    with pytest.raises(SchedulerError, match="only on CUDA"):
        DeviceScheduler("cpu", 2, cpu_slots=2, shared_evaluations=2)
    with pytest.raises(SchedulerError, match="at least 1"):
        DeviceScheduler("cuda", 2, gpus=[0, 1], shared_evaluations=0)


def test_pkb_run_shares_gpus_only_for_untimed_local_cuda_runs(monkeypatch):
    from agent.cli import run_session
    from agent.cli.common import CliError
    from agent.runner import RunConfig

    untimed = RunConfig(model="replay:x", conditions=["replay"], problems=["all_reduce"], device="cuda",
                        skip_timing=True)
    with pytest.raises(CliError, match="needs --no-timing: a timing never shares"):
        run_session.check_device(untimed.model_copy(update={"skip_timing": False}), "local", 2)
    with pytest.raises(CliError, match="needs --device cuda"):
        run_session.check_device(untimed.model_copy(update={"device": "cpu"}), "local", 2)
    with pytest.raises(CliError, match="leave --executor at local"):
        run_session.check_device(untimed, "ray", 2)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    scheduler = run_session.check_device(untimed, "local", 3)
    assert scheduler is not None and scheduler.shares and scheduler.capacity == 3 and scheduler.groups == [[0, 1]]


def test_pkb_run_refuses_a_count_below_one(capsys):
    from agent.cli import main as pkb

    assert pkb(["run", "--model", "replay:x", "--evaluations-per-gpu", "0"]) == 2
    assert "--evaluations-per-gpu must be at least 1, got 0" in capsys.readouterr().err
