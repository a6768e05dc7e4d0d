"""The emulated mode (`--ranks-per-gpu N`) outside the rank processes: emulated samples never count as fast,
the scheduler leases shared GPUs, the CLI checks the option, the report says a run is emulated."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel

import harness.config
from agent.cli import emulation as cli_emulation
from agent.cli.common import CliError
from agent.report import metrics
from agent.scheduler import DeviceScheduler, SchedulerError
from harness.common import flags
from harness.common.paths import REPO_ROOT
from harness.emulation import layout

ROOT = REPO_ROOT


def test_emulated_samples_are_correct_but_never_fast():
    real = {"correct": True, "speedup": 3.0, "fast_eligible": True, "flags": []}
    assert metrics.counted_speedup(real) == 3.0 and metrics.is_fast(real, 1.0)
    for emulated in ({**real, "emulated": True}, {"correct": True, "speedup": 3.0, "flags": [flags.EMULATED]}):
        assert flags.is_emulated(emulated)
        assert metrics.counted_speedup(emulated) is None and not metrics.is_fast(emulated, 1.0)
    assert flags.EMULATED in flags.SPEEDUP_DISQUALIFIERS


def test_scheduler_leases_shared_gpus_and_counts_each_gpu_once():
    scheduler = DeviceScheduler("cuda", 4, gpus=[0, 1, 2, 3], ranks_per_gpu=2)
    assert scheduler.groups == [[0, 0, 1, 1], [2, 2, 3, 3]] and scheduler.capacity == 2
    with scheduler.lease() as lease:
        assert lease.gpus == [0, 0, 1, 1] and lease.ranks == 4
    # Two GPUs held, not four: what the device-seconds accounting charges (harness.emulation.layout.device_seconds).
    assert len(set(lease.gpus)) == layout.gpus_needed(4, 2) == 2
    assert DeviceScheduler("cuda", 4, gpus=[5], ranks_per_gpu=4).groups == [[5, 5, 5, 5]]
    with pytest.raises(SchedulerError, match="at 2 ranks per GPU needs 2 GPUs; 1 visible"):
        DeviceScheduler("cuda", 4, gpus=[0], ranks_per_gpu=2)


def test_cli_option_checks(monkeypatch):
    cli_emulation.check("cpu", 2, 1)  # the ordinary mode asks nothing of the harness
    with pytest.raises(CliError, match="at least 1"):
        cli_emulation.check("cuda", 2, 0)
    with pytest.raises(CliError, match="needs --device cuda"):
        cli_emulation.check("cpu", 2, 2)

    class Without(BaseModel):
        trials: int = 5

    class With(BaseModel):
        ranks_per_gpu: int = 1

    monkeypatch.setattr(harness.config, "EvalConfig", Without)
    with pytest.raises(CliError, match="no emulated mode"):
        cli_emulation.check("cuda", 2, 2)
    monkeypatch.setattr(harness.config, "EvalConfig", With)
    cli_emulation.check("cuda", 4, 4, visible_gpus=1)
    with pytest.raises(CliError, match="needs 2 GPUs; 1 visible"):
        cli_emulation.check("cuda", 4, 2, visible_gpus=1)
    assert layout.eval_config_fields(1) == {} and layout.eval_config_fields(4) == {"ranks_per_gpu": 4}


def test_pkb_eval_refuses_sharing_gpus_on_cpu(capsys):
    from agent.cli import main as pkb

    good = str(ROOT / "tests" / "candidates" / "correct_all_gather_sum.py")
    assert pkb(["eval", "--problem", "all_reduce", "--solution", good, "--ranks-per-gpu", "2"]) == 2
    assert "--ranks-per-gpu needs --device cuda" in capsys.readouterr().err


def test_report_says_a_run_is_emulated_and_counts_nothing_fast(tmp_path):
    from agent.report.build import build
    from agent.report.markdown import to_markdown
    from agent.report.rows import run_rows
    from agent.report.run_reader import read_run
    from tests.report_support import make_run

    rep = build([read_run(make_run(tmp_path, device="cuda", world_size=4, ranks_per_gpu=4))])
    assert any("is emulated (4 ranks share each GPU" in note for note in rep.data["notes"])
    for arm in rep.data["arms"]:
        # issue 44: not measured is not zero (was: mean 0.0)
        assert math.isnan(arm["fast_1_at_k"]["mean"]) and arm["speedups"] == []
        assert arm["fast_1_at_k"]["not_measured"] == "emulated: ranks shared a GPU"
        assert arm["speedups_not_counted"]["flags"].get(flags.EMULATED, 0) == arm["speedups_not_counted"]["samples"] > 0
        assert arm["pass_at_k"]["mean"] > 0  # correctness still counts
    head, rows = run_rows(rep)
    assert rows[0][head.index("device")] == "cuda (emulated, 4 ranks/GPU)"
    assert "is emulated" in to_markdown(rep)
