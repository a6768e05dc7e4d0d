"""The mechanisms that make timed calls unrecognisable, unreplayable and unfinishable late (issue 25):
fresh inputs drawn in place from per-rank recipes, outputs read with torch's modes off through functions
bound before any candidate, judged calls drawn across the whole timing phase, margins that grow with
the work. The end-to-end verdicts are in tests/harness/test_exploits.py (memo_by_pointer.py and the others)."""

from __future__ import annotations

import ctypes
import math
import random
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from harness.common import messages, seeds
from harness.common.integrity import IntegrityConfig
from harness.config import TimingConfig
from harness.judge import plausibility, timing
from harness.problems.registry import get, load_suite
from harness.rank import pristine, refill, transport
from harness.rank.calls import fingerprint, same_bytes, snapshot
from harness.rank.tripwires import Guard

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def all_reduce():
    return get(load_suite(), "all_reduce")


# -- fresh contents --------------------------------------------------------------------------------
def test_a_rank_draws_its_own_inputs_from_its_recipe_and_the_reference_draws_the_same(all_reduce):
    shape = all_reduce.shape("small")
    mine = refill.drawer(all_reduce, shape, 0, 2, CPU)
    again = refill.drawer(all_reduce, shape, 0, 2, CPU)  # the reference pool's, in another process alike
    recipe = seeds.fill_recipe(7, 1234, 0)
    assert same_bytes(mine(recipe), again(recipe))
    assert not same_bytes(mine(recipe), mine(seeds.fill_recipe(7, 1235, 0)))  # another call: new contents
    # A recipe names nothing a peer's can be derived from: the shared trial seed is everyone's, the private
    # seed is this rank's only, and the run's seed is in none of them.
    peer = seeds.fill_recipe(7, 1234, 1)
    assert peer["shared"] == recipe["shared"] and peer["private"] != recipe["private"]
    assert recipe["private"] is not None and peer["private"] != recipe["private"] + 1 and 7 not in recipe.values()


def test_the_split_generator_reports_the_trial_seed_but_draws_from_the_private_one():
    gen = refill.SplitGenerator(CPU, private=99, reported=(5 << 16) + 1)
    assert gen.initial_seed() == (5 << 16) + 1  # shared metadata: initial_seed() - rank, as problems derive it
    expected = torch.randn(4, generator=torch.Generator().manual_seed(99))
    assert torch.equal(torch.randn(4, generator=gen), expected)


def test_shared_metadata_still_agrees_across_ranks():
    problem = get(load_suite(), "all_to_all_v")  # its split matrix must be the same on every rank
    shape = problem.shape("small")
    draws = [refill.drawer(problem, shape, r, 2, CPU)(seeds.fill_recipe(3, 77, r)) for r in range(2)]
    ints = [[t for t in d if isinstance(t, torch.Tensor) and not t.is_floating_point()] for d in draws]
    assert ints[0] and all(torch.equal(a, b) for a, b in zip(ints[0], ints[1]))


def test_refill_keeps_the_buffers_and_changes_their_contents(all_reduce):
    draw = refill.drawer(all_reduce, all_reduce.shape("decode"), 0, 2, CPU)
    buffers = draw(seeds.fill_recipe(1, 10, 0))
    before = (buffers[0].data_ptr(), buffers[0].clone())
    fresh = draw(seeds.fill_recipe(1, 11, 0))
    args, in_place = refill.refill(buffers, fresh)
    assert in_place and args is buffers and buffers[0].data_ptr() == before[0]
    assert torch.equal(buffers[0], fresh[0]) and not torch.equal(buffers[0], before[1])


def test_refill_hands_over_the_draw_where_the_structure_differs():
    buffers = (torch.zeros(3), 4)
    draws: list[Any] = [(torch.ones(5), 4), (torch.ones(3), 5), (torch.ones(3, dtype=torch.float64), 4),
                        [torch.ones(3), 4]]
    for fresh in draws:
        args, in_place = refill.refill(buffers, fresh)
        assert args is fresh and not in_place
    assert torch.equal(buffers[0], torch.zeros(3))  # a mismatch leaves the buffers untouched


def test_inputs_a_rank_could_not_make_itself_are_not_drawn_there():
    assert refill.not_refillable((torch.ones(2), [1, 2.0, "x", None], {"k": torch.ones(1)})) is None
    assert "Linear" in (refill.not_refillable((torch.nn.Linear(2, 2),)) or "")
    assert "Parameter" in (refill.not_refillable((torch.nn.Parameter(torch.ones(2)),)) or "")


# -- outputs read where the candidate cannot steer -------------------------------------------------
class _Forge(TorchFunctionMode):
    """What a candidate leaves active: every copy of a tensor comes out as 7s."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and func in (torch.Tensor.clone, torch.Tensor.to, torch.Tensor.contiguous):
            return torch.full_like(out, 7)
        return out


class _ForgeDispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if "clone" in str(func) or "copy" in str(func):
            return torch.full_like(out, 7) if isinstance(out, torch.Tensor) else out
        return out


@pytest.mark.parametrize("mode", [_Forge, _ForgeDispatch])
def test_snapshots_fingerprints_and_output_files_ignore_an_active_mode(mode, tmp_path):
    value = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    truth = fingerprint(value)
    with mode():
        assert pristine.active_modes()
        copy = snapshot(value)
        assert fingerprint(value) == truth
        transport.write_tree(tmp_path / "out.bin", (value,))
    assert torch.equal(copy, value)
    assert torch.equal(transport.read_tree(tmp_path / "out.bin", 1 << 20)[0], value)
    assert not pristine.active_modes()


def test_output_files_ignore_a_patched_ctypes_string_at(tmp_path, monkeypatch):
    monkeypatch.setattr(ctypes, "string_at", lambda ptr, size=-1: b"\x00" * size)
    monkeypatch.setattr(ctypes, "_string_at", lambda ptr, size=-1: b"\x00" * size, raising=False)
    value = torch.full((64,), 3.0)
    transport.write_tree(tmp_path / "out.bin", value)
    assert torch.equal(transport.read_tree(tmp_path / "out.bin", 1 << 20), value)


def test_output_sequences_are_read_through_the_base_class():
    class Sneaky(tuple):  # noqa: SLOT001 - a candidate's output type
        def __iter__(self):
            raise AssertionError("candidate code ran while the harness read the output")

        def __getitem__(self, i):
            raise AssertionError("candidate code ran while the harness read the output")

    out = Sneaky((torch.ones(2), torch.zeros(1)))
    assert transport.describe_unsupported(out) is None
    copy = snapshot(out)
    assert type(copy) is tuple and torch.equal(copy[0], torch.ones(2))


def test_torchs_own_default_device_context_is_not_a_tripwire():
    with torch.device("cpu"):
        assert pristine.active_modes() == []
    with _Forge():
        assert pristine.active_modes() == ["function mode _Forge"]


def test_the_guard_names_a_rebound_ctypes_function(monkeypatch):
    guard = Guard()
    guard.capture()
    monkeypatch.setattr(ctypes, "memmove", lambda *a: None)
    assert "ctypes.memmove" in guard.violations()


# -- judged across the whole timing phase ----------------------------------------------------------
def test_the_plan_judges_a_random_sample_of_every_kind_of_call_and_every_probe():
    config = TimingConfig(warmup=10, iters=50, host_iters=10)
    plan = timing.make_plan(config, n_fresh=5, judged=22, probes=2, rng=random.Random(1))
    calls = [it for it in plan.iterations if it.kind != "probe"]
    assert len(calls) == 10 + 50 + 10 + 10 and len(plan.iterations) == len(calls) + 2
    assert sum(it.judged for it in calls) == 22 and all(it.judged for it in plan.iterations if it.kind == "probe")
    assert len({it.trial for it in plan.iterations}) == len(plan.iterations)  # every call its own recipe
    kinds = set()
    for salt in range(40):  # judged calls fall on warm-up, timed, host-timed and fresh calls alike
        kinds |= {it.kind for it in timing.make_plan(config, 5, 22, 0, random.Random(salt)).judged}
    assert kinds == {"warmup", "timed", "host", "fresh_pair", "fresh"}
    assert plan.without_refill().iterations == calls


@pytest.mark.parametrize("calls", [25, 80])
def test_a_fifth_of_the_calls_wrong_is_caught_with_probability_099(calls):
    judged = IntegrityConfig().timed_checks
    assert 1 - 0.8 ** judged >= 0.99  # the binomial bound docs/harness.md states
    miss = timing.miss_probability(calls, judged, 0.2)
    assert miss <= 0.8 ** judged <= 0.01  # drawn without replacement: never worse than the bound
    assert math.isclose(timing.miss_probability(100, 1, 0.2), 0.8)


def test_a_sample_of_a_large_output_keeps_a_wrong_answer_wrong():
    rng = random.Random(0)
    expected = torch.randn(3 << 20)
    kept = expected.clone()
    kept[::7] += 1.0  # a seventh of the elements wrong
    e, g = timing.sampled(expected, kept, 1 << 16, rng)
    assert e.numel() == g.numel() == 1 << 16 and not torch.allclose(e, g)
    small = (torch.ones(4), {"k": torch.zeros(2)})
    assert timing.sampled(small, small, 1 << 16, rng) == (small, small)
    other = torch.randn(5 << 20)
    assert timing.sampled(expected, other, 1 << 16, rng)[1] is other  # shapes differ: compared whole


# -- margins that match the work -------------------------------------------------------------------
def _stats(median: float, unexplained: float):
    from harness.records.results import TimingStats

    return TimingStats(median_ms=median, p10_ms=median, p90_ms=median, mean_ms=median, cv=0.0, iterations=10,
                       host_median_ms=median, input_sets=2, spin_us=0.0, slowest_rank=0, rank_medians_ms=[median],
                       clock="host", span_median_ms=median + unexplained, unexplained_low_ms=unexplained)


def test_the_margins_grow_with_what_a_call_costs():
    checks = IntegrityConfig.for_device("cuda")
    fast, slow = _stats(0.02, 0.3), _stats(2.0, 0.3)
    assert timing.unexplained_allowed(fast, fast, checks) == pytest.approx(checks.unexplained_margin_ms)
    assert timing.unexplained_allowed(fast, slow, checks) == pytest.approx(0.5 * 2.0)
    assert plausibility.caching_margin_ms(0.001, checks) == pytest.approx(checks.caching_margin_ms)
    assert plausibility.caching_margin_ms(4.0, checks) == pytest.approx(1.0)
    # The case: a remembered answer at 1/50 of an honest call's cost (1 ms) is input caching once
    # the never-seen buffers cost the honest time: the margin is a quarter of the reference's call or the
    # floor, not 10 ms.
    cpu = IntegrityConfig.for_device("cpu")
    assert plausibility.caching_suspected([(0.02, 1.0)] * 5, 1.0, cpu)
    assert not plausibility.caching_suspected([(1.0, 1.2)] * 5, 1.0, cpu)
    # Work hidden outside the claims: caught once it exceeds the larger of the floor and a call's cost.
    candidate = _stats(0.02, 0.3 + checks.unexplained_margin_ms * 2)
    assert timing.reconcile(candidate, _stats(0.02, 0.3), checks)
    assert not timing.reconcile(_stats(0.02, 0.3 + checks.unexplained_margin_ms / 2), _stats(0.02, 0.3), checks)


def test_write_tree_refuses_a_link_where_the_output_goes(tmp_path):
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"keep")
    link = tmp_path / "out.bin"
    link.symlink_to(target)
    with pytest.raises(OSError):
        transport.write_tree(Path(link), torch.ones(2))
    assert target.read_bytes() == b"keep"


# -- the rank's side of a timed call ---------------------------------------------------------------
@pytest.fixture
def one_rank_group():
    """A gloo group of one rank in this process: what the timed protocol's barrier needs."""
    import torch.distributed as dist

    if not dist.is_initialized():
        store = dist.HashStore()  # type: ignore[attr-defined]  # torch exports it without declaring it
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_timed_session_refills_the_same_buffers_and_hands_judged_calls_over(all_reduce, one_rank_group, tmp_path):
    from harness.rank.timed import TimedSession

    shape = all_reduce.shape("small")
    draw = refill.drawer(all_reduce, shape, 0, 1, CPU)
    seen: list[tuple[int, int, torch.Tensor]] = []

    def solution(x):
        seen.append((id(x), x.data_ptr(), x.clone()))
        out = x * 2
        if len(seen) == 3:
            x.zero_()  # uses its input as scratch space in the third call
        return out

    sets = [draw(seeds.fill_recipe(5, k, 0)) for k in range(2)]
    session = TimedSession(solution, sets, [], CPU, plain=transport.describe_unsupported, draw=draw)
    replies = []
    for i in range(4):
        keep = tmp_path / f"kept-{i - 1}.bin" if i else None
        fill = cast(messages.Recipe, seeds.fill_recipe(5, 100 + i, 0))
        replies.append(session.prepare(messages.TimePrepare(kind="timed", set=i % 2, fill=fill,
                                                            keep_previous=str(keep) if keep else None,
                                                            check_previous=bool(keep))))
        assert len(seen) == i  # preparing draws the inputs and hands over; only the call runs the candidate
        assert session.call(messages.TimeCall(kind="timed", set=i % 2))["ms"] >= 0
    end = session.finish(messages.TimeEnd(keep_previous=str(tmp_path / "kept-3.bin"), check_previous=True))
    assert seen[0][:2] == seen[2][:2] and seen[1][:2] == seen[3][:2]  # the same objects, the same memory ...
    assert not torch.equal(seen[0][2], seen[2][2]) and not torch.equal(seen[1][2], seen[3][2])  # ... new contents
    for i in range(4):  # each call's input is exactly its recipe's draw, and its output copy is of that call
        assert torch.equal(seen[i][2], draw(seeds.fill_recipe(5, 100 + i, 0))[0])
        assert torch.equal(transport.read_tree(tmp_path / f"kept-{i}.bin", 1 << 20), seen[i][2] * 2)
    intact = [r.get("kept_intact") for r in replies[1:]] + [end.get("kept_intact")]
    assert intact == [True, True, False, True]  # the third call zeroed its input
    assert all(r["refill_ms"] >= 0 for r in replies)
    assert [r["refilled"] for r in replies] == ["i"] * 4  # each said how its inputs were made: in place


def test_a_timed_call_never_runs_on_inputs_it_did_not_refill(all_reduce, one_rank_group):
    # Issue 45, class 7: a call without its prepare ran on the set as the previous call left it, and a recipe
    # the session could not draw rotated the set as given; both are refused now.
    from harness.rank.timed import TimedSession

    draw = refill.drawer(all_reduce, all_reduce.shape("small"), 0, 1, CPU)
    sets = [draw(seeds.fill_recipe(5, k, 0)) for k in range(2)]
    session = TimedSession(lambda x: x * 2, sets, [], CPU, plain=transport.describe_unsupported, draw=draw)
    with pytest.raises(RuntimeError, match="without its prepare"):
        session.call(messages.TimeCall(kind="timed", set=0))
    session.draw = None  # what a candidate that finds the session through gc can do
    with pytest.raises(RuntimeError, match="would not be refilled"):
        fill = cast(messages.Recipe, seeds.fill_recipe(5, 100, 0))
        session.prepare(messages.TimePrepare(kind="timed", set=0, fill=fill))
    # no recipe: rotated, and said so
    assert session.prepare(messages.TimePrepare(kind="timed", set=1))["refilled"] == "r"
