"""`pkb profile --ranks-per-gpu`: the placement option `pkb eval` has, its refusals (one line, exit 2), the option
reaching every rank pool the profile starts (the timeline's and ncu's), and what an emulated profile cannot tell,
said in its output. The GPU is faked at its edges: torch's device count, the rank pools (CPU ranks), ncu (a
stand-in that runs the rank it wraps)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import harness.launch.pool
from agent.cli import main as pkb
from harness.measure import ncu as nsight
from harness.measure import profiling
from harness.measure.roofline import resolve_ceilings
from tests.conftest import CANDIDATES, live_children
from tests.harness.measure.ncu_support import fake_ncu
from tools.render import count_tokens

GOOD = str(CANDIDATES / "correct_all_gather_sum.py")
# ncu's raw page for the `core` set without NVLink's counters (what is asked for when both ranks share the GPU)
CORE_CSV = textwrap.dedent('''\
    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum","launch__registers_per_thread","launch__grid_size","launch__block_size"
    "","","","","","","","","","","","nsecond","byte","byte","register/thread","",""
    "0","4242","python3","h","one_shot_all_reduce","1","7","(512, 1, 1)","(132, 1, 1)","0","9.0","100,000","2,097,152","1,048,576","40","132","512"
    "1","4242","python3","h","one_shot_all_reduce","1","7","(512, 1, 1)","(132, 1, 1)","0","9.0","100,000","2,097,152","1,048,576","40","132","512"
    ''')  # noqa: E501


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that shows one CUDA device (to the CLI's checks; nothing here runs on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.fixture
def no_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a refused command started the profiler")

    monkeypatch.setattr(profiling, "profile", refused)


@pytest.mark.parametrize(("argv", "words"), [
    (["--ranks-per-gpu", "2"], ["--ranks-per-gpu needs --device cuda"]),
    (["--ranks-per-gpu", "0"], ["--ranks-per-gpu must be at least 1, got 0"]),
    (["--ranks-per-gpu", "-3", "--device", "cuda"], ["--ranks-per-gpu must be at least 1, got -3"]),
])
@pytest.mark.usefixtures("no_profile")
def test_misused_placement_is_refused_in_one_line(argv: list[str], words: list[str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert pkb(["profile", "--problem", "all_reduce", *argv]) == 2
    err = one_line(capsys)
    assert all(w in err for w in words), err


@pytest.mark.parametrize(("argv", "words"), [
    # one GPU, two ranks of their own: refused, with the way out named
    ([], ["--world-size 2 needs 2 GPUs; 1 visible", "--ranks-per-gpu"]),
    # four ranks at two a GPU need two GPUs
    (["--world-size", "4", "--ranks-per-gpu", "2"], ["--world-size 4 at --ranks-per-gpu 2 needs 2 GPUs; 1 visible"]),
])
@pytest.mark.usefixtures("one_gpu", "no_profile")
def test_too_few_gpus_is_refused_in_one_line(argv: list[str], words: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert pkb(["profile", "--problem", "all_reduce", "--device", "cuda", *argv]) == 2
    err = one_line(capsys)
    assert all(w in err for w in words), err


@pytest.mark.usefixtures("one_gpu")
def test_roofline_keeps_its_message_without_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert pkb(["roofline", "--problem", "all_reduce", "--device", "cuda"]) == 2
    err = one_line(capsys)
    assert "needs 2 GPUs; 1 visible" in err and "--ranks-per-gpu" not in err  # roofline has no such option


def _report(**kwargs: Any) -> profiling.ProfileReport:
    rank = profiling.RankTimeline(rank=0, iterations=2, call_us=2500.0, call_median_us=2500.0, comm_us=2400.0,
                                  compute_us=50.0, overlap_us=0.0, busy_us=2450.0, idle_us=50.0, gaps_per_iter=1.0,
                                  largest_gap_us=40.0, lanes=1, kernel_count=1,
                                  kernels=[profiling.KernelStat("one_shot_all_reduce", "comm", 2400.0, 1.0)],
                                  window_source="spin markers")
    return profiling.ProfileReport(
        problem="all_reduce", target="one_shot.py", shape="default", world_size=kwargs["world_size"],
        device=kwargs["device"], warmup=1, iterations=2, ranks=[rank], slowest_rank=0, skew=0.0,
        ranks_per_gpu=kwargs["ranks_per_gpu"],
        emulation=profiling.emulation_caveats(kwargs["world_size"], kwargs["ranks_per_gpu"], device=kwargs["device"],
                                              ncu_rank=kwargs["ncu_rank"] if kwargs["ncu"] else None))


@pytest.mark.usefixtures("one_gpu")
def test_the_text_a_model_reads_says_the_caveats_first(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[dict[str, Any]] = []

    def fake(problem: Any, candidate: Any, **kwargs: Any) -> profiling.ProfileReport:
        seen.append(kwargs)
        return _report(**kwargs)

    monkeypatch.setattr(profiling, "profile", fake)
    argv = ["profile", "--problem", "all_reduce", "--solution", GOOD, "--device", "cuda", "--ranks-per-gpu", "2"]
    assert pkb([*argv, "--text"]) == 0
    text = capsys.readouterr().out
    assert seen[0]["ranks_per_gpu"] == 2 and seen[0]["ncu"] is True and seen[0]["ncu_rank"] == 0
    lines = text.splitlines()
    assert lines[0].startswith("profile one_shot.py on all_reduce")
    assert lines[1].startswith("emulated: 2 ranks share each GPU") and "can and cannot tell" in lines[1]
    for said in (profiling.EMULATED_TIMES, profiling.EMULATED_TRAFFIC_ONE_GPU, profiling.EMULATED_COLLECTIVES,
                 profiling.EMULATED_NCU.format(rank=0)):
        assert f"- {said}" in lines
    assert "r0 2500.0us" in text and count_tokens(text) <= 601
    assert pkb([*argv, "--json", "--ncu-rank", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert seen[1]["ncu_rank"] == 1 and report["ranks_per_gpu"] == 2
    assert f"- {profiling.EMULATED_NCU.format(rank=1)}" in report["emulation"]


def test_one_rank_per_gpu_says_no_caveat(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    seen: list[dict[str, Any]] = []

    def fake(problem: Any, candidate: Any, **kwargs: Any) -> profiling.ProfileReport:
        seen.append(kwargs)
        return _report(**kwargs)

    monkeypatch.setattr(profiling, "profile", fake)
    assert pkb(["profile", "--problem", "all_reduce", "--device", "cuda", "--text"]) == 0
    text = capsys.readouterr().out
    assert seen[0]["ranks_per_gpu"] == 1 and "emulated" not in text


@pytest.mark.usefixtures("one_gpu")
def test_an_emulated_profile_reaches_every_pool_and_says_what_it_cannot_tell(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`--world-size 2 --ranks-per-gpu 2 --device cuda` end to end on CPU ranks: the timeline's pool and the ncu
    pool both get the placement, only the chosen rank runs under ncu, NVLink's counters are not asked for, and the
    output says why, with the caveats before the numbers."""
    args = fake_ncu(tmp_path, CORE_CSV, monkeypatch)
    pools: list[tuple[str, int, bool]] = []

    class CpuPool(harness.launch.pool.RankPool):  # what each pool was asked for, then CPU ranks
        def __init__(self, world_size: int, device: str, **kw: Any) -> None:
            pools.append((device, kw.get("ranks_per_gpu", 1), bool(kw.get("rank_prefix"))))
            kw["ranks_per_gpu"] = 1  # the emulation itself needs the GPU
            super().__init__(world_size, "cpu", **kw)

    monkeypatch.setattr(profiling, "RankPool", CpuPool)
    monkeypatch.setattr(harness.launch.pool, "RankPool", CpuPool)
    monkeypatch.setattr(profiling, "resolve_ceilings", lambda *a, **k: resolve_ceilings({}))  # no GPU to discover
    assert pkb(["profile", "--problem", "all_reduce", "--solution", GOOD, "--device", "cuda", "--shape", "small",
                "--ranks-per-gpu", "2", "--ncu-rank", "1", "--ncu-metrics", "core", "--ncu-budget", "240",
                "--iters", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert live_children() == []
    assert pools == [("cuda", 2, False), ("cuda", 2, True)]  # the timeline's pool, then ncu's around one rank
    launched = [json.loads(line) for line in args.read_text().splitlines()]
    assert len(launched) == 1 and launched[0][launched[0].index("--rank") + 1] == "1"
    asked = launched[0][launched[0].index("--metrics") + 1].split(",")
    assert "dram__bytes_read.sum" in asked and not set(asked) & set(nsight.NVLINK)
    assert "2 ranks per GPU, emulated, ncu on rank 1" in out
    flat = " ".join(out.split())  # rich wraps long lines
    assert flat.index("emulated: 2 ranks share each GPU") < flat.index("slowest rank")
    for said in (profiling.EMULATED_TIMES, profiling.EMULATED_TRAFFIC_ONE_GPU, profiling.EMULATED_NCU.format(rank=1)):
        assert " ".join(said.split()) in flat
    assert "ncu kernel one_shot_all_reduce x2" in flat
    assert "ncu not collected: NVLink" in flat and "every rank shares one GPU (emulation)" in flat
