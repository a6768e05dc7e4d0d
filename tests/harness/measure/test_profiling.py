"""Profiling: timeline arithmetic on synthetic traces, a real per-rank profile under gloo, Nsight Compute's
CSV and log parsing, the ncu driver end to end with a stand-in `ncu` (CPU), and `pkb profile`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent import cli
from agent.cli import profile as cli_profile
from harness.common.kernel_names import short_name
from harness.common.paths import REPO_ROOT
from harness.measure import ncu as nsight
from harness.measure.profiling import ProfileError, profile
from harness.problems.registry import get, load_suite
from harness.rank.timeline import (
    classify,
    cpu_events,
    device_events,
    device_windows,
    idle_gaps,
    intersection_length,
    summarize,
    summarize_trace,
    union,
)
from tests.conftest import CANDIDATES, live_children
from tests.harness.measure.ncu_support import fake_ncu
from tools.render import count_tokens
from tools.summaries import ncu_lines
from tools.summaries import profile_text as render_text

SUITE = load_suite()
GOOD = CANDIDATES / "correct_all_gather_sum.py"


# -- interval arithmetic and names ----------------------------------------------------------------------


def test_interval_helpers():
    assert union([(5, 7), (0, 2), (1, 3), (7, 8), (9, 9)]) == [(0, 3), (5, 8)]
    assert intersection_length([(0, 10), (20, 30)], [(5, 25)]) == 10
    assert idle_gaps([(2, 4), (6, 9)], 0, 10) == [2, 2, 1]
    assert idle_gaps([], 0, 3) == [3]


def test_kernel_names_and_kinds():
    assert classify("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "comm"
    assert classify("one_shot_all_reduce") == "comm"
    assert classify("all_gather_pull") == "comm"
    assert classify("Memcpy PtoP (Device -> Device)") == "comm"
    assert classify("sm90_xmma_gemm_bf16bf16_bf16f32") == "compute"
    assert classify("Memcpy DtoD (Device -> Device)") == "compute"
    assert short_name("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == \
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    assert short_name("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)") \
        == "at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
    assert len(short_name("void k<" + "x" * 200 + ">(int)")) <= 80


# -- GPU timeline windows on a synthetic Chrome trace ------------------------------------------------------


def kernel(name: str, start: float, end: float, stream: int = 7, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": start, "dur": end - start, "pid": 0, "tid": stream,
            "args": {"stream": stream, "device": 0}}


SPIN = "void at::cuda::(anonymous namespace)::spin_kernel(long)"
BARRIER = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GPU_TRACE = [
    # iteration 1: window [110, 195]; gemm and the all-reduce overlap for 10 us; idle 2 + 5 us
    kernel(SPIN, 0, 100), kernel(BARRIER, 100, 110, stream=20),
    kernel("gemm_kernel", 112, 150), kernel("one_shot_all_reduce", 140, 180, stream=21),
    kernel("Memcpy PtoP (Device -> Device)", 185, 195, stream=22, cat="gpu_memcpy"),
    # iteration 2: window [1105, 1185], back to back
    kernel(SPIN, 1000, 1100), kernel(BARRIER, 1100, 1105, stream=20),
    kernel("gemm_kernel", 1105, 1145), kernel("one_shot_all_reduce", 1145, 1185, stream=21),
    # host-side events never count on a GPU
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 120, "dur": 5, "pid": 1, "tid": 1},
]


def test_device_windows_follow_the_spin_markers():
    windows, inside, source = device_windows(device_events(GPU_TRACE))
    assert source == "spin markers"
    assert windows == [(110, 195), (1105, 1185)]
    assert {ev.name for ev in inside} == {"gemm_kernel", "one_shot_all_reduce", "Memcpy PtoP (Device -> Device)"}


def test_gpu_summary_arithmetic():
    s = summarize_trace(GPU_TRACE, "cuda")
    assert s["iterations"] == 2
    assert s["call_us"] == pytest.approx((85 + 80) / 2) and s["call_median_us"] == pytest.approx(82.5)
    assert s["comm_us"] == pytest.approx((50 + 40) / 2)  # [140,180] + [185,195]; then [1145,1185]
    assert s["compute_us"] == pytest.approx((38 + 40) / 2)
    assert s["overlap_us"] == pytest.approx(10 / 2)
    assert s["idle_us"] == pytest.approx(7 / 2)
    assert s["busy_us"] + s["idle_us"] == pytest.approx(s["call_us"])
    assert s["gaps_per_iter"] == pytest.approx(1.0) and s["largest_gap_us"] == pytest.approx(5)
    assert s["lanes"] == 3
    kernels = {k["name"]: k for k in s["kernels"]}
    assert kernels["one_shot_all_reduce"] == {"name": "one_shot_all_reduce", "kind": "comm", "us_per_iter": 40.0,
                                              "launches_per_iter": 1.0}
    assert kernels["gemm_kernel"]["us_per_iter"] == pytest.approx(39) and kernels["gemm_kernel"]["kind"] == "compute"
    assert kernels["Memcpy PtoP (Device -> Device)"]["launches_per_iter"] == 0.5
    assert SPIN not in kernels and short_name(BARRIER) not in kernels  # the harness's own kernels


def test_gpu_trace_without_markers_is_one_window_and_says_so():
    trace = [kernel("gemm_kernel", 0, 10), kernel("one_shot_all_reduce", 20, 30)]
    s = summarize_trace(trace, "cuda")
    assert s["window_source"].startswith("whole profile") and s["call_us"] == 30 and s["idle_us"] == 10


def test_cpu_events_keep_top_level_operators_and_gloo_work():
    trace = [
        {"ph": "X", "cat": "user_annotation", "name": "pkb::call", "ts": 5, "dur": 70, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::matmul", "ts": 10, "dur": 40, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 12, "dur": 36, "tid": 1},  # nested: not counted
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 55, "dur": 1, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 56, "dur": 14, "tid": 2},
    ]
    events, windows = cpu_events(trace)
    assert windows == [(5, 75)]
    assert [(e.name, e.kind) for e in events] == [("aten::matmul", "compute"), ("c10d::allreduce_", "comm"),
                                                  ("gloo:all_reduce", "comm")]
    s = summarize(events, windows)
    assert (s["call_us"], s["compute_us"], s["comm_us"], s["idle_us"]) == (70, 40, 15, 15)
    assert s["gaps_per_iter"] == 3 and s["overlap_us"] == 0


# -- a real profile under gloo --------------------------------------------------------------------------


def test_profile_of_a_candidate_on_cpu():
    problem = get(SUITE, "all_reduce")
    report = profile(problem, GOOD, world_size=2, device="cpu", shape="small", warmup=1, iters=3)
    assert live_children() == []
    assert report.target == GOOD.name and report.iterations == 3 and len(report.ranks) == 2
    for r in report.ranks:
        assert r.iterations == 3 and r.call_us > 0
        assert r.busy_us + r.idle_us == pytest.approx(r.call_us, rel=1e-6)
        assert r.comm_us > 0, r.kernels  # the candidate's all-gather, seen as gloo/c10d work
        assert any(k.kind == "comm" for k in r.kernels)
    assert report.slowest_rank in (0, 1) and 0 <= report.skew < 1
    assert json.loads(json.dumps(report.to_dict()))["ranks"][0]["iterations"] == 3
    text = render_text(report)
    assert count_tokens(text) <= 600 and "slowest rank" in text


def test_a_failing_candidate_is_a_profile_error():
    with pytest.raises(ProfileError) as err:
        profile(get(SUITE, "all_reduce"), CANDIDATES / "runtime_error_rank1.py", world_size=2, device="cpu",
                shape="small", warmup=1, iters=1)
    assert err.value.verdict == "runtime_error" and "rank 1" in str(err.value)
    assert live_children() == []


# -- Nsight Compute: parsing ----------------------------------------------------------------------------


RAW_CSV = textwrap.dedent('''\
    ==PROF== Disconnected from process 4242
    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum","nvltx__bytes.sum","nvlrx__bytes.sum","launch__registers_per_thread","sm__throughput.avg.pct_of_peak_sustained_elapsed"
    "","","","","","","","","","","","nsecond","byte","Kbyte","register/thread","%"
    "0","4242","python3","h","one_shot_all_reduce","1","7","(512, 1, 1)","(132, 1, 1)","0","9.0","12,345","1,048,576","1024","40","12.5"
    "1","4242","python3","h","one_shot_all_reduce","1","7","(512, 1, 1)","(132, 1, 1)","0","9.0","12,000","1,048,576","n/a","40","n/a"
    "2","4242","python3","h","rmsnorm","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0","1,000","0","0","32","50"
    ''')  # noqa: E501
METRICS = ("gpu__time_duration.sum", "nvltx__bytes.sum", "nvlrx__bytes.sum", "launch__registers_per_thread",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes_read.sum")


def test_raw_csv_parsing_with_units_and_missing_values():
    rows, present = nsight.parse_raw_csv(RAW_CSV, METRICS)
    assert present == set(METRICS) - {"dram__bytes_read.sum"}  # never reported: no column
    assert [r["kernel"] for r in rows] == ["one_shot_all_reduce", "one_shot_all_reduce", "rmsnorm"]
    assert rows[0]["gpu__time_duration.sum"] == 12345 and rows[0]["nvltx__bytes.sum"] == 1_048_576
    assert rows[0]["nvlrx__bytes.sum"] == 1_024_000  # Kbyte -> bytes
    assert rows[1]["nvlrx__bytes.sum"] is None and rows[1]["sm__throughput.avg.pct_of_peak_sustained_elapsed"] is None


def test_aggregate_per_kernel_and_per_call():
    rows, _ = nsight.parse_raw_csv(RAW_CSV, METRICS)
    kernels, per_call = nsight.aggregate(rows, METRICS, calls=2)
    assert [k.name for k in kernels] == ["one_shot_all_reduce", "rmsnorm"]
    ar = kernels[0]
    assert ar.launches == 2 and ar.metrics["gpu__time_duration.sum"] == 24345
    assert ar.metrics["launch__registers_per_thread"] == 40 and ar.metrics["dram__bytes_read.sum"] is None
    assert per_call["gpu__time_duration.sum"] == pytest.approx(25345 / 2)
    assert per_call["nvltx__bytes.sum"] == pytest.approx(2 * 1_048_576 / 2)
    assert per_call["launch__registers_per_thread"] == 40
    # percentages are weighted by GPU time over the launches that have one
    assert per_call["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(
        (12.5 * 12345 + 50 * 1000) / (12345 + 1000))


def test_runs_merge_launch_by_launch():
    a = [{"kernel": "k", "gpu__time_duration.sum": 10.0}, {"kernel": "k", "gpu__time_duration.sum": 11.0}]
    b = [{"kernel": "k", "sm__x.pct": 5.0}, {"kernel": "k", "sm__x.pct": 6.0}]
    merged = nsight.merge_runs([a, b])
    assert merged == [{"kernel": "k", "gpu__time_duration.sum": 10.0, "sm__x.pct": 5.0},
                      {"kernel": "k", "gpu__time_duration.sum": 11.0, "sm__x.pct": 6.0}]


def test_log_parsing():
    log = ('==PROF== Profiling "one_shot_all_reduce" - 0: 0%....50%....100% - 1 pass\n'
           '==PROF== Profiling "rmsnorm" - 1: 0%....50%....100% - 3 passes\n'
           "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters\n"
           "==ERROR== something else broke\n==WARNING== No kernels were profiled.\n")
    assert nsight.parse_passes(log) == {"one_shot_all_reduce": 1, "rmsnorm": 3}
    said = nsight.log_problems(log)
    assert any("permission" in s for s in said) and "something else broke" in said
    assert any("no kernel" in s for s in said)


def test_metrics_ncu_cannot_read_here_are_named_by_their_base():
    # As ncu 2025.3 said it on the one-H200 machine (2026-12-01), for the agent set's NVLink counters.
    log = ("==PROF== Connected to process 835\n==ERROR== Unable to access the following 8 metrics: nvlrx__bytes.avg, "
           "nvlrx__bytes.max, nvlrx__bytes.min, nvlrx__bytes.sum, nvltx__bytes.avg, nvltx__bytes.max, "
           "nvltx__bytes.min, nvltx__bytes.sum.\n==ERROR== Failed to profile \"one_shot_all_reduce\" in process 835\n")
    agent = nsight.METRIC_SETS["agent"]
    assert nsight.unreadable_metrics(log, agent) == ["nvltx__bytes.sum", "nvlrx__bytes.sum"]
    assert nsight.unreadable_metrics("==PROF== Profiling \"k\" - 0: 1 pass\n", agent) == []


def test_a_set_with_an_unreadable_metric_runs_again_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """One metric ncu cannot access fails the whole run; collect runs the set again without it and says why."""
    calls: list[tuple[str, ...]] = []

    def one_run(ncu, problem, candidate, name, metrics, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append(tuple(metrics))
        if "nvltx__bytes.sum" in metrics:
            return nsight.NcuRun(name, list(metrics), [], "timeout", unreadable=["nvltx__bytes.sum"]), [], set()
        rows = [{"kernel": "k", **{m: 1.0 for m in metrics}}]
        return nsight.NcuRun(name, list(metrics), [], "collected"), rows, set(metrics)

    monkeypatch.setattr(nsight, "_one_run", one_run)
    monkeypatch.setattr(nsight, "ncu_path", lambda: "/usr/bin/ncu")
    wanted = ["gpu__time_duration.sum", "nvltx__bytes.sum"]
    report = nsight.collect(SimpleNamespace(loader_spec="x"), None, world_size=2, device="cuda", shape="small",
                            metrics=wanted, budget_s=120.0)
    assert calls == [tuple(wanted), ("gpu__time_duration.sum",)]
    assert report.status == "partial" and "gpu__time_duration.sum" not in report.missing
    assert "not readable here" in report.missing["nvltx__bytes.sum"]


def test_metric_sets_and_the_command_never_locks_clocks():
    assert [name for name, _ in nsight.resolve_sets(None)] == list(nsight.DEFAULT_SETS)
    assert nsight.resolve_sets(["core", "sm__cycles_active.avg"])[-1] == ("custom", ("sm__cycles_active.avg",))
    with pytest.raises(ValueError, match="unknown ncu metric set"):
        nsight.resolve_sets(["bogus"])
    cmd = nsight.ncu_command("ncu", Path("/tmp/r.ncu-rep"), ["a__b.sum", "c__d.sum"], launch_count=9)

    def value(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert value("--clock-control") == "none" and value("--cache-control") == "none"
    assert value("--replay-mode") == "kernel" and value("--profile-from-start") == "off"
    assert value("--launch-count") == "9" and value("--metrics") == "a__b.sum,c__d.sum"
    assert "base" not in cmd  # clocks are never locked to base
    assert value("--kernel-name-base") == "function"
    assert value("--kernel-name") == "regex:^(?!(?:pkb_emu_barrier|pkb_emu_put_signal|pkb_emu_wait_signal)$)"
    assert "--kernel-name" not in nsight.ncu_command("ncu", Path("/tmp/r"), ["a__b.sum"], skip=())


def test_the_skip_filter_leaves_out_only_the_named_kernels():
    """ncu reads the filter as an ECMAScript regex; Python's `re` agrees on this subset (look-ahead, anchors)."""
    pattern = re.compile(nsight.skip_filter(nsight.NOT_PROFILED).removeprefix("regex:"))
    for name in nsight.NOT_PROFILED:
        assert not pattern.search(name)
    for name in ("one_shot_all_reduce", "pkb_emu_barrier_of_mine", "sum_slots", "my_pkb_emu_barrier"):
        assert pattern.search(name), name


def test_a_replay_that_never_finishes_is_counted_again_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that waits on its peer hangs ncu's replayed passes (one H200, 2026-12-02): the set gets a share of
    the budget, then the one-pass metrics are collected, and what only a replay gives is named with why."""
    calls: list[tuple[str, tuple[str, ...], float]] = []
    monkeypatch.setattr(nsight, "time", SimpleNamespace(monotonic=lambda: 1000.0))  # a clock that stands still

    def one_run(ncu, problem, candidate, name, metrics, *, deadline, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append((name, tuple(metrics), deadline - 1000.0))
        if name == "agent":
            return nsight.NcuRun(name, list(metrics), [], "timeout", message="ranks [0] did not finish"), [], set()
        rows = [{"kernel": "all_gather_pull", **{m: 2.0 for m in metrics}}]
        return nsight.NcuRun(name, list(metrics), [], "collected", passes={"all_gather_pull": 1}), rows, set(metrics)

    monkeypatch.setattr(nsight, "_one_run", one_run)
    monkeypatch.setattr(nsight, "ncu_path", lambda: "/usr/bin/ncu")
    report = nsight.collect(SimpleNamespace(loader_spec="x"), None, world_size=2, device="cuda", shape="small",
                            metrics=list(nsight.AGENT_SETS), budget_s=100.0, ranks_per_gpu=2)
    assert [c[0] for c in calls] == ["agent", "agent-one-pass"]
    assert calls[0][2] == pytest.approx(100.0 * nsight.REPLAY_SHARE) and calls[1][2] == 100.0  # the rest: one pass
    assert calls[1][1] == nsight.ONE_PASS
    assert [r.status for r in report.runs] == ["timeout", "collected"] and report.status == "partial"
    assert nsight.DURATION not in report.missing and "dram__bytes_read.sum" not in report.missing
    assert "never finished" in report.missing[nsight.stall_metric("long_scoreboard")]
    assert any("one pass" in n for n in report.notes) and any("pkb_emu_barrier" in n for n in report.notes)
    without = nsight.collect(SimpleNamespace(loader_spec="x"), None, world_size=2, device="cuda", shape="small",
                             metrics=list(nsight.AGENT_SETS), budget_s=100.0, one_pass=False)
    assert [r.status for r in without.runs] == ["timeout"] and without.status == "not_collected"
    assert not any("pkb_emu" in n for n in without.notes)  # one rank per GPU: no emulation kernels to leave out


def test_collect_says_why_nothing_was_collected(monkeypatch):
    problem = get(SUITE, "all_reduce")
    cpu = nsight.collect(problem, None, world_size=2, device="cpu", shape="small")
    assert cpu.status == "not_collected" and not cpu.runs
    assert set(cpu.missing) == {m for _, ms in nsight.resolve_sets(None) for m in ms}
    assert all("--device cuda" in why for why in cpu.missing.values())
    monkeypatch.setattr("harness.measure.ncu.shutil.which", lambda name: None)
    none = nsight.collect(problem, None, world_size=2, device="cuda", shape="small")
    assert all(why == "ncu is not on PATH" for why in none.missing.values())
    lines = ncu_lines(none)
    assert lines[0].startswith("ncu on rank 0") and any("not collected" in line for line in lines)


# -- Nsight Compute: the driver end to end, with a stand-in ncu on CPU ranks --------------------------------




def test_ncu_driver_end_to_end_with_a_stand_in(tmp_path, monkeypatch):
    args = fake_ncu(tmp_path, RAW_CSV, monkeypatch)
    import harness.launch.pool

    class CpuPool(harness.launch.pool.RankPool):  # the ranks run on CPU; everything else is the GPU path
        def __init__(self, world_size, device, **kw):
            super().__init__(world_size, "cpu", **kw)

    monkeypatch.setattr(harness.launch.pool, "RankPool", CpuPool)
    wanted = ["gpu__time_duration.sum", "nvltx__bytes.sum", "dram__bytes_read.sum"]
    report = nsight.collect(get(SUITE, "all_reduce"), GOOD, world_size=2, device="cuda", shape="small", rank=1,
                            budget_s=240, metrics=wanted, calls=2)
    assert live_children() == []
    assert [r.status for r in report.runs] == ["collected"] and report.runs[0].passes == {"one_shot_all_reduce": 1}
    launched = [json.loads(line) for line in args.read_text().splitlines()]
    assert len(launched) == 1 and "harness.rank.worker" in launched[0]
    assert launched[0][launched[0].index("--rank") + 1] == "1"  # only the chosen rank ran under ncu
    assert report.per_call["nvltx__bytes.sum"] == pytest.approx(2 * 1_048_576 / 2)
    assert report.status == "partial" and "ncu did not report it" in report.missing["dram__bytes_read.sum"]
    assert report.kernels[0].name == "one_shot_all_reduce"


# -- pkb profile -------------------------------------------------------------------------------------------


@pytest.fixture
def pkb(monkeypatch):
    if cli_profile not in cli.COMMAND_MODULES:  # until agent/cli.py lists it
        monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, cli_profile))
    return cli.main


def test_cli_profile_json_and_text(pkb, capsys):
    assert pkb(["profile", "--problem", "all_reduce", "--solution", str(GOOD), "--iters", "2", "--warmup", "1",
                "--ncu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and report["iterations"] == 2
    assert report["ncu"]["status"] == "not_collected"  # CPU: said plainly, the timeline still returned
    assert all("--device cuda" in why for why in report["ncu"]["missing"].values())


@pytest.mark.parametrize(("argv", "needle"), [
    (["--ncu-metrics", "bogus"], "unknown ncu metric set"),
    (["--iters", "0"], "--iters must be at least 1"),
    (["--ncu", "--ncu-rank", "5"], "is not a rank of W=2"),
    (["--shape", "huge"], "has no shape 'huge'"),
])
def test_cli_profile_bad_input_is_one_line(pkb, capsys, argv, needle):
    assert pkb(["profile", "--problem", "all_reduce", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_cli_profile_text_is_bounded(pkb, capsys):
    assert pkb(["profile", "--problem", "sp_all_gather_gemm", "--iters", "1", "--warmup", "1", "--text"]) == 0
    text = capsys.readouterr().out
    assert count_tokens(text) <= 601 and text.startswith("profile reference on sp_all_gather_gemm")


@pytest.mark.gpu
def test_gpu_profile_of_the_one_shot_expert_with_ncu():
    expert = REPO_ROOT / "problems/collective/solutions/all_reduce__one_shot.py"
    report = profile(get(SUITE, "all_reduce"), expert, world_size=2, device="cuda", shape="default", ncu=True,
                     ncu_budget_s=60)
    for r in report.ranks:
        assert r.window_source == "spin markers"
        assert any(k.name == "one_shot_all_reduce" and k.kind == "comm" for k in r.kernels), r.kernels
    assert report.ncu is not None  # its time against the 60 s budget is reported by benchmarks/gpu_roofline.py
    assert report.ncu.per_call.get("nvltx__bytes.sum", 0) > 0, report.ncu.missing
    assert count_tokens(render_text(report)) <= 600


def test_worker_side_modules_import_without_pydantic():
    # The rank workers import harness.rank.tracing and harness.rank.timeline: torch and the standard library only.
    code = ("import sys; sys.modules['pydantic'] = None; import harness.rank.tracing, harness.rank.timeline; "
            "assert 'pydantic' not in {m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
