"""Nsight in the profile tool, on CPU: Nsight Compute's raw export parsed and summarised per kernel against the
ceilings, the one line said when counters cannot be read, Nsight Systems' kernel summary, and the tool asking
for all of it on CUDA. The fixtures are described in tests/fixtures/ncu/README.md (the constructed one says
so; recorded ones from benchmarks/gpu_profile_tool.py join automatically).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.measure import ncu, nsys
from harness.measure.profiling import KernelStat, ProfileReport, RankTimeline
from tests.conftest import TESTS
from tools import profile as profile_tool
from tools.base import ToolContext, ToolSettings
from tools.render import count_tokens
from tools.summaries import profile_text

FIXTURES = TESTS / "fixtures"
CONSTRUCTED = FIXTURES / "ncu" / "constructed_agent_raw.csv"
MiB = 1 << 20
HBM = ncu.Ceiling(4.19e12, "measured")
LINK = ncu.Ceiling(394.6e9, "measured")


def _report_from(csv_text: str, calls: int = 2) -> ncu.NcuReport:
    metrics = ncu.METRIC_SETS["agent"]
    rows, present = ncu.parse_raw_csv(csv_text, metrics)
    report = ncu.NcuReport(rank=0, replay="kernel", calls=calls, status="collected")
    report.kernels, report.per_call = ncu.aggregate(rows, list(metrics), calls)
    assert present == set(metrics)
    return report


def _timeline(call_us: float, rank: int = 0) -> RankTimeline:
    return RankTimeline(rank=rank, iterations=5, call_us=call_us, call_median_us=call_us, comm_us=200.0, compute_us=9.0,
                        overlap_us=0.0, busy_us=209.0, idle_us=call_us - 209.0, gaps_per_iter=1.0,
                        largest_gap_us=50.0, lanes=1, kernel_count=2,
                        kernels=[KernelStat("one_shot_all_reduce_kernel", "comm", 200.0, 1.0)],
                        window_source="spin markers")


def test_raw_export_is_summarised_per_kernel_against_the_ceilings() -> None:
    report = _report_from(CONSTRUCTED.read_text())
    assert [k.name.split("<")[0] for k in report.kernels] == ["one_shot_all_reduce_kernel",
                                                              "void at::native::vectorized_elementwise_kernel"]
    top, fill = ncu.summarize_kernels(report, hbm=HBM, link=LINK, call_us=300.0)
    # by hand: 420 us over 2 calls; 128 MiB of DRAM and 70 / 66 MiB of NVLink per call
    assert top.us_per_call == pytest.approx(210.0) and top.launches_per_call == 1
    assert top.share_of_call == pytest.approx(0.70) and "timeline" in top.share_basis
    assert top.dram_bytes_per_s == pytest.approx(128 * MiB / 210e-6)
    assert top.dram_fraction == pytest.approx(128 * MiB / 210e-6 / 4.19e12)
    assert top.nvlink_tx_bytes_per_s == pytest.approx(70 * MiB / 210e-6)
    assert top.nvlink_rx_bytes_per_s == pytest.approx(66 * MiB / 210e-6)
    assert top.nvlink_fraction == pytest.approx(70 * MiB / 210e-6 / 394.6e9)
    assert top.sm_pct == pytest.approx((21.5 * 200 + 20.5 * 220) / 420)  # weighted by each launch's time
    assert [r for r, _ in top.stalls] == ["long_scoreboard", "membar", "barrier"]  # "selected" is no stall
    assert top.stalls[0][1] == pytest.approx((6.25 * 200 + 5.75 * 220) / 420)
    assert fill.us_per_call == pytest.approx(6.0) and fill.nvlink_tx_bytes_per_s == 0.0
    assert fill.dram_bytes_per_s == pytest.approx(8 * MiB / 6e-6)
    # no timeline: the share is of all profiled kernels' time
    alone = ncu.summarize_kernels(report, hbm=HBM, link=LINK)[0]
    assert alone.share_of_call == pytest.approx(420 / 432) and "kernels" in alone.share_basis


def _profile(report: ncu.NcuReport | None, summary: list[Any], nsys_report: nsys.NsysReport | None = None
             ) -> ProfileReport:
    return ProfileReport(problem="all_reduce", target="003.py", shape="default", world_size=2, device="cuda",
                         warmup=3, iterations=5, ranks=[_timeline(300.0), _timeline(280.0, 1)], slowest_rank=0,
                         skew=0.07, ncu=report, kernel_summary=summary,
                         ceilings={"hbm_bytes_per_s": HBM.bytes_per_s, "hbm_source": HBM.source,
                                   "link_bytes_per_s": LINK.bytes_per_s, "link_source": LINK.source},
                         nsys=nsys_report)


def test_the_models_text_names_time_share_throughput_and_stalls() -> None:
    report = _report_from(CONSTRUCTED.read_text())
    summary = ncu.summarize_kernels(report, hbm=HBM, link=LINK, call_us=300.0)
    text = profile_text(_profile(report, summary), 600)
    assert count_tokens(text) <= 600
    assert "ceilings: HBM 4.19 TB/s (measured), NVLink 394.6 GB/s per direction (measured)" in text
    line = next(line for line in text.splitlines() if line.startswith("  one_shot_all_reduce_kernel"))
    assert "210.0us/call (70% of the call)" in line and "DRAM 639.1 GB/s = 15% of HBM" in line
    assert "NVLink out 349.5 GB/s in 329.6 GB/s = 89% of the link" in line and "SM 21%" in line
    assert "stalls long_scoreboard 6 (waiting on global/local memory" in line and "membar 2" in line
    assert "r0 300.0us" in text  # the timeline is still there


def test_no_counters_is_one_line_and_the_timeline_stays() -> None:
    denied = ncu.NcuReport(rank=0, replay="kernel", calls=2, status="not_collected",
                           missing={m: "not collected: 'agent' run failed: no permission to read GPU performance "
                                       "counters (ERR_NVGPUCTRPERM)" for m in ncu.METRIC_SETS["agent"]})
    text = profile_text(_profile(denied, []), 600)
    said = [line for line in text.splitlines() if line.startswith("Nsight Compute")]
    assert len(said) == 1 and "ERR_NVGPUCTRPERM" in said[0] and "timeline above" in said[0]
    assert "r0 300.0us" in text and "r1 280.0us" in text


def test_nsys_kernel_summary_and_its_absence() -> None:
    kernels = nsys.parse_kernel_summary((FIXTURES / "nsys" / "constructed_cuda_gpu_kern_sum.csv").read_text())
    assert [(k.name[:26], k.total_ns, k.instances) for k in kernels] == [
        ("one_shot_all_reduce_kernel", 630000.0, 3), ("void at::native::vectorize", 39600.0, 6)]
    line = profile_text(_profile(None, [], nsys.NsysReport("collected", 0, 3, "nsys", kernels)), 600)
    assert "Nsight Systems, rank 0, per call: one_shot_all_reduce_kernel 210.0us x1" in line
    missing = nsys.NsysReport("not_installed", 0, 3, message="Nsight Systems (nsys) is not installed here")
    assert "Nsight Systems: Nsight Systems (nsys) is not installed here" in profile_text(_profile(None, [], missing))


def test_nsys_is_looked_for_outside_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    fake = tmp_path / "opt" / "nsight-systems" / "2025.1" / "bin" / "nsys"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setattr(nsys, "SEARCH", (str(tmp_path / "opt" / "nsight-systems" / "*" / "bin" / "nsys"),))
    assert nsys.find_nsys() == str(fake)
    monkeypatch.setattr(nsys, "SEARCH", ())
    report = nsys.collect(None, None, world_size=2, shape="small")
    assert report.status == "not_installed" and "not installed" in report.message


def test_the_tool_asks_for_nsight_on_cuda_and_not_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.config import EvalConfig
    from harness.measure import profiling
    from harness.problems.registry import get, load_suite

    seen: list[dict[str, Any]] = []
    report = _report_from(CONSTRUCTED.read_text())
    summary = ncu.summarize_kernels(report, hbm=HBM, link=LINK, call_us=300.0)

    def fake(problem: Any, candidate: Path, **kwargs: Any) -> ProfileReport:
        seen.append(kwargs)
        return _profile(report if kwargs.get("ncu") else None, summary if kwargs.get("ncu") else [])

    monkeypatch.setattr(profiling, "profile", fake)
    candidate = tmp_path / "003.py"
    candidate.write_text("def solution(x):\n    return x\n")
    problem = get(load_suite(), "all_reduce")
    config = EvalConfig().model_copy(update={"ranks_per_gpu": 2})
    for device in ("cuda", "cpu"):
        ctx = ToolContext(problem=problem, settings=ToolSettings(2, device, "default"), config=config,
                          workdir=tmp_path, gpus=[0, 0], artifacts_dir=tmp_path / "kept")
        outcome = profile_tool.run({}, ctx, candidate)
        if device == "cuda":
            assert "one_shot_all_reduce_kernel: 210.0us/call" in outcome.text
        else:
            assert "Nsight" not in outcome.text
    on_gpu, on_cpu = seen
    assert on_gpu["ncu"] is True and on_gpu["ncu_metrics"] == ncu.AGENT_SETS and on_gpu["nsys"] is True
    assert on_gpu["ranks_per_gpu"] == 2 and on_gpu["gpus"] == [0, 0] and on_gpu["keep_dir"] == tmp_path / "kept"
    assert "ncu" not in on_cpu and "nsys" not in on_cpu


RECORDED = sorted((FIXTURES / "ncu").glob("recorded_*.csv"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_exports_parse(path: Path) -> None:
    text = path.read_text()
    metrics = ncu.METRIC_SETS["agent"]
    rows, present = ncu.parse_raw_csv(text, metrics)
    assert rows and "gpu__time_duration.sum" in present
    report = ncu.NcuReport(rank=0, replay="kernel", calls=2, status="collected")
    report.kernels, report.per_call = ncu.aggregate(rows, list(metrics), 2)
    top = ncu.summarize_kernels(report, hbm=HBM, link=LINK)[0]
    assert top.us_per_call and top.us_per_call > 0 and top.dram_bytes_per_s is not None


def test_the_recorded_one_h200_export_summarises_as_the_tool_said_on_the_gpu() -> None:
    """The raw page the profile tool's Nsight run wrote on one H200 (2026-12-01, the one-shot all-reduce expert,
    W=2 sharing the GPU, `default` shape): its NVLink counters were not readable there (no NVLink peer), the
    rest was; the numbers are the ones the tool showed the model in that run."""
    path = FIXTURES / "ncu" / "recorded_all_reduce__one_shot.csv"
    metrics = ncu.METRIC_SETS["agent"]
    rows, present = ncu.parse_raw_csv(path.read_text(), metrics)
    assert set(metrics) - present == {"nvltx__bytes.sum", "nvlrx__bytes.sum"}
    report = ncu.NcuReport(rank=0, replay="kernel", calls=2, status="partial")
    report.kernels, report.per_call = ncu.aggregate(rows, list(metrics), 2)
    (top,) = ncu.summarize_kernels(report, hbm=ncu.Ceiling(4.8e12, "datasheet"), link=LINK)
    assert top.name == "one_shot_all_reduce" and top.launches_per_call == 1
    assert top.us_per_call == pytest.approx(136.784)
    assert top.dram_fraction == pytest.approx(0.627, abs=0.001)  # 3.01 TB/s of the datasheet's 4.8
    assert top.sm_pct == pytest.approx(29.35, abs=0.01)
    assert top.nvlink_tx_bytes_per_s is None and top.nvlink_fraction is None
    assert [reason for reason, _ in top.stalls][:2] == ["long_scoreboard", "wait"]


def test_a_run_that_never_finished_is_said_as_such_not_blamed_on_unreadable_counters() -> None:
    # As on the H200 on 2026-12-02 (two-shot copy-engine expert): NVLink's counters are unreadable on one GPU,
    # and the replayed passes of a kernel that waits on its peer never finished; the line named the first.
    timeout = ("not collected: 'agent' run timeout: ranks [0, 1] did not finish within the budget: a profiled "
               "kernel may wait on a peer that will not signal again (a replayed pass)")
    unreadable = "not readable here: ncu cannot access this counter on this GPU and driver"
    missing = {m: (unreadable if m.startswith("nvl") else timeout) for m in ncu.METRIC_SETS["agent"]}
    missing = {"nvltx__bytes.sum": unreadable, **missing}  # the unreadable ones first, as ncu.collect files them
    report = ncu.NcuReport(rank=0, replay="kernel", calls=2, status="not_collected", missing=missing)
    said = [line for line in profile_text(_profile(report, []), 600).splitlines() if line.startswith("Nsight Compute")]
    assert len(said) == 1 and "did not finish" in said[0] and "not readable" not in said[0]


def test_a_one_pass_answer_names_each_reason_and_the_note() -> None:
    """After a replay that never finished, the one-pass counters stand (time, DRAM); the lines say what is
    missing for which reason (NVLink: not on this GPU; SM and stalls: the replay) and why one pass was used."""
    metrics = list(ncu.METRIC_SETS["agent"])
    rows = [{"kernel": "all_gather_pull", ncu.DURATION: 2.0e6, "dram__bytes_read.sum": 4.0e9,
             "dram__bytes_write.sum": 2.0e9}]
    unreadable = "not readable here: ncu cannot access this counter on this GPU and driver"
    replay = "not collected: ncu's replayed passes never finished (a kernel waits on a peer); counted in one pass"
    report = ncu.NcuReport(rank=0, replay="kernel", calls=2, status="partial",
                           missing={m: unreadable if m.startswith("nvl") else replay
                                    for m in metrics if m not in ncu.ONE_PASS},
                           notes=["counted in one pass (no replay): a kernel waits on its peer"])
    report.kernels, report.per_call = ncu.aggregate(rows, metrics, 2)
    summary = ncu.summarize_kernels(report, hbm=HBM, link=LINK)
    text = profile_text(_profile(report, summary), 600)
    line = next(line for line in text.splitlines() if line.startswith("  all_gather_pull"))
    assert "1000.0us/call" in line and "DRAM 3.00 TB/s" in line and "stalls" not in line
    not_read = [line for line in text.splitlines() if line.startswith("  not read:")]
    assert len(not_read) == 2 and "NVLink sent" in not_read[0] and "not readable here" in not_read[0]
    assert "SM throughput %, memory throughput %, stall reasons: not collected: ncu's replayed" in not_read[1]
    assert "  note: counted in one pass (no replay): a kernel waits on its peer" in text


def test_the_recorded_two_shot_export_has_only_the_candidates_kernel() -> None:
    """One H200, 2026-12-02 (copy-engine two-shot all-reduce, W=2 sharing the GPU): with the emulation's barrier
    kernels left out by ncu's filter, the replay finished and its own reduction kernel was counted whole."""
    rows, present = ncu.parse_raw_csv((FIXTURES / "ncu" / "recorded_all_reduce__two_shot_copy_engine.csv").read_text(),
                                      ncu.METRIC_SETS["agent"])
    assert {r["kernel"] for r in rows} == {"sum_slots"} and not any(r["kernel"] in ncu.NOT_PROFILED for r in rows)
    report = ncu.NcuReport(rank=0, replay="kernel", calls=2, status="partial")
    report.kernels, report.per_call = ncu.aggregate(rows, list(ncu.METRIC_SETS["agent"]), 2)
    (top,) = ncu.summarize_kernels(report, hbm=ncu.Ceiling(4.8e12, "datasheet"), link=LINK)
    assert top.us_per_call == pytest.approx(26.368) and top.dram_fraction == pytest.approx(0.698, abs=0.001)
    assert top.sm_pct == pytest.approx(42.69, abs=0.01) and top.stalls[0][0] == "long_scoreboard"


def test_the_recorded_one_pass_export_has_time_and_dram_and_nothing_replayed() -> None:
    """One H200, 2026-12-02 (pull all-gather): the one-pass run after the replay hung. Time and DRAM are there,
    SM throughput and stalls (which need passes) are not; the time includes the kernel's wait for its peer."""
    rows, present = ncu.parse_raw_csv((FIXTURES / "ncu" / "recorded_all_gather__pull__one_pass.csv").read_text(),
                                      ncu.METRIC_SETS["agent"])
    assert present == set(ncu.ONE_PASS) & set(ncu.METRIC_SETS["agent"])
    report = ncu.NcuReport(rank=0, replay="kernel", calls=2, status="partial")
    report.kernels, report.per_call = ncu.aggregate(rows, list(ncu.METRIC_SETS["agent"]), 2)
    (top,) = ncu.summarize_kernels(report, hbm=ncu.Ceiling(4.8e12, "datasheet"), link=LINK)
    assert top.name == "all_gather_pull" and top.us_per_call == pytest.approx(4094761.616)
    assert top.dram_bytes_per_s == pytest.approx(52.03e6, rel=1e-3) and top.sm_pct is None and top.stalls == []
