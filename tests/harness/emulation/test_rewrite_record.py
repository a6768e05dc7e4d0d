"""Results say whether a build was rewritten for multimem (harness.emulation.rewrite_record, issue 48): what the
build hook writes is read back by the trusted side, as hostile files, and recorded in
`integrity.emulation.multimem_rewritten`; `pkb report` and the replay table show it. On CPU: the hook's own
output, planted folders, and whole evaluations whose build (cached, or failed) held rewritten multimem."""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gpu_pkb_replay
from harness.common import failures
from harness.common.hostile_files import Folder
from harness.common.paths import REPO_ROOT
from harness.compiling import compile as build
from harness.compiling.compile import CompileOutcome
from harness.config import EvalConfig, TimingConfig
from harness.emulation import build_hook, multimem_rewrite, rewrite_record
from harness.evaluate import evaluate
from harness.problems.registry import get, load_suite

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "multimem"
CUDA = (FIXTURES / "all_reduce_v4.cu").read_text()
REWRITTEN = multimem_rewrite.rewrite(CUDA)


def test_a_rewritten_source_says_which_instructions_it_emulates() -> None:
    assert REWRITTEN.rewritten  # the fixture holds multimem the rewrite handles
    assert rewrite_record.instructions_in(REWRITTEN.source) == REWRITTEN.rewritten
    assert rewrite_record.instructions_in(CUDA) is None  # as written: not rewritten
    # The markers alone, without the rewrite's exact prelude in front, are not a rewritten source.
    body = REWRITTEN.source.split(multimem_rewrite.LINE_RESET + "\n", 1)[1]
    assert rewrite_record.instructions_in(body) is None
    assert rewrite_record.instructions_in(multimem_rewrite.prelude()[:-40] + body) is None


def test_what_the_build_hook_writes_is_read_back_as_rewritten(tmp_path: Path) -> None:
    from torch.utils import cpp_extension

    ext = tmp_path / "ext"
    for name in ("mm", "plain"):
        (ext / name).mkdir(parents=True)
    build_hook.install(strict=False)
    try:
        cpp_extension._maybe_write(str(ext / "mm" / "cuda.cu"), CUDA)
        cpp_extension._maybe_write(str(ext / "plain" / "cuda.cu"), "__global__ void k() {}\n")
    finally:
        build_hook.uninstall()
    with Folder.open(ext) as folder:
        found = rewrite_record.rewritten_builds(folder)
    assert found == {"mm": REWRITTEN.rewritten}
    assert rewrite_record.record(found) == {"files": 1, "instructions": dict(sorted(REWRITTEN.rewritten.items())),
                                           "builds": ["mm"], "seen_in": "builds"}
    assert rewrite_record.record({}) is None


def test_links_special_files_and_oversized_sources_are_not_believed(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "outside.cu"
    outside.write_text(REWRITTEN.source)
    ext = tmp_path / "ext"
    for name in ("linked", "fifo", "big", "real", "linked_dir_target"):
        (ext / name).mkdir(parents=True)
    (ext / "linked" / "cuda.cu").symlink_to(outside)
    os.mkfifo(ext / "fifo" / "cuda.cu")
    (ext / "big" / "cuda.cu").write_text(REWRITTEN.source + " " * 64)
    (ext / "real" / "cuda.cu").write_text(REWRITTEN.source)
    (ext / "linked_dir_target" / "cuda.cu").write_text(REWRITTEN.source)
    (ext / "link_to_dir").symlink_to(ext / "linked_dir_target")
    monkeypatch.setattr(rewrite_record, "SOURCE_CAP", len(REWRITTEN.source.encode()) + 8)
    with Folder.open(ext) as folder:
        assert sorted(rewrite_record.rewritten_builds(folder)) == ["linked_dir_target", "real"]
        assert sorted(rewrite_record.rewritten_builds(folder, skip=["real"])) == ["linked_dir_target"]


def test_the_source_says_what_the_precompile_rewrote_when_no_build_was_kept() -> None:
    source = f'KERNEL = r"""{CUDA}"""\nOTHER = "no multimem here"\nPROSE = "uses multimem.ld_reduce"\n'
    found = rewrite_record.of_source(source)
    assert found == {"files": 1, "instructions": dict(sorted(REWRITTEN.rewritten.items())),
                     "builds": ["string at line 1"], "seen_in": "source"}
    assert rewrite_record.of_source("x = 1\n") is None
    assert rewrite_record.of_source("x = 'multimem' +\n") is None  # not Python: nothing claimed


def test_a_stored_result_is_read_and_described() -> None:
    found = {"files": 2, "instructions": {"multimem.st.b32": 1, "multimem.ld_reduce.add.f32": 3}}
    assert rewrite_record.of_result({"integrity": {"emulation": {"multimem_rewritten": found}}}) == found
    results: list[dict[str, Any] | None] = [None, {}, {"integrity": []},
                                            {"integrity": {"emulation": {"multimem_rewritten": 3}}}]
    for result in results:
        assert rewrite_record.of_result(result) is None
    assert rewrite_record.describe(found) == \
        "2 file(s), 4 instruction(s) (multimem.ld_reduce.add.f32: 3, multimem.st.b32: 1)"


# -- whole evaluations (CPU: the CUDA build is planted in the cache, or its failure is given) ----------------
CANDIDATE = f'''"""An all_reduce with a multimem kernel it never builds on CPU (it names load_inline: a build)."""
import torch
import torch.distributed as dist

KERNEL = r"""{CUDA}"""


@torch.no_grad()
def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    return out
'''
CPU_CONFIG = EvalConfig(trials=2, skip_timing=True, timing=TimingConfig.for_device("cpu"))


@pytest.fixture
def no_environment_issue(monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidate names load_inline; on CPU the harness would call that a CUDA need and stop before building."""
    monkeypatch.setattr("harness.compiling.requirements.environment_issue", lambda *a, **k: None)


@pytest.mark.usefixtures("no_environment_issue")
def test_an_evaluation_whose_cached_build_was_rewritten_says_so(tmp_path: Path) -> None:
    problem = get(load_suite(), "all_reduce")
    path = tmp_path / "mm_candidate.py"
    path.write_text(CANDIDATE)
    entry = build.entry_for(path.read_bytes(), problem.loader_spec)
    (entry / "pkb_mm").mkdir(parents=True)
    (entry / "pkb_mm" / "cuda.cu").write_text(REWRITTEN.source)
    (entry / build.DONE).write_text(json.dumps([{"name": "pkb_mm", "kind": "load_inline", "ok": True}]))
    result = evaluate(problem, path, world_size=2, device="cpu", shape="small", config=CPU_CONFIG)
    assert result.verdict == failures.CORRECT, result.failure
    assert result.integrity["emulation"]["multimem_rewritten"] == {
        "files": 1, "instructions": dict(sorted(REWRITTEN.rewritten.items())), "builds": ["pkb_mm"],
        "seen_in": "builds"}
    # The same candidate with its build as written: nothing to say.
    (entry / "pkb_mm" / "cuda.cu").write_text(CUDA)
    plain = evaluate(problem, path, world_size=2, device="cpu", shape="small", config=CPU_CONFIG)
    assert "emulation" not in plain.integrity


@pytest.mark.usefixtures("no_environment_issue")
def test_a_failed_build_of_a_rewritten_source_says_so(tmp_path: Path) -> None:
    path = tmp_path / "mm_failed.py"
    path.write_text(CANDIDATE)
    failed = CompileOutcome(False, 1.0, failures.COMPILE_ERROR, "native build failed", native=True)
    result = evaluate(get(load_suite(), "all_reduce"), path, world_size=2, device="cpu", shape="small",
                      config=CPU_CONFIG, built=failed)
    assert result.verdict == failures.COMPILE_ERROR
    assert result.integrity["emulation"]["multimem_rewritten"]["seen_in"] == "source"
    assert result.integrity["emulation"]["multimem_rewritten"]["instructions"] == dict(
        sorted(REWRITTEN.rewritten.items()))


# -- where a reader sees it -----------------------------------------------------------------------------------
def test_the_replay_table_shows_which_results_were_rewritten() -> None:
    found = {"files": 1, "instructions": {"multimem.ld_reduce.relaxed.sys.global.add.v4.bf16x2": 2}}
    rows: list[dict[str, Any]] = [
        {"file": "1_ar.py", "problem": "1_allreduce", "status": "finished", "verdict": "correct", "multicast": True,
         "multimem_rewritten": found},
        {"file": "5_s.py", "problem": "5_scatter", "status": "finished", "verdict": "correct", "multicast": False}]
    args = argparse.Namespace(set=Path("solutions_x"), budget_s=540.0, concurrency=14, evaluations_per_gpu=4,
                              device="cuda")
    table = gpu_pkb_replay.markdown(rows, 900.0, True, args)
    assert "| results whose build was rewritten for multimem | 1 |" in table
    assert ("| 1_ar.py | yes, rewritten: 1 file(s), 2 instruction(s) "
            "(multimem.ld_reduce.relaxed.sys.global.add.v4.bf16x2: 2) | 1_allreduce | correct |") in table
    assert "| 5_s.py |  | 5_scatter | correct |" in table


def test_the_report_notes_the_problems_whose_builds_were_rewritten() -> None:
    from agent.report import build as report_build
    from agent.report.run_reader import Run, Sample, SampleRecord

    def sample(problem: str, result: dict[str, Any] | None) -> Sample:
        record = SampleRecord(problem=problem, condition="replay", sample=0, status="finished")
        return Sample(record=record, directory=problem, result=result)

    rewritten = {"integrity": {"emulation": {"multimem_rewritten": {"files": 1, "instructions": Counter()}}}}
    run = Run(path="runs/a", schema_id="pkb-run/1", run_id="a", config={"ranks_per_gpu": 2},
              samples=[sample("1_allreduce", rewritten), sample("5_scatter", {"integrity": {}})])
    notes = report_build.notes([run])
    assert any("1 problem(s) ran builds rewritten for multimem" in n and "1_allreduce" in n and "5_scatter" not in n
               for n in notes)
    run.samples = run.samples[1:]
    assert not any("rewritten for multimem" in n for n in report_build.notes([run]))
