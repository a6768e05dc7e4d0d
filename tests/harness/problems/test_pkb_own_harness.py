"""PKB's own harness as a second scorer (harness.problems.parallelkernelbench.own_harness), the rules that explain
where it and this harness differ (harness.problems.parallelkernelbench.rules), the multicast filter
(harness.problems.parallelkernelbench.multicast), and the contained runner (harness.launch.contained_run). CPU only:
PKB's
real scripts need CUDA, so the runner is proved here against a stand-in run_local.py and stand-in process
trees, and the parser against outputs shaped like PKB's."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.common.paths import REPO_ROOT
from harness.launch.contained_run import run_contained, token_pids
from harness.problems.parallelkernelbench import multicast as pkb_multicast
from harness.problems.parallelkernelbench import rules as pkb_rules
from harness.problems.parallelkernelbench.own_harness import (
    PkbVerdict,
    TrialReport,
    exception_line,
    parse_pkb_output,
    problem_stem,
    score_with_pkb,
)
from harness.records.results import CandidateInfo, EvalResult, Failure
from tests.conftest import TESTS, live_children

FIX = TESTS / "fixtures" / "pkb_own_harness"
OUTPUTS = FIX / "outputs"
FAKE_CHECKOUT = FIX / "checkout"
FIRST = Path("/work/pkb/first")
HEAD = Path("/work/pkb/head")


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_dead(pids: list[int], seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def parse(name: str, returncode: int = 0, **kw: object) -> PkbVerdict:
    return parse_pkb_output((OUTPUTS / name).read_text(), "", returncode, **kw)  # type: ignore[arg-type]


# -- the parser, on outputs shaped like PKB's -------------------------------------------------------
def test_parser_reads_matches_and_per_trial_speedups(tmp_path: Path) -> None:
    perf = tmp_path / "problem_2_allgather"
    for job, walls in (("reference", [0.080, 0.081]), ("cuda", [0.030, 0.032])):
        folder = perf / job / "trial_0"
        folder.mkdir(parents=True)
        for rank, wall in enumerate(walls):
            (folder / f"rank_{rank}_perf.json").write_text(json.dumps({"wall_time_ms": wall}))
    v = parse("match_perf.stdout", perf_root=perf)
    assert (v.correct, v.verdict, v.outcome) == (True, "correct", "match")
    assert [t.speedup for t in v.trials] == [2.53, 1.98]
    assert v.speedup == pytest.approx((2.53 + 1.98) / 2)  # the median of two
    assert (v.trials[0].reference_ms, v.trials[0].solution_ms) == (0.081, 0.032)
    assert v.trials[0].solution_rank_ms == [0.030, 0.032] and v.trials[1].solution_rank_ms == []
    assert v.fast


def test_parser_mismatch_keeps_pkbs_message_and_no_speedup() -> None:
    v = parse("mismatch.stdout", returncode=1)
    assert (v.correct, v.verdict, v.outcome) == (False, "output_mismatch", "tensor_mismatch")
    assert "max_abs_diff=2" in v.message and v.speedup is None
    assert v.trials[0].speedup == 4.25  # PKB still timed it: kept per trial, never as the verdict's speedup


def test_parser_shape_words_become_shape_mismatch() -> None:
    v = parse("shape_mismatch.stdout", returncode=1)
    assert (v.verdict, v.outcome) == ("shape_mismatch", "tensor_mismatch")


@pytest.mark.parametrize(("name", "verdict", "outcome", "job", "words"), [
    ("solution_build_failed.stdout", "compile_error", "solution_failed", "solution", "Error building extension"),
    ("no_solution.stdout", "api_error", "solution_failed", "solution", "'solution' not found"),
    ("solution_crashed.stdout", "runtime_error", "solution_failed", "solution", "illegal memory access"),
    ("reference_failed.stdout", "infra_error", "reference_failed", "reference", "_cuda_setDevice"),
    ("harness_environment.stdout", "infra_error", "harness_environment", None, "no_gpu_visible"),
])
def test_parser_failed_jobs(name: str, verdict: str, outcome: str, job: str | None, words: str) -> None:
    v = parse(name, returncode=1)
    assert (v.correct, v.verdict, v.outcome, v.failing_job) == (False, verdict, outcome, job)
    assert words in v.message
    assert "ChildFailedError" not in v.message  # torchrun's own launcher error is never the reason


def test_parser_without_verdict_line_and_after_the_time_limit() -> None:
    v = parse_pkb_output("", (OUTPUTS / "preflight_error.stderr").read_text(), 1)
    assert (v.verdict, v.outcome) == ("infra_error", "no_verdict") and "no file for problem" in v.message
    partial = "\n".join((OUTPUTS / "match_perf.stdout").read_text().splitlines()[:16])  # killed after trial 0
    t = parse_pkb_output(partial, "", None, timed_out=True, timeout_s=30)
    assert (t.correct, t.verdict, t.outcome) == (False, "timeout", "time_limit")
    assert "30 s" in t.message and [x.speedup for x in t.trials] == [2.53]


def test_exception_line_strips_rank_prefixes_and_keeps_continued_messages() -> None:
    text = "[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 1\n[rank0]: ValueError: bad\n"
    assert exception_line(text) == "ValueError: bad"
    # as torch 2.11's pybind said it on the H200 (GPT-5.5's 2_allgather, docs/measurements/pkb-runs.md), shortened
    pybind = ("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"s.py\", line 247, in solution\n"
              "[rank0]: TypeError: launch(): incompatible function arguments. The following argument types are "
              "supported:\n[rank0]:     1. (arg0: torch.Tensor, arg1: typing.SupportsInt) -> None\n\n"
              "[rank0]: Invoked with: tensor([1.]), 140641682063872\n")
    assert exception_line(pybind) == ("TypeError: launch(): incompatible function arguments. The following argument "
                                      "types are supported: 1. (arg0: torch.Tensor, arg1: typing.SupportsInt) -> None")


def test_problem_stem_resolves_ids_and_refuses_unknowns() -> None:
    assert problem_stem(FAKE_CHECKOUT, "2") == "2_allgather"
    assert problem_stem(FAKE_CHECKOUT, FAKE_CHECKOUT / "reference" / "2_allgather.py") == "2_allgather"
    with pytest.raises(ValueError, match="no reference"):
        problem_stem(FAKE_CHECKOUT, "3_broadcast")


# -- the contained runner ---------------------------------------------------------------------------
def test_runner_kills_a_tree_that_left_its_group_at_the_time_limit(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids.json"
    out = run_contained([sys.executable, str(FIX / "standin_tree.py"), str(pids_file)], timeout_s=4.0,
                        log_dir=tmp_path / "log")
    pids = json.loads(pids_file.read_text())
    assert out.timed_out and out.returncode is None
    assert {pids["child"], pids["grandchild"]} <= set(out.leftovers)  # found by their token, not their group
    assert wait_dead(list(pids.values())) == [] and out.survivors == []
    assert token_pids(out.token) == []


def test_runner_ends_what_a_finished_command_left_behind(tmp_path: Path) -> None:
    pids_file = tmp_path / "pids.json"
    out = run_contained([sys.executable, str(FIX / "standin_tree.py"), str(pids_file), "exit"], timeout_s=30.0,
                        log_dir=tmp_path / "log")
    pids = json.loads(pids_file.read_text())
    assert not out.timed_out and out.returncode == 0
    assert {pids["child"], pids["grandchild"]} <= set(out.leftovers)
    assert wait_dead([pids["child"], pids["grandchild"]]) == []


# -- score_with_pkb end to end, against a stand-in run_local.py -------------------------------------
def test_score_with_pkb_stages_a_copy_and_passes_every_setting(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    v = score_with_pkb(FAKE_CHECKOUT, FIX / "solutions" / "2_allgather_match_cuda.py", "2", 2, trials=2,
                       timeout_s=60, base_shape=(64, 64), keep_dir=keep, gpus=[0, 1])
    assert (v.correct, v.outcome, v.problem, v.world_size) == (True, "match", "2_allgather", 2)
    assert v.speedup == pytest.approx(1.1 / 0.6, rel=1e-2)  # the slowest rank's means, as the stand-in wrote them
    assert v.trials[1].solution_rank_ms == [0.5, 0.6] and v.trials[1].reference_rank_ms == [1.0, 1.1]
    env = json.loads(next(line for line in v.stdout_tail.splitlines() if line.startswith("FAKE_ENV:"))[9:])
    assert (env["NCCL_NVLS_ENABLE"], env["TORCH_SYMM_MEM_DISABLE_MULTICAST"], env["NVSHMEM_DISABLE_NVLS"]) == \
        ("0", "1", "1")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    staged = Path(env["root"])
    assert staged != FAKE_CHECKOUT.resolve() and not staged.exists()  # a copy, removed afterwards
    assert env["torchrun"] == str(staged.parent / "bin" / "torchrun")  # our shim, first on PATH
    assert env["TORCH_EXTENSIONS_DIR"].startswith(str(staged.parent))  # caches inside the scratch folder
    argv = env["argv"]
    for flag, value in (("--nproc-per-node", "2"), ("--mode", "eval"), ("--trials", "2"), ("--m", "64"),
                        ("--dtype", "bfloat16"), ("--atol", "0.01"), ("--solution", "cuda")):
        assert argv[argv.index(flag) + 1] == value
    assert "--measure-perf" in argv and "--download" in argv
    assert (keep / "run" / "stdout.txt").is_file()
    assert not any((FAKE_CHECKOUT / "logs").glob("*"))  # the checkout itself was never written


def test_score_with_pkb_mismatch(tmp_path: Path) -> None:
    v = score_with_pkb(FAKE_CHECKOUT, FIX / "solutions" / "2_allgather_mismatch_cuda.py", "2_allgather", 2,
                       trials=3, timeout_s=60)
    assert (v.correct, v.verdict, len(v.trials), v.returncode) == (False, "output_mismatch", 1, 1)


def test_score_with_pkb_time_limit_ends_every_process() -> None:
    v = score_with_pkb(FAKE_CHECKOUT, FIX / "solutions" / "2_allgather_hang_cuda.py", "2_allgather", 2,
                       timeout_s=4)
    assert (v.correct, v.verdict, v.outcome, v.timed_out) == (False, "timeout", "time_limit", True)
    pids = json.loads(next(line for line in v.stdout_tail.splitlines() if line.startswith("FAKE_PIDS:"))[10:])
    assert wait_dead(pids) == []
    assert v.leftover_processes >= 1  # the session-escaping sleeper, found and ended


def test_score_with_pkb_ends_a_daemon_left_after_success() -> None:
    v = score_with_pkb(FAKE_CHECKOUT, FIX / "solutions" / "2_allgather_daemon_cuda.py", "2_allgather", 2,
                       trials=1, timeout_s=60)
    pids = json.loads(next(line for line in v.stdout_tail.splitlines() if line.startswith("FAKE_PIDS:"))[10:])
    assert v.correct and v.leftover_processes == 1 and wait_dead(pids) == []


def test_score_with_pkb_refuses_cpu() -> None:
    v = score_with_pkb(FAKE_CHECKOUT, FIX / "solutions" / "2_allgather_match_cuda.py", "2_allgather", 2,
                       device="cpu")
    assert (v.verdict, v.outcome) == ("infra_error", "no_verdict") and "CUDA only" in v.message


@pytest.mark.slow
@pytest.mark.skipif(not (HEAD / "run_local.py").is_file(), reason="needs the PKB checkout at /work/pkb/head")
def test_real_pkb_scripts_on_cpu_fail_in_the_reference_job() -> None:
    """PKB's real run_local.py, worker and comparison with our arguments: on a CPU machine its reference job
    fails at torch.cuda.set_device, which the parser reads from PKB's own JSON as nobody's verdict."""
    v = score_with_pkb(HEAD, HEAD / "reference" / "1_allreduce.py", "1_allreduce", 2, trials=1, timeout_s=300)
    assert (v.correct, v.verdict, v.outcome, v.failing_job) == (False, "infra_error", "reference_failed", "reference")
    assert v.trials and v.trials[0].result == "no_artifacts"
    assert v.leftover_processes == 0


# -- the rules ---------------------------------------------------------------------------------------
def ours(verdict: str = "correct", flags: tuple[str, ...] = (), speedup: float | None = None,
         message: str = "", fast_eligible: bool = True) -> EvalResult:
    failure = None if verdict == "correct" else Failure(verdict=verdict, message=message or verdict,
                                                        phase="check")
    return EvalResult(problem="1_allreduce", category="collective", shape="default", world_size=2, device="cuda",
                      candidate=CandidateInfo(path="x.py", sha256="0"), verdict=verdict,
                      correct=verdict == "correct", failure=failure, speedup=speedup, flags=list(flags),
                      fast_eligible=fast_eligible, seed=0, trials=5)


def pkb(correct: bool = True, speedup: float | None = None, verdict: str | None = None,
        outcome: str | None = None) -> PkbVerdict:
    return PkbVerdict(problem="1_allreduce", world_size=2, correct=correct,
                      verdict=verdict or ("correct" if correct else "output_mismatch"),
                      outcome=outcome or ("match" if correct else "tensor_mismatch"), message="", speedup=speedup,
                      trials=[TrialReport(0, "match", solution_rank_ms=[0.5, 0.9])])


@pytest.mark.parametrize(("mine", "theirs", "kind", "rule"), [
    (ours("output_mismatch", ("mutates_inputs",), message="rank 0 modified its inputs in trial 2"), pkb(),
     "verdict", "input_mutation"),
    (ours("output_mismatch", ("pkb_inputs_perturbed",)), pkb(), "verdict", "constant_inputs"),
    (ours("output_mismatch", ("race",)), pkb(), "verdict", "stress_trials"),
    (ours("output_mismatch", ("reduced_precision",)), pkb(), "verdict", "precision_probe"),
    (ours("output_mismatch", ("timed_output_wrong",)), pkb(), "verdict", "timed_outputs"),
    (ours("output_mismatch", ("unsynchronized_work",)), pkb(), "verdict", "output_after_return"),
    (ours("shape_mismatch", message="rank 0, trial 1: out: dtype torch.float32 but expected torch.bfloat16"), pkb(),
     "verdict", "dtype_check"),
    (ours("deadlock"), pkb(), "verdict", "time_limit"),
    (ours("infra_error"), pkb(), "verdict", "environment_ours"),
    (ours("output_mismatch"), pkb(), "verdict", "inputs_differ"),
    (ours(), pkb(False), "verdict", "inputs_differ"),
    (ours(), pkb(False, verdict="compile_error", outcome="solution_failed"), "verdict", "build_environment"),
    (ours(), pkb(False, verdict="timeout", outcome="time_limit"), "verdict", "pkb_time_limit"),
    (ours(speedup=3.0, flags=("uses_torch_collectives",), fast_eligible=False), pkb(speedup=3.1), "speedup",
     "no_collective_check"),
    (ours(speedup=1.2, flags=("input_caching",), fast_eligible=False), pkb(speedup=9.0), "speedup",
     "only_first_argument_rotated"),
    (ours(speedup=2.0, flags=("timing_inconsistent",), fast_eligible=False), pkb(speedup=2.0), "speedup",
     "timing_reconciliation"),
    (ours(speedup=2.0, flags=("static:monkeypatch",), fast_eligible=False), pkb(speedup=2.0), "speedup",
     "disqualified_speedup"),
    (ours(speedup=0.8), pkb(speedup=1.5), "speedup", "per_rank_means_no_barrier"),
])
def test_rule_named_for_each_kind_of_difference(mine: EvalResult, theirs: PkbVerdict, kind: str, rule: str) -> None:
    c = pkb_rules.compare(mine, theirs)
    assert [(d.kind, d.rule) for d in c.differences] == [(kind, rule)]
    assert c.differences[0].explain == pkb_rules.load_rules().explain(rule)
    # the same from the records' JSON, as the benchmark stores them
    again = pkb_rules.compare(mine.model_dump(mode="json"), theirs.as_dict())
    assert again.rules == [rule]


def test_rules_agreement_judged_and_evidence() -> None:
    same = pkb_rules.compare(ours(speedup=1.5), pkb(speedup=1.6))
    assert same.agree and same.judged and same.differences == [] and same.ours_fast and same.pkb_fast
    env = pkb_rules.compare(ours("infra_error"), pkb())
    assert not env.agree and not env.judged
    slow = pkb_rules.compare(ours(speedup=0.8), pkb(speedup=1.5))
    assert slow.differences[0].evidence["pkb_solution_rank_spread"] == [1.8]  # 0.9 / 0.5 ms
    both_wrong = pkb_rules.compare(ours("runtime_error"), pkb(False))
    assert both_wrong.agree and not both_wrong.same_verdict and both_wrong.differences == []


def test_unexplained_when_no_rule_applies() -> None:
    c = pkb_rules.compare(ours(), pkb(False, verdict="runtime_error", outcome="solution_failed"))
    assert c.rules == [pkb_rules.UNEXPLAINED]


def test_rules_file_is_one_line_each_and_validated(tmp_path: Path) -> None:
    book = pkb_rules.load_rules()
    assert all(r.explain and "\n" not in r.explain and len(r.explain) < 300 for r in book.rules)
    for brief_rule in ("constant_inputs", "per_rank_means_no_barrier", "only_first_argument_rotated",
                       "no_collective_check", "input_mutation", "stress_trials", "precision_probe", "timed_outputs",
                       "timing_reconciliation"):
        assert any(r.id == brief_rule for r in book.rules)
    good = {"rules": [{"id": "x", "kind": "speedup", "when": {}, "explain": "always"}]}
    assert pkb_rules.parse_rules(good).rules[0].id == "x"
    for bad, words in (
        ({"rules": [{"id": "x", "kind": "verdict", "when": {"ours_colour": ["red"]}, "explain": "e"}]}, "unknown"),
        ({"rules": [{"id": "x", "kind": "speedup", "when": {}, "explain": "two\nlines"}]}, "one line"),
        ({"rules": [{"id": "x", "kind": "verdict", "when": {}, "explain": "e"}]}, "apply always"),
        ({"rules": [{"id": "x", "kind": "verdict", "when": {"ours_correct": "no"}, "explain": "e"}]}, "true or false"),
    ):
        with pytest.raises(ValueError, match=words):
            pkb_rules.parse_rules(bad)


# -- the multicast filter ---------------------------------------------------------------------------
def test_multicast_filter_on_own_fixtures() -> None:
    files = sorted((FIX / "solutions").glob("*.py"))
    runnable, skipped = pkb_multicast.split_multicast(files)
    assert list(skipped) == [FIX / "solutions" / "9_uses_multimem_cuda.py"]
    assert "'multimem' at line 3" in skipped[FIX / "solutions" / "9_uses_multimem_cuda.py"]
    assert len(runnable) == len(files) - 1
    assert pkb_multicast.multicast_reason("x = cuMulticastCreate(handle)") is not None
    assert pkb_multicast.multicast_reason("os.environ['NCCL_NVLS_ENABLE'] = '0'") is not None  # broad on purpose
    assert pkb_multicast.multicast_reason("def solution(x):\n    return x\n") is None


RECORDED = {"solutions_cuda_bf16_h100_8_openai_gpt-5.5": 6, "solutions_cuda_bf16_h100_8_anthropic_claude-opus-4-7": 22,
            "solutions_cuda_bf16_h100_8_google_gemini-3-pro-preview": 17}


@pytest.mark.skipif(not FIRST.is_dir(), reason="needs the PKB first public commit at /work/pkb/first")
def test_multicast_filter_on_the_recorded_sets() -> None:
    for name, expected in RECORDED.items():
        runnable, skipped = pkb_multicast.split_multicast(sorted((FIRST / name).glob("*.py")))
        assert len(skipped) == expected, name
        assert all("multicast must not run" in why for why in skipped.values())
    gpt = FIRST / "solutions_cuda_bf16_h100_8_openai_gpt-5.5"
    assert pkb_multicast.multicast_reason(gpt / "1_allreduce_cuda.py") is not None
    assert pkb_multicast.multicast_reason(gpt / "2_allgather_cuda.py") is None


def test_no_token_process_left_by_this_module() -> None:
    # Every runner above ended its processes: none of this test process's children is still running.
    assert live_children() == []


# -- the side-by-side report ------------------------------------------------------------------------
def _benchmark_module() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("pkb_side_by_side", REPO_ROOT / "benchmarks" /
                                                  "pkb_side_by_side.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_side_by_side_report_counts_agreement_and_names_rules() -> None:
    bench: object = _benchmark_module()
    rows = []
    for name, mine, theirs in (("a_cuda.py", ours(speedup=1.5), pkb(speedup=1.6)),
                               ("b_cuda.py", ours("output_mismatch", ("mutates_inputs",)), pkb()),
                               ("c_cuda.py", ours("infra_error"), pkb(False))):
        o, p = mine.model_dump(mode="json"), theirs.as_dict()
        o["wall_s"], p["wall_s"] = 10.0, 20.0
        rows.append({"group": "openai_gpt-5.5", "file": name, "problem": "1_allreduce", "ours": o, "pkb": p,
                     "comparison": pkb_rules.compare(o, p).as_dict()})
    doc: dict[str, Any] = {
           "date": "2026-12-01", "machine": "test", "command": "python benchmarks/pkb_side_by_side.py", "world_size": 2,
           "shape": "default", "trials": 5, "pkb_trials": 5, "timeout_s": 900.0, "harness": "both", "rows": rows,
           "skipped": [{"group": "openai_gpt-5.5", "file": "1_allreduce_cuda.py", "reason": "uses NVLink multicast"}],
           "spread": [{"group": "openai_gpt-5.5", "file": "a_cuda.py", "problem": "1_allreduce",
                       "ours": [1.5, 1.4, 1.6], "pkb": [1.6, 2.0, 1.8], "ours_wall_s": [], "pkb_wall_s": []}]}
    text = bench.render(doc)  # type: ignore[attr-defined]
    assert "**1/2 (50%)**" in text  # c is not judged by both (infra_error): left out of the rate
    assert "`input_mutation`" in text and pkb_rules.load_rules().explain("input_mutation") in text
    assert "| openai_gpt-5.5 | 3 | 1 | 2 | 1/2 (50%) | 1 / 1 | 2 / 1 |" in text
    assert "| a_cuda.py | 1_allreduce | 1.500, 1.400, 1.600 | 13.3% | 1.600, 2.000, 1.800 | 22.2% | 1.200 |" in text
    assert "uses NVLink multicast" in text and doc["summary"]["wall_s"]["pkb"]["total"] == 60.0
