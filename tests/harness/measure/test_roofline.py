"""The roofline: the bound's arithmetic, the ceilings' fallback, every problem's declared traffic() against a
hand computation, an end-to-end roofline under gloo, the bounded text, and `pkb roofline`."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from agent import cli
from agent.cli import roofline as cli_roofline
from harness.launch.pool import RankPool
from harness.measure.roofline import (
    FALLBACK_CEILINGS,
    FALLBACK_SOURCE,
    Ceilings,
    Roofline,
    RooflineError,
    build_roofline,
    cached_trace,
    declared_traffic,
    lower_bound_ms,
    resolve_ceilings,
    roofline,
    time_reference,
    trace_cache_path,
)
from harness.problems.registry import get, load_suite
from harness.records.results import TimingStats
from tests.conftest import CANDIDATES
from tools.render import count_tokens
from tools.summaries import roofline_text as render_text

SUITE = load_suite()
DESIGN = Ceilings(link_bytes_per_s=394e9, link_source="t", hbm_bytes_per_s=4.28e12, hbm_source="t",
                  matmul_flops_per_s=790e12, matmul_source="t")


def stats(median_ms: float, clock: str = "cuda_events") -> TimingStats:
    return TimingStats(median_ms=median_ms, p10_ms=median_ms, p90_ms=median_ms, mean_ms=median_ms, cv=0.0,
                       iterations=10, host_median_ms=median_ms, input_sets=2, spin_us=20.0, slowest_rank=0,
                       rank_medians_ms=[median_ms, median_ms], clock=clock)


def traced(send: int, recv: int, hbm: int, flops: int) -> dict:
    return {"send_bytes": send, "recv_bytes": recv, "hbm_bytes": hbm, "flops": flops,
            "by_kind": {"all_reduce": {"count": 1, "bytes": send, "send_bytes": send, "recv_bytes": recv,
                                       "group_size": 2}}}


# -- arithmetic ---------------------------------------------------------------------------------------------


def test_bound_is_the_slowest_resource_of_the_slowest_rank():
    # rank 0 is link-bound (394 MB / 394 GB/s = 1 ms), rank 1 compute-bound (1.58 PFLOP... = 2 ms)
    ranks = [traced(394_000_000, 100, 4_280_000, 0), traced(10, 10, 0, 1_580_000_000_000)]
    r = build_roofline("p", "s", 2, "cuda", ranks, None, DESIGN)
    assert r.bound_rank == 1 and r.binding == "compute"
    assert r.bound_s == pytest.approx(2e-3)
    assert r.ranks[0].binding == "interconnect" and r.ranks[0].bound_s == pytest.approx(1e-3)
    assert r.ranks[0].hbm_s == pytest.approx(1e-6)
    assert r.traffic_source == "traced" and r.collectives[0].kind == "all_reduce"


def test_links_are_full_duplex_so_the_larger_direction_counts():
    r = build_roofline("p", "s", 1, "cuda", [traced(394_000_000, 788_000_000, 0, 0)], None, DESIGN)
    assert r.link_s == pytest.approx(2e-3)


def test_declared_traffic_wins_key_by_key():
    declared = [{"send_bytes": 0.0, "recv_bytes": 0.0}, {"send_bytes": 0.0, "recv_bytes": 0.0}]
    ranks = [traced(394_000_000, 394_000_000, 4_280_000_000, 0)] * 2
    r = build_roofline("p", "s", 2, "cuda", ranks, declared, DESIGN)
    assert r.traffic_source == "declared+traced" and r.declared == ["send_bytes", "recv_bytes"]
    assert r.binding == "hbm" and r.bound_s == pytest.approx(1e-3)
    assert r.ranks[0].sources == {"send_bytes": "declared", "recv_bytes": "declared", "hbm_bytes": "traced",
                                  "flops": "traced"}


def test_fractions_and_the_impossible_flag():
    ranks = [traced(394_000_000, 394_000_000, 0, 0)] * 2  # bound 1 ms
    r = build_roofline("p", "s", 2, "cuda", ranks, None, DESIGN, reference=stats(1.25), candidate=stats(0.5))
    assert r.reference is not None and r.candidate is not None
    assert r.reference.fraction == pytest.approx(0.8) and not r.reference.impossible
    assert r.candidate.fraction == pytest.approx(2.0) and r.candidate.impossible
    assert r.impossible and r.flags == ["candidate_below_roofline"]
    # within the 10% margin: fast, not impossible
    assert not build_roofline("p", "s", 2, "cuda", ranks, None, DESIGN, candidate=stats(0.95)).impossible
    # host clocks (CPU runs) are never held to GPU ceilings
    cpu = build_roofline("p", "s", 2, "cpu", ranks, None, DESIGN, candidate=stats(0.1, "host"))
    assert not cpu.impossible and any("CPU" in n for n in cpu.notes)
    # a reference under the bound means the model is wrong, and says so
    bad = build_roofline("p", "s", 2, "cuda", ranks, None, DESIGN, reference=stats(0.5))
    assert "reference_below_roofline" in bad.flags and any("model" in n for n in bad.notes)


def test_tiny_bounds_are_called_latency_territory():
    r = build_roofline("p", "s", 2, "cuda", [traced(1024, 1024, 2048, 0)] * 2, None, DESIGN)
    assert r.bound_s < 1e-8 and any("latency" in n for n in r.notes)


# -- ceilings -----------------------------------------------------------------------------------------------


def test_ceilings_fall_back_to_design_figures_per_value():
    c = resolve_ceilings({"link_bytes_per_s": 300e9, "link_source": "measured", "hbm_bytes_per_s": None,
                          "hbm_source": "unavailable", "matmul_flops_per_s": 0, "gpu": "H200", "notes": ["n"]})
    assert (c.link_bytes_per_s, c.link_source) == (300e9, "measured")
    assert (c.hbm_bytes_per_s, c.hbm_source) == (FALLBACK_CEILINGS["hbm_bytes_per_s"], FALLBACK_SOURCE)
    assert (c.matmul_flops_per_s, c.matmul_source) == (790e12, FALLBACK_SOURCE)
    assert c.gpu == "H200" and c.notes == ["n"]


def test_ceilings_fall_back_when_the_cached_profile_cannot_be_read(monkeypatch):
    def unreadable() -> None:
        raise ValueError("not a profile")

    monkeypatch.setattr("harness.measure.roofline.topology", SimpleNamespace(load=unreadable, ceilings=None))
    c = resolve_ceilings(None, device="cuda")
    assert c.link_bytes_per_s == 394e9 and c.hbm_bytes_per_s == 4.28e12 and c.matmul_flops_per_s == 790e12
    assert {c.link_source, c.hbm_source, c.matmul_source} == {FALLBACK_SOURCE}
    assert any("ValueError: not a profile" in n for n in c.notes)


def test_ceilings_use_the_cached_topology_profile(monkeypatch):
    fake = SimpleNamespace(load=lambda: "profile", ceilings=lambda profile: {
        "link_bytes_per_s": 390e9, "link_source": "measured", "hbm_bytes_per_s": 4.1e12, "hbm_source": "measured",
        "matmul_flops_per_s": 760e12, "matmul_source": "measured", "gpu": "NVIDIA H200", "notes": []})
    monkeypatch.setattr("harness.measure.roofline.topology", fake)
    c = resolve_ceilings(None, device="cpu")
    assert (c.link_bytes_per_s, c.link_source, c.gpu) == (390e9, "measured", "NVIDIA H200")
    # no cached profile and a CPU run: no slow discovery, the reference machine's figures
    monkeypatch.setattr(fake, "load", lambda: None)
    c = resolve_ceilings(None, device="cpu")
    assert c.link_source == FALLBACK_SOURCE and any("cached" in n for n in c.notes)


# -- declared traffic: validation and every problem's numbers by hand ---------------------------------------


def fake_problem(fn, shape=None):
    return SimpleNamespace(name="fake", traffic=fn, shape=lambda name: shape or {})


def test_declared_traffic_shapes_and_errors():
    assert declared_traffic(fake_problem(None), "s", 2) is None
    assert declared_traffic(fake_problem(lambda s, w: {"flops": 7}), "s", 3) == [{"flops": 7.0}] * 3
    assert declared_traffic(fake_problem(lambda s, w: [{"send_bytes": r} for r in range(w)]), "s", 2) == [
        {"send_bytes": 0.0}, {"send_bytes": 1.0}]
    for bad, needle in [(lambda s, w: [{}], "1 ranks"), (lambda s, w: {"bytes": 1}, "unknown keys"),
                        (lambda s, w: {"flops": -1}, "non-negative"), (lambda s, w: {"flops": True}, "non-negative"),
                        (lambda s, w: 1 / 0, "ZeroDivisionError")]:
        with pytest.raises(RooflineError, match=needle):
            declared_traffic(fake_problem(bad), "s", 2)


SMALL_PARAMS = [[37, 16], [24, 16], [16, 16], [64, 16], [16, 56], [16], [29]]
ONE_HOT = {"tokens": 16, "hidden": 32, "experts": 8, "topk": 8}  # every token reaches every rank: no sampling


def same(value: float) -> dict:
    return {"send_bytes": value, "recv_bytes": value}


# (problem, shape name or dict, W, expected: one dict for every rank, or a {rank: dict} of ranks to check)
HAND = [
    ("all_gather_v", "default", 4, {**same(3 * 1024 * 14336), "hbm_bytes": 5 * 1024 * 14336}),
    ("reduce_scatter_v", "default", 4, same(3 * 8192 * 7168 * 2 / 4)),
    # 7 params, chunks of ceil(rows / 2) per shard: 1607 elements per shard, 3214 in all; each rank reduces
    # 3214 / 4 elements: bf16 from 3 peers, fp32 to/from its replica.
    ("hsdp_reduce_scatter_all_reduce", {"params": SMALL_PARAMS}, 4, same(3214 / 4 * (2 * 3 + 4 * 1))),
    # W=4: rank 0 owns one param of every batch; rank 2 owns none of the short batches.
    ("muon_distributed_reshard", "default", 4, {0: same(33_554_432 + 8_388_608 + 117_440_512 + 88_080_384),
                                                2: same(16_777_216 + 4_194_304 + 58_720_256 + 29_360_128)}),
    ("muon_distributed_reshard", "default", 2, same(218_103_808)),
    ("grad_norm_clip_all_reduce", {"params": SMALL_PARAMS}, 2, {0: {"hbm_bytes": 3 * 1607 * 4 + 4},
                                                                 1: {"hbm_bytes": 3 * 1590 * 4 + 4}}),
    ("expert_major_2d_alltoall", "default", 4, same(3 * 64 * 128 * 4096 * 2 / 4)),
    # capacity 16 >= tokens: every top-2 choice fits, 32 filled slots of 32 bf16 values, 8 x 16 slot bits
    ("gshard_capacity_alltoall", {"tokens": 16, "hidden": 32, "experts": 8, "capacity_factor": 4.0,
                                  "min_capacity": 4}, 2, {**same((32 * 32 * 2 + 8 * 16 / 8) / 2), "flops": 0}),
    # top-8 of 8 experts: 16 rows per peer, 16 x 4 fp32 probs, 16 x 4 routing bits
    ("moe_allgather_dispatch", ONE_HOT, 2, same(16 * 32 * 2 + 16 * 4 * 4 + 8)),
    ("moe_allgather_dispatch", ONE_HOT, 4, same(3 * (16 * 32 * 2 + 16 * 2 * 4 + 4))),
    ("moe_alltoall_dispatch", ONE_HOT, 2, same(16 * 32 * 2 + 16 * 4 * 4 + 8)),
    ("moe_alltoall_combine", ONE_HOT, 2, same(16 * 32 * 2 + 16 * 4 * 4 + 8)),
    # per (token, rank): 256 fp8 + 2 fp32 scales + int32 index + 1 byte of expert bits
    ("deepep_low_latency_dispatch_fp8", {**ONE_HOT, "hidden": 256}, 2, same(16 * (256 + 8 + 4 + 1))),
    ("deepep_low_latency_combine", ONE_HOT, 2, same(16 * 32 * 2 + 16 * 4 * 4)),
    ("moe_reduce_scatter_combine", ONE_HOT, 2, same(16 * 32 * 2)),
    ("moe_token_count_exchange", "default", 8, same(7 * 32 * 8)),
    ("fsdp2_reduce_scatter_chunk_cat", {"params": SMALL_PARAMS}, 2, same(3214)),
    # 3197 elements, partitions of 1600: a bf16 reduce-scatter (the suite's own declaration)
    ("zero12_uneven_reduce_scatter", "small", 2, {**same(3200), "hbm_bytes": 2 * (3197 + 1600), "flops": 4797}),
    ("gather_logits_at_indices", "default", 2,
     {**same(262_144 * 4 / 2), "hbm_bytes": 262_144 * 8 + 262_144 + 262_144 * 4}),
    ("distributed_log_prob", "default", 2, same(4096 * (8 + 2))),
    ("distributed_log_prob", "default", 4, same(4096 * (12 + 3))),
    ("chunked_log_prob", "default", 2, same(4096 * (8 + 2))),
    ("vocab_parallel_cross_entropy", "default", 2, same(4096 * (8 + 2))),
    ("fused_lm_head_log_prob", "default", 2, same(2048 * 3584 * 2 + 4096 * (8 + 2))),
    ("vocab_parallel_embedding", "default", 2,
     {**same(33_554_432), "hbm_bytes": 4096 * 8 + 33_554_432 + 67_108_864, "flops": 0}),
    ("fp8_all_gather_scaled_gemm", "default", 2, {"flops": 4096 * 8192 * 14336}),
    ("distributed_knn", "default", 2, {"flops": 256 * (1 << 19) * 128}),
    ("gnn_feature_all_to_all", "default", 2, {"hbm_bytes": 196_608 * (16 + 4 * 128)}),
    # valid rows: (16384 + 32768) / 2 / 2 = 12288 per rank
    ("decode_context_parallel", "default", 2, {"hbm_bytes": 2 * 32 * 16 * 128 * 2 + 2 * 32 * 12288 * 8 * 128 * 2
                                               + 32 * 4, "flops": 4 * 32 * 32 * 128 * 12288}),
    # zigzag chunks of 8: rank 0 holds positions 0-7 and 24-31, sum(p + 1) = 36 + 228 = 264 causal pairs
    ("all_gather_kv_attention", "small", 2, {"flops": 4 * 2 * 8 * 16 * 264}),
    ("zigzag_ring_attention", "small", 2, {"flops": 4 * 2 * 4 * 16 * 264}),
    ("usp_2d_attention", "small", 4, {"flops": 4 * 2 * 2 * 16 * 264}),
    # 16 tokens per rank; rank 1 sees block 0 whole (256) and its own causally (136); 5 products of 2d
    ("ring_attention_backward", "small", 2, {0: {"flops": 10 * 2 * 4 * 16 * 136},
                                             1: {"flops": 10 * 2 * 4 * 16 * (256 + 136)}}),
    # rank r holds positions 2i + r: sum(p + 1) = 256 for rank 0, 272 for rank 1
    ("stripe_attention", "small", 2, {0: {"flops": 4 * 2 * 4 * 16 * 256}, 1: {"flops": 4 * 2 * 4 * 16 * 272}}),
    ("ulysses_attention", "small", 2, {"flops": 4 * 2 * 4 * 16 * 32 * 33 // 2}),
    ("nemo_rl_cp_gather_shift", "default", 2, same(4096 * 4 + 16)),
    # one document: rank r's 16 queries see positions 0..g (sum 256 r + 136), need 16 r earlier K/V rows
    # (128 bytes each) and send their 16 rows to the 3 - r later ranks
    ("llama3_varlen_attention", {"tokens": 64, "docs": 1, "heads": 8, "kv_heads": 2, "head_dim": 16,
                                 "heads_k_stride": 1}, 4,
     {r: {"send_bytes": (3 - r) * 16 * 128, "recv_bytes": 16 * r * 128, "flops": 512 * (256 * r + 136)}
      for r in range(4)}),
]


@pytest.mark.parametrize(("name", "shape", "world_size", "want"), HAND,
                         ids=[f"{h[0]}-W{h[2]}" for h in HAND])
def test_declared_traffic_matches_hand_computation(name, shape, world_size, want):
    problem = get(SUITE, name)
    dims = problem.shape(shape) if isinstance(shape, str) else shape
    stand_in: Any = SimpleNamespace(name=name, traffic=problem.traffic, shape=lambda _: dims)  # a Problem's fields
    got = declared_traffic(stand_in, "x", world_size)
    assert got is not None
    checks = {r: want for r in range(world_size)} if not all(isinstance(k, int) for k in want) else want
    for rank, expected in checks.items():
        assert got[rank] == pytest.approx(expected), (rank, got[rank])


def test_every_declared_traffic_has_a_hand_check():
    declared = {p.name for p in SUITE if p.traffic is not None}
    assert declared == {h[0] for h in HAND}


def test_every_declared_traffic_runs_at_every_shape_and_world_size():
    for p in SUITE:
        if p.traffic is None:
            continue
        for shape in ("small", "default"):
            for w in p.world_sizes:
                entries = declared_traffic(p, shape, w)
                assert entries is not None and len(entries) == w and all(entries), (p.name, shape, w)


# -- end to end under gloo ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool2():
    with RankPool(2, "cpu") as pool:
        yield pool


def test_roofline_of_a_traced_reference(pool2):
    problem = get(SUITE, "all_reduce")
    ref = time_reference(pool2, problem, "small", "cpu")
    r = roofline(problem, "small", 2, "cpu", DESIGN, reference_result=ref, pool=pool2)
    size = 8 * 64 * 2  # bf16 [8, 64]
    assert r.traffic_source == "traced" and r.send_bytes == r.recv_bytes == size  # 2(W-1)/W * S at W=2
    assert r.hbm_bytes == 2 * size and r.flops == 0
    assert r.binding == "interconnect" and r.bound_s == pytest.approx(size / 394e9)
    assert r.reference is not None and r.reference.clock == "host" and not r.impossible
    assert [k.kind for k in r.collectives] == ["all_reduce"]
    again = Roofline.model_validate_json(r.model_dump_json())
    assert again == r
    text = render_text(r)
    assert count_tokens(text) <= 600
    assert "all_reduce" in text and "interconnect-bound" in text


def test_roofline_prefers_declared_traffic(pool2):
    problem = get(SUITE, "zero12_uneven_reduce_scatter")
    r = roofline(problem, "small", 2, "cpu", DESIGN, pool=pool2)
    assert r.traffic_source == "declared" and r.send_bytes == 3200
    # the traced all-reduce is still shown: it is what the reference does
    assert [k.kind for k in r.collectives] == ["all_reduce"] and r.collectives[0].send_bytes == 2 * 3197


def test_render_text_stays_within_budget_whatever_the_notes():
    ranks = [traced(10**9, 10**9, 10**9, 10**12)] * 8
    r = build_roofline("p" * 50, "s", 8, "cpu", ranks, None, DESIGN, reference=stats(3.0, "host"))
    r.notes.extend(f"a long note number {i} " * 12 for i in range(40))
    for budget in (600, 120):
        text = render_text(r, max_tokens=budget)
        assert count_tokens(text) <= budget
        assert text.startswith("roofline ")
    assert "cut to fit" in render_text(r, max_tokens=200)


def test_trace_cache_and_lower_bound(pool2, monkeypatch):
    problem = get(SUITE, "all_gather")
    assert lower_bound_ms(problem, "small", 2, "cpu") is None  # CPU timings are never judged
    first = cached_trace(problem, "small", 2, "cpu", pool=pool2)
    assert trace_cache_path(problem, "small", 2, "cpu").exists()
    import harness.measure.roofline as rl

    monkeypatch.setattr(rl, "trace_reference", lambda *a, **k: pytest.fail("traced again"))
    assert cached_trace(problem, "small", 2, "cpu") == first
    assert trace_cache_path(problem, "small", 2, "cpu") != trace_cache_path(problem, "small", 4, "cpu")


def test_a_failing_reference_is_a_roofline_error(tmp_path):
    path = tmp_path / "collective" / "broken_ref.py"
    path.parent.mkdir()
    path.write_text(
        "import torch\nimport torch.distributed as dist\n"
        "PROBLEM = {'name': 'broken_ref', 'category': 'collective', 'source': {'codebase': 't', 'path': 't', "
        "'symbol': 't'}, 'summary': 'raises', 'dtype': 'float32', 'shapes': {'default': {}, 'small': {}}, "
        "'world_sizes': [2], 'tolerance': {'atol': 0, 'rtol': 0}}\n"
        "def make_inputs(shape, rank, world_size, generator, device):\n"
        "    return (torch.randn(2, generator=generator, device=device),)\n"
        "def solution(x):\n    raise ValueError('no reference today')\n"
        "def oracle(shape, world_size, inputs_by_rank):\n    return []\n")
    from harness.problems.problem import load_problem

    with pytest.raises(RooflineError, match="no reference today"):
        roofline(load_problem(path), "small", 2, "cpu", DESIGN)


# -- pkb roofline -------------------------------------------------------------------------------------------


@pytest.fixture
def pkb(monkeypatch):
    if cli_roofline not in cli.COMMAND_MODULES:  # until agent/cli.py lists it
        monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, cli_roofline))
    return cli.main


def test_cli_roofline_json_with_a_candidate(pkb, capsys):
    code = pkb(["roofline", "--problem", "all_reduce", "--solution", str(CANDIDATES / "correct_all_gather_sum.py"),
                "--json"])
    assert code == 0
    r = Roofline.model_validate(json.loads(capsys.readouterr().out))
    assert r.candidate is not None and r.reference is not None and r.candidate.fraction > 0
    assert r.send_bytes == 8 * 64 * 2


def test_cli_roofline_table_and_text(pkb, capsys):
    assert pkb(["roofline", "--problem", "all_gather", "--no-timing"]) == 0
    out = capsys.readouterr().out
    assert "roofline all_gather" in out and "all_gather_into_tensor" in out
    assert pkb(["roofline", "--problem", "all_gather", "--no-timing", "--text"]) == 0
    text = capsys.readouterr().out
    assert count_tokens(text) <= 601 and text.startswith("roofline all_gather")


@pytest.mark.parametrize(("argv", "needle"), [
    (["--problem", "all_reduc"], "did you mean all_reduce"),
    (["--problem", "all_reduce", "--shape", "huge"], "has no shape 'huge'"),
    (["--problem", "usp_2d_attention", "--world-size", "2"], "does not support world size 2"),
    (["--problem", "all_reduce", "--solution", "/no/such.py"], "does not exist"),
])
def test_cli_roofline_bad_input_is_one_line(pkb, capsys, argv, needle):
    assert pkb(["roofline", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.gpu
def test_gpu_roofline_of_nccl_all_reduce_is_plausible():
    problem = get(SUITE, "all_reduce")
    with RankPool(2, "cuda") as pool:
        ref = time_reference(pool, problem, "default", "cuda")
        r = roofline(problem, "default", 2, "cuda", reference_result=ref, pool=pool)
    assert r.binding == "interconnect" and r.send_bytes == 4096 * 8192 * 2
    assert r.reference is not None and 0.2 < r.reference.fraction <= 1.1 and not r.impossible
