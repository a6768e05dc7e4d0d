"""The soak benchmark's own logic (benchmarks/soak.py): its schedule of candidates and its GPU-memory
reading. The soak itself is a benchmark (docs/performance.md), not a test; these are the parts whose
mistakes would make it report a pass it did not earn."""

from __future__ import annotations

import importlib.util
import stat
import sys
from collections import Counter
from pathlib import Path

import pytest

from harness.common import failures
from harness.common.paths import REPO_ROOT

SOAK = REPO_ROOT / "benchmarks" / "soak.py"


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak_benchmark", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.mark.parametrize(("n", "deadlocks"), [(50, 10), (20, 3), (500, None), (23, 23)])
def test_schedule_has_exactly_the_deadlocks_asked_for(soak, n, deadlocks):
    plan = soak.schedule(n, deadlocks)
    assert len(plan) == n
    counts = Counter(plan)
    assert counts["hang"] == (n // 10 if deadlocks is None else deadlocks)
    assert set(counts) <= set(soak.kinds("cpu")) == set(soak.kinds("cuda"))
    if deadlocks is not None and deadlocks < n:  # hangs spread out, never two in a row
        hangs = [i for i, k in enumerate(plan) if k == "hang"]
        assert all(b - a >= n // deadlocks for a, b in zip(hangs, hangs[1:]))


def test_every_kind_names_an_existing_candidate_and_a_model_verdict(soak):
    for device in ("cpu", "cuda"):
        for kind in soak.kinds(device).values():
            assert kind.path.is_file(), kind.path
            assert kind.verdict in failures.VERDICTS and kind.verdict != failures.INFRA_ERROR


def _fake_nvidia_smi(folder: Path, body: str) -> None:
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize(("body", "expected"), [
    ('echo "4"; echo "  4096"\n', [4, 4096]),
    ("exit 9\n", None),                          # the tool fails: no reading, not a zero
    ('echo "[N/A]"\n', None),                    # unparsable: no reading
])
def test_gpu_memory_reading(soak, tmp_path, monkeypatch, body, expected):
    _fake_nvidia_smi(tmp_path, body)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert soak.gpu_memory_mb() == expected


def test_no_nvidia_smi_means_no_reading(soak, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder
    assert soak.gpu_memory_mb() is None
