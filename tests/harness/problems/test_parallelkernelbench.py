"""A ParallelKernelBench-format checkout (tests/fixtures, written here) loads, validates and is scored end to end
on CPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from agent.cli import run as cli_run
from agent.cli.common import CliError
from agent.cli.source import one_in, resolve_source, select_in
from agent.report.run_reader import read_run
from harness.common.seeds import rank_seed
from harness.compiling.compile import compile_candidate
from harness.config import EvalConfig, TimingConfig
from harness.evaluate import evaluate
from harness.problems.parallelkernelbench import checkout, input_report
from harness.problems.parallelkernelbench import inputs as input_plans
from harness.problems.parallelkernelbench import solutions as solution_sets
from harness.problems.problem import MalformedProblem
from harness.problems.registry import load_problem_spec
from harness.validate import validate_problems, validate_without_oracle
from tests.conftest import TESTS

FIXTURES = TESTS / "fixtures"
CHECKOUT = FIXTURES / "pkb_checkout"
SOLUTIONS = FIXTURES / "solutions_cuda_bf16_cpu_scripted_demo"


def inputs(problem, rank: int, trial: int, world_size: int = 2, seed: int = 0) -> tuple:
    gen = torch.Generator()
    gen.manual_seed(rank_seed(seed, trial, rank))
    return problem.make_inputs(problem.shape("small"), rank, world_size, gen, torch.device("cpu"))


@pytest.fixture(scope="module")
def problems():
    return checkout.list_problems(CHECKOUT)


# -- loading ------------------------------------------------------------------------------------------
def test_checkout_loads_as_problems(problems):
    assert checkout.is_checkout(CHECKOUT)
    assert [p.name for p in problems] == ["1_all_reduce", "2_all_gather", "3_reduce_scatter"]
    assert [checkout.problem_id(p) for p in problems] == [1, 2, 3]
    for p in problems:
        assert p.origin == "pkb" and p.category == "collective" and p.oracle is None and p.traffic is None
        assert p.world_sizes == (2, 4, 8) and p.dtype == torch.bfloat16 and p.atol == p.rtol == 1e-2
        assert p.shapes == {"default": {"base_shape": [1024, 1024]}, "small": {"base_shape": [64, 64]}}
        assert p.spec == f"pkb:{CHECKOUT.resolve()}::{p.path.name}"
        assert p.source["codebase"] == "ParallelKernelBench" and p.source["path"] == f"reference/{p.path.name}"
        assert list(p.reference_signature().parameters)[0] == "tensor"
    again = load_problem_spec(problems[2].spec)  # what a rank worker does
    assert again.name == "3_reduce_scatter" and again.loader_spec == problems[2].spec


@pytest.mark.parametrize(("name", "category"), [
    ("allreduce", "collective"), ("reduce_scatter", "collective"), ("moe_ep_wide", "expert"),
    ("fsdp_and_tp", "fsdp_zero"), ("ulysses_attention_e2e", "sequence"), ("ring_attention_pp", "context"),
    ("vocab_parallel_log_prob_topk", "rl_vocab"), ("gemm_allreduce", "tensor"), ("ddp", "data"),
    ("distributed_sample_sort", "other"),
])
def test_category_guessed_from_the_name(name, category):
    assert checkout.guess_category(name) == category


def test_a_reference_may_declare_its_world_sizes(tmp_path: Path):
    root = tmp_path / "checkout"
    shutil.copytree(CHECKOUT, root)
    ref = root / "reference" / "3_reduce_scatter.py"
    ref.write_text("WORLD_SIZES = [4, 2]\n" + ref.read_text())
    by_name = {p.name: p for p in checkout.list_problems(root)}
    assert by_name["3_reduce_scatter"].world_sizes == (2, 4)
    assert by_name["1_all_reduce"].world_sizes == (2, 4, 8)


# -- inputs -------------------------------------------------------------------------------------------
def test_constant_pkb_inputs_are_perturbed_per_trial(problems):
    p = problems[0]  # the fixture fills rank + 1 in every trial, as PKB's collective problems do
    state = torch.get_rng_state()
    a0, a1, b0 = inputs(p, 0, trial=0)[0], inputs(p, 1, trial=0)[0], inputs(p, 0, trial=1)[0]
    assert torch.equal(state, torch.get_rng_state())  # PKB reseeds the global RNG; ours is untouched
    assert a0.dtype == torch.bfloat16 and a0.shape == (64, 64)
    assert not torch.equal(a0, b0), "trials must differ"
    assert not torch.equal(a0, a1 / 2), "ranks must differ beyond the fill value"
    assert torch.equal(a0, inputs(p, 0, trial=0)[0]), "reproducible from the seed"
    assert abs(a0.float().mean().item() - 1.0) < 0.05 and abs(a1.float().mean().item() - 2.0) < 0.1
    assert input_report.input_flags(p) == [input_plans.FLAG_PERTURBED]
    assert any("re-drawn per trial" in n for n in input_report.probe_inputs(p))
    q = problems[1]  # honours trial: left as PKB draws it
    assert not torch.equal(inputs(q, 0, 0)[0], inputs(q, 0, 1)[0])
    assert input_report.input_flags(q) == [] and input_report.probe_inputs(q) == []


def test_process_group_arguments_pass_through(problems):
    x, group = inputs(problems[2], 1, trial=0)
    assert x.shape == (128, 64) and group is torch.distributed.group.WORLD  # None outside a process group


def test_plan_perturbs_only_what_is_safe():
    fill = torch.full((4, 4), 3.0)
    ints = torch.arange(16).reshape(4, 4)
    zeros = torch.zeros(8)
    structured = torch.linspace(-1, 1, 200)  # identical across trials but not a fill: unknown structure
    varying = (torch.randn(5), torch.randn(5))
    plan = input_plans.plan_inputs((fill, [ints, zeros], structured, varying[0], 7),
                                  (fill.clone(), [ints.clone(), zeros.clone()], structured.clone(), varying[1], 7))
    assert plan.perturb == [(0,)]
    assert [where for where, _ in plan.constant] == [(1, 0), (1, 1), (2,)]
    notes = " | ".join(plan.notes())
    assert "int64 tensor" in notes and "all zeros" in notes and "not a fill" in notes
    assert "cannot perturb it safely" in notes


def test_equal_fills_stay_equal_across_ranks():
    """A replicated parameter (the same fill on every rank) must stay replicated after re-drawing."""
    w = torch.full((6, 6), 0.5, dtype=torch.bfloat16)
    assert torch.equal(input_plans.redraw(w, 1 << 20, (0,)), input_plans.redraw(w.clone(), 1 << 20, (0,)))
    assert not torch.equal(input_plans.redraw(w, 1 << 20, (0,)), input_plans.redraw(w, 2 << 20, (0,)))


# -- validation and scoring ---------------------------------------------------------------------------
def test_validation_runs_each_reference_and_says_there_is_no_oracle(problems):
    results = validate_without_oracle(problems, [2], trials=2)
    assert [(v.problem, v.shape, v.world_size, v.ok) for v in results] == [
        (p.name, shape, 2, True) for p in problems for shape in ("small", "held-out:small")], results
    assert all("no oracle" in v.message and "correct against itself" in v.message for v in results)
    assert "re-drawn per trial" in results[0].message


def test_validate_problems_routes_pkb_problems_to_the_no_oracle_check(problems):
    v, held = validate_problems(problems[:1], [2], trials=2)
    assert v.ok and v.problem == "1_all_reduce" and "no oracle" in v.message
    assert held.ok and held.shape == "held-out:small"  # another base_shape: [32, 128] for [64, 64]


def test_precompile_makes_the_checkouts_utils_importable(problems, tmp_path: Path):
    """A PKB solution imports the checkout's `utils` first thing; the build step (a separate process)
    must load the problem before the candidate, as the rank workers do, or it never reaches the build."""
    solution = tmp_path / "1_all_reduce_cuda.py"
    solution.write_text("from utils.input_output_tensors import create_input_tensor  # noqa: F401\n"
                        "from torch.utils.cpp_extension import load_inline  # noqa: F401 (a native build)\n\n"
                        "def solution(tensor):\n    return tensor.clone()\n")
    alone = compile_candidate(solution, 120.0, "cpu")
    assert alone.ok and alone.native and "ModuleNotFoundError" in alone.evidence
    with_problem = compile_candidate(solution, 120.0, "cpu", problem=problems[0].loader_spec)
    assert with_problem.ok and with_problem.native and "import raised" not in with_problem.evidence, \
        with_problem.evidence


def test_a_reference_that_mutates_its_inputs_is_judged_by_pkbs_rule(tmp_path: Path):
    """PKB judges outputs only, and some of its references modify their inputs in place: the reference,
    as its own candidate, passes, with its inputs compared after the call (PKB's rule, named)."""
    root = tmp_path / "checkout"
    shutil.copytree(CHECKOUT, root)
    ref = root / "reference" / "1_all_reduce.py"
    ref.write_text("import torch.distributed as dist\n\n\ndef solution(tensor):\n"
                   "    dist.all_reduce(tensor)\n    return tensor\n")
    v, _held = validate_without_oracle(checkout.list_problems(root)[:1], [2], trials=2)
    assert v.ok, v.message
    assert "modifies its inputs in place" in v.message and "PKB's rule" in v.message


def test_solution_set_is_scored_end_to_end_on_cpu(problems, tmp_path: Path):
    solutions = solution_sets.solutions_for(SOLUTIONS)
    assert sorted(solutions) == [1, 2, 3]
    config = EvalConfig(trials=3, timing=TimingConfig.for_device("cpu"))
    for p in problems:
        pid = checkout.problem_id(p)
        assert pid is not None
        (path,) = solutions[pid]
        result = evaluate(p, path, world_size=2, device="cpu", shape="small", config=config)
        assert result.verdict == "correct", (p.name, result.failure)
        assert result.origin == "pkb" and result.speedup is not None and result.speedup > 0
        # What PKB's generator did to the inputs is on the record (problems 1 and 3 fill constants that
        # do not change between trials: re-drawn; problem 2 draws fresh ones).
        assert (input_plans.FLAG_PERTURBED in result.flags) == (p.name != "2_all_gather"), result.flags
    wrong = tmp_path / "1_all_reduce_cuda.py"  # forgets to communicate: must be caught
    wrong.write_text("def solution(tensor):\n    return tensor.clone()\n")
    result = evaluate(problems[0], wrong, world_size=2, device="cpu", shape="small", config=config)
    assert result.verdict == "output_mismatch"


# -- bad input ----------------------------------------------------------------------------------------
def test_not_a_checkout_is_one_clear_line(tmp_path: Path):
    for path, needle in ((tmp_path / "nope", "no such directory"), (tmp_path, "reference/ is missing")):
        status = checkout.is_checkout(path)
        assert not status and needle in status.reason and "\n" not in status.reason
        with pytest.raises(checkout.NotACheckout, match=needle):
            checkout.list_problems(path)
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "1_x.py").write_text("def solution(x):\n    return x\n")
    assert "utils/input_output_tensors.py" in checkout.is_checkout(tmp_path).reason
    with pytest.raises(MalformedProblem, match="does not exist"):
        checkout.load_spec(f"pkb:{CHECKOUT.resolve()}::9_missing.py")


def test_solutions_dir_without_matching_files_is_one_clear_line(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "1_all_reduce.py").write_text("")  # no backend suffix: not a PKB solution file
    with pytest.raises(solution_sets.NoSolutions, match=r"holds no PKB solution file \(<id>_<name>_<backend>.py"):
        solution_sets.solutions_for(tmp_path)
    with pytest.raises(solution_sets.NoSolutions, match="no such solutions directory"):
        solution_sets.solutions_for(tmp_path / "absent")
    assert solution_sets.solution_set_info(SOLUTIONS) == {
        "backend": "cuda", "precision": "bf16", "hardware": "cpu", "provider": "scripted", "model": "demo"}
    # The recorded sets' names: the hardware carries its GPU count.
    assert solution_sets.solution_set_info(tmp_path / "solutions_cuda_bf16_h100_8_openai_gpt-5.5") == {
        "backend": "cuda", "precision": "bf16", "hardware": "h100_8", "provider": "openai", "model": "gpt-5.5"}
    assert solution_sets.solution_set_info("solutions_triton_bf16_h100_8_google_gemini-3-pro-preview") == {
        "backend": "triton", "precision": "bf16", "hardware": "h100_8", "provider": "google",
        "model": "gemini-3-pro-preview"}


def test_cli_source(tmp_path: Path):
    problems = resolve_source(f"pkb:{CHECKOUT}")
    assert [p.name for p in problems] == ["1_all_reduce", "2_all_gather", "3_reduce_scatter"]
    assert one_in(problems, "2").name == "2_all_gather"  # a PKB id selects
    assert [p.name for p in select_in(problems, ["3", "1_*"])] == ["3_reduce_scatter", "1_all_reduce"]
    assert select_in(problems, ["collective"]) == problems
    for text, needle in ((f"pkb:{tmp_path}", "reference/ is missing"), ("github:x/y", "--source takes pkb:PATH"),
                         ("pkb:", "--source takes pkb:PATH")):
        with pytest.raises(CliError, match=needle) as err:
            resolve_source(text)
        assert "\n" not in str(err.value)
    with pytest.raises(CliError, match="no problem or category matches '99'"):
        one_in(problems, "99")
    assert all(p.origin == "pkb-agent" for p in resolve_source(None))


def test_solutions_are_matched_by_id_and_name(problems, tmp_path: Path):
    found = solution_sets.solutions_for(SOLUTIONS)
    assert [p.name for p in solution_sets.solutions_of(problems[1], found)] == ["2_all_gather_cuda.py"]
    (tmp_path / "2_all_gather_triton.py").write_text("")
    (tmp_path / "2_gemv_decode_cuda.py").write_text("")  # another reference with the same id
    found = solution_sets.solutions_for(tmp_path)
    assert [p.name for p in solution_sets.solutions_of(problems[1], found)] == ["2_all_gather_triton.py"]
    assert solution_sets.solutions_of(problems[0], found) == []


# -- a checkout shaped like the real one's oddities (tests/fixtures/pkb_checkout_oddities) -----------------
ODD = FIXTURES / "pkb_checkout_oddities"
OLD_SET = ODD / "solutions_cuda_bf16_cpu_scripted_oldnumbers"


@pytest.fixture(scope="module")
def odd():
    return {p.name: p for p in checkout.list_problems(ODD)}


def test_every_file_of_an_older_numbered_set_is_accounted_for(odd):
    """The number alone never pairs: 3_moment_dict is reference 2, 4_sparse_apply reference 3, and
    8_gone, whose number is reference 8's, fits nothing."""
    matches = solution_sets.match_solution_set(ODD, OLD_SET)
    got = {m.file: (m.status, m.problem) for m in matches}
    assert got == {
        "1_all_reduce_cuda.py": ("matched", "1_all_reduce"),
        "3_moment_dict_cuda.py": ("matched", "2_moment_dict"),
        "4_sparse_apply_cuda.py": ("matched", "3_sparse_apply"),
        "5_inplace_all_reduce_cuda.py": ("matched", "4_inplace_all_reduce"),
        "8_gone_cuda.py": ("unmatched", None),
        "9_centroid_of_points_cuda.py": ("matched by signature", "5_fixed_centroid"),
        "12_gemm_allgather_cuda.py": ("matched by rename", "12_allgather_gemm"),
        "14_gemm_allscatter_cuda.py": ("matched by rename", "14_gemm_allgather"),
        "helper.py": ("unmatched", None),
        "NOTES.txt": ("unmatched", None),
    }
    assert [m.file for m in matches][:3] == ["1_all_reduce_cuda.py", "3_moment_dict_cuda.py", "4_sparse_apply_cuda.py"]
    by_file = {m.file: m for m in matches}
    assert "renumbered (file id 3, reference id 2)" in by_file["3_moment_dict_cuda.py"].reason
    assert "no unclaimed reference takes solution(x, y, z)" in by_file["8_gone_cuda.py"].reason
    assert "<id>_<name>_<backend>.py" in by_file["helper.py"].reason
    assert by_file["NOTES.txt"].reason == "not a Python file"
    assert all(m.signature == "same" for m in matches if m.matched)
    assert solution_sets.tally(matches) == {"matched": 4, "matched by rename": 2, "matched by signature": 1,
                                            "unmatched": 3}
    assert by_file["8_gone_cuda.py"].line().startswith("8_gone_cuda.py: unmatched: ")
    assert by_file["12_gemm_allgather_cuda.py"].as_dict()["problem"] == "12_allgather_gemm"


def test_the_signature_vetoes_a_name_and_pairs_what_no_name_fits(odd, tmp_path: Path):
    """gemm_allgather is reference 14's name, but a file taking (A_local, B) is reference 12's problem."""
    (tmp_path / "3_gemm_allgather_cuda.py").write_text("def solution(A_local, B):\n    return A_local @ B\n")
    (tmp_path / "7_scatter_triton.py").write_text("def solution(tensor):\n    return tensor\n")  # id 7, not its sig
    (tmp_path / "30_whatever_cuda.py").write_text("def solution(tensor, group):\n    return tensor\n")
    got = {m.file: m for m in solution_sets.match_files(list(odd.values()), tmp_path)}
    first = got["3_gemm_allgather_cuda.py"]
    assert (first.status, first.problem) == ("matched by signature", "12_allgather_gemm")
    assert "its name is that of 14_gemm_allgather, but differs" in first.reason
    scatter = got["7_scatter_triton.py"]  # same stem as reference 7: the name decides; the odd signature is noted
    assert scatter.problem == "7_scatter" and scatter.signature.startswith("differs: solution(tensor)")
    assert got["30_whatever_cuda.py"].problem == "8_group_sum"  # the only reference taking (tensor, group)


def test_a_signature_is_read_without_running_the_file(tmp_path: Path):
    marker = tmp_path / "ran"
    hostile = tmp_path / "1_x_cuda.py"
    hostile.write_text(f"open({str(marker)!r}, 'w').write('x')\nraise SystemExit(3)\n\n"
                       "@decorate\ndef solution(a, b, *rest):\n    pass\n")
    sig = solution_sets.solution_signature(hostile)
    assert sig == solution_sets.Signature(("a", "b"), varargs=True) and not marker.exists()
    (tmp_path / "2_y_cuda.py").write_text("")
    (tmp_path / "3_z_cuda.py").write_text("def solution(:\n")
    (tmp_path / "4_w_cuda.py").write_text("solution = print\n")
    reasons = [solution_sets.solution_signature(tmp_path / f) for f in ("2_y_cuda.py", "3_z_cuda.py", "4_w_cuda.py")]
    assert reasons == ["the file is empty", "syntax error at line 1", "solution is assigned, not defined with def"]


def test_known_renames_are_data():
    renames = solution_sets.known_renames()
    assert renames["18_rms_norm"] == "18_tp_rms_norm" and renames["12_gemm_allgather"] == "12_allgather_gemm"
    assert all("found" in entry for entry in json.loads(solution_sets.RENAMES_FILE.read_text())["renames"])


def test_replay_run_saves_how_every_file_was_matched(tmp_path: Path, capsys):
    code = cli_run.main(["--model", f"replay:{OLD_SET}", "--source", f"pkb:{ODD}", "--problems", "12", "14",
                         "--trials", "2", "--runs-dir", str(tmp_path), "--run-id", "old", "--no-timing"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "3 of 10 file(s)" in err and "8_gone_cuda.py: unmatched: " in err and "helper.py: unmatched" in err
    saved = json.loads((tmp_path / "old" / "replay_matches.json").read_text())
    assert saved["counts"] == {"matched": 4, "matched by rename": 2, "matched by signature": 1, "unmatched": 3}
    assert len(saved["files"]) == 10 and saved["layout"] == "pkb"
    run = read_run(tmp_path / "old")
    assert sorted((s.record.problem, s.record.verdict) for s in run.samples) == [
        ("12_allgather_gemm", "correct"), ("14_gemm_allgather", "correct")]


# -- inputs: only exact fills are re-drawn ----------------------------------------------------------------
def test_structured_constants_stay_and_are_reported(odd):
    report = input_report.input_report(odd["6_camera_project"], "small", 2)
    assert report.perturbed == [] and report.flags() == [input_plans.FLAG_CONSTANT]
    reasons = {n.input: n.reason for n in report.constant}
    assert set(reasons) == {"#1", "#2"} and "identity matrix" in reasons["#1"]  # eye(4) view
    assert "4 distinct values, not a fill" in reasons["#2"]  # intrinsics, K[2,2] = 1
    view, k = inputs(odd["6_camera_project"], 0, trial=0)[1:]
    assert torch.equal(view, torch.eye(4)) and k[2, 2] == 1 and k[0, 0] == 0.8 * 64  # untouched
    record = report.as_dict()
    assert record["constant"][0] == {"input": "#1", "reason": reasons["#1"], "ranks": [0, 1]}
    assert record["perturbed"] == [] and record["error"] is None


def test_a_stacked_fill_keeps_its_structure_with_new_values(odd):
    p = odd["7_scatter"]  # rank 0 sends slice i (all i + 1) to rank i; the other ranks hold zeros
    report = input_report.input_report(p, "small", 2)
    assert [(n.input, n.action, n.ranks) for n in report.notes] == [("#0", "perturbed", (0,)), ("#0", "constant", (1,))]
    assert "stacked fill" in report.perturbed[0].reason and "all zeros" in report.constant[0].reason
    a, b = inputs(p, 0, trial=0)[0], inputs(p, 0, trial=1)[0]
    for t in (a, b):
        assert all(bool(s.eq(s.reshape(-1)[0]).all()) for s in t)  # still one value per slice
    assert not torch.equal(a, b) and not torch.equal(a[0], torch.ones_like(a[0]))
    assert torch.equal(inputs(p, 1, trial=0)[0], torch.zeros(2, 64, 64, dtype=torch.bfloat16))


def test_sparse_inputs_and_fixed_shapes_pass_through(odd):
    op, rhs = inputs(odd["3_sparse_apply"], 0, trial=0)
    assert op.layout == torch.sparse_coo and rhs.shape == (64, 8)
    assert not torch.equal(op.to_dense(), inputs(odd["3_sparse_apply"], 0, trial=1)[0].to_dense())
    assert input_report.input_report(odd["3_sparse_apply"]).notes == ()
    points, weight = inputs(odd["5_fixed_centroid"], 1, trial=0)
    assert points.shape == (24, 3) and weight == 0.5  # base_shape ignored, as PKB's 68 does
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([2.0, 2.0]), (2, 2),
                                     check_invariants=True)
    plan = input_plans.plan_inputs((sparse, torch.full((3,), 2.0)), (sparse.clone(), torch.full((3,), 2.0)))
    assert plan.perturb == [(1,)] and plan.constant == [((0,), "a sparse_coo tensor")]


def test_inputs_of_a_generator_that_builds_process_groups_are_examined(odd):
    """Problem 8 calls new_group in create_input_tensor: drawn in a child under a fake process group."""
    report = input_report.input_report(odd["8_group_sum"], "small", 2)
    assert report.error is None and [(n.input, n.ranks) for n in report.perturbed] == [("#0", (0, 1))]
    assert not torch.distributed.is_initialized()  # nothing was left in this process


def test_inputs_too_large_to_draw_here_are_not_drawn(odd):
    with pytest.raises(ValueError, match=r"GiB at shape 'small' .* not examined"):
        input_report.draw_plans(odd["1_all_reduce"], "small", 2, max_bytes=1000)


def test_dicts_nested_in_inputs_are_planned():
    first = ({"w": torch.full((4,), 3.0), "idx": torch.arange(4)}, [torch.eye(3)])
    second = ({"w": torch.full((4,), 3.0), "idx": torch.arange(4)}, [torch.eye(3)])
    plan = input_plans.plan_inputs(first, second)
    assert plan.perturb == [(0, "w")] and [w for w, _ in plan.constant] == [(0, "idx"), (1, 0)]
    redrawn = input_plans.apply_plan(first, plan, 1 << 20)
    assert isinstance(redrawn[0], dict) and not torch.equal(redrawn[0]["w"], first[0]["w"])
    assert redrawn[0]["idx"] is first[0]["idx"] and redrawn[1][0] is first[1][0]
    assert input_plans.where_text((0, "w")) == "#0['w']"


# -- the oddities of the real checkout, judged: dict outputs, sparse inputs, PKB's in-place rule ------------
@pytest.mark.parametrize("name", ["2_moment_dict", "3_sparse_apply", "4_inplace_all_reduce"])
def test_oddity_references_are_correct_against_themselves(odd, name):
    config = EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"))
    result = evaluate(odd[name], odd[name].path, world_size=2, device="cpu", shape="small", config=config)
    assert result.verdict == "correct", result.failure
    rule = "pkb" if name == "4_inplace_all_reduce" else "strict"
    assert list(result.integrity["rules"]) == [rule]
