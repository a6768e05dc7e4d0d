"""A PKB-format checkout (tests/fixtures, written here) loads, validates and is scored end to end on CPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from agent.cli_common import CliError
from agent.cli_source import one_in, resolve_source, select_in
from harness import pkb_compat
from harness.compile import compile_candidate
from harness.config import EvalConfig, TimingConfig
from harness.evaluate import evaluate
from harness.problem import MalformedProblem, load_problem_spec
from harness.seeds import rank_seed
from harness.validate import validate_problems

FIXTURES = Path(__file__).parent / "fixtures"
CHECKOUT = FIXTURES / "pkb_checkout"
SOLUTIONS = FIXTURES / "solutions_cuda_bf16_cpu_scripted_demo"


def inputs(problem, rank: int, trial: int, world_size: int = 2, seed: int = 0) -> tuple:
    gen = torch.Generator()
    gen.manual_seed(rank_seed(seed, trial, rank))
    return problem.make_inputs(problem.shape("small"), rank, world_size, gen, torch.device("cpu"))


@pytest.fixture(scope="module")
def problems():
    return pkb_compat.list_pkb_problems(CHECKOUT)


# -- loading ------------------------------------------------------------------------------------------
def test_checkout_loads_as_problems(problems):
    assert pkb_compat.is_pkb_checkout(CHECKOUT)
    assert [p.name for p in problems] == ["1_all_reduce", "2_all_gather", "3_reduce_scatter"]
    assert [pkb_compat.problem_id(p) for p in problems] == [1, 2, 3]
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
    assert pkb_compat.guess_category(name) == category


def test_a_reference_may_declare_its_world_sizes(tmp_path: Path):
    root = tmp_path / "checkout"
    shutil.copytree(CHECKOUT, root)
    ref = root / "reference" / "3_reduce_scatter.py"
    ref.write_text("WORLD_SIZES = [4, 2]\n" + ref.read_text())
    by_name = {p.name: p for p in pkb_compat.list_pkb_problems(root)}
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
    assert pkb_compat.input_flags(p) == [pkb_compat.FLAG_PERTURBED]
    assert any("re-drawn per trial" in n for n in pkb_compat.probe_inputs(p))
    q = problems[1]  # honours trial: left as PKB draws it
    assert not torch.equal(inputs(q, 0, 0)[0], inputs(q, 0, 1)[0])
    assert pkb_compat.input_flags(q) == [] and pkb_compat.probe_inputs(q) == []


def test_process_group_arguments_pass_through(problems):
    x, group = inputs(problems[2], 1, trial=0)
    assert x.shape == (128, 64) and group is torch.distributed.group.WORLD  # None outside a process group


def test_plan_perturbs_only_what_is_safe():
    fill = torch.full((4, 4), 3.0)
    ints = torch.arange(16).reshape(4, 4)
    zeros = torch.zeros(8)
    structured = torch.linspace(-1, 1, 200)  # identical across trials but not a fill: unknown structure
    varying = (torch.randn(5), torch.randn(5))
    plan = pkb_compat.plan_inputs((fill, [ints, zeros], structured, varying[0], 7),
                                  (fill.clone(), [ints.clone(), zeros.clone()], structured.clone(), varying[1], 7))
    assert plan.perturb == [(0,)]
    assert [where for where, _ in plan.constant] == [(1, 0), (1, 1), (2,)]
    notes = " | ".join(plan.notes())
    assert "int64 tensor" in notes and "all zeros" in notes and "not a fill" in notes
    assert "cannot perturb it safely" in notes


def test_equal_fills_stay_equal_across_ranks():
    """A replicated parameter (the same fill on every rank) must stay replicated after re-drawing."""
    w = torch.full((6, 6), 0.5, dtype=torch.bfloat16)
    assert torch.equal(pkb_compat._redraw(w, 1 << 20, (0,)), pkb_compat._redraw(w.clone(), 1 << 20, (0,)))
    assert not torch.equal(pkb_compat._redraw(w, 1 << 20, (0,)), pkb_compat._redraw(w, 2 << 20, (0,)))


# -- validation and scoring ---------------------------------------------------------------------------
def test_validation_runs_each_reference_and_says_there_is_no_oracle(problems):
    results = pkb_compat.validate_pkb_problems(problems, [2], trials=2)
    assert [(v.problem, v.world_size, v.ok) for v in results] == [(p.name, 2, True) for p in problems], results
    assert all("no oracle" in v.message and "correct against itself" in v.message for v in results)
    assert "re-drawn per trial" in results[0].message


def test_validate_problems_routes_pkb_problems_to_the_no_oracle_check(problems):
    (v,) = validate_problems(problems[:1], [2], trials=2)
    assert v.ok and v.problem == "1_all_reduce" and "no oracle" in v.message


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
    (v,) = pkb_compat.validate_pkb_problems(pkb_compat.list_pkb_problems(root)[:1], [2], trials=2)
    assert v.ok, v.message
    assert "modifies its inputs in place" in v.message and "PKB's rule" in v.message


def test_solution_set_is_scored_end_to_end_on_cpu(problems, tmp_path: Path):
    solutions = pkb_compat.solutions_for(SOLUTIONS)
    assert sorted(solutions) == [1, 2, 3]
    config = EvalConfig(trials=3, timing=TimingConfig.for_device("cpu"))
    for p in problems:
        (path,) = solutions[pkb_compat.problem_id(p)]
        result = evaluate(p, path, world_size=2, device="cpu", shape="small", config=config)
        assert result.verdict == "correct", (p.name, result.failure)
        assert result.origin == "pkb" and result.speedup is not None and result.speedup > 0
        # What PKB's generator did to the inputs is on the record (problems 1 and 3 fill constants that
        # do not change between trials: re-drawn; problem 2 draws fresh ones).
        assert (pkb_compat.FLAG_PERTURBED in result.flags) == (p.name != "2_all_gather"), result.flags
    wrong = tmp_path / "1_all_reduce_cuda.py"  # forgets to communicate: must be caught
    wrong.write_text("def solution(tensor):\n    return tensor.clone()\n")
    result = evaluate(problems[0], wrong, world_size=2, device="cpu", shape="small", config=config)
    assert result.verdict == "output_mismatch"


# -- bad input ----------------------------------------------------------------------------------------
def test_not_a_checkout_is_one_clear_line(tmp_path: Path):
    for path, needle in ((tmp_path / "nope", "no such directory"), (tmp_path, "reference/ is missing")):
        status = pkb_compat.is_pkb_checkout(path)
        assert not status and needle in status.reason and "\n" not in status.reason
        with pytest.raises(pkb_compat.NotAPkbCheckout, match=needle):
            pkb_compat.list_pkb_problems(path)
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "1_x.py").write_text("def solution(x):\n    return x\n")
    assert "utils/input_output_tensors.py" in pkb_compat.is_pkb_checkout(tmp_path).reason
    with pytest.raises(MalformedProblem, match="does not exist"):
        pkb_compat.load_pkb_problem_spec(f"pkb:{CHECKOUT.resolve()}::9_missing.py")


def test_solutions_dir_without_matching_files_is_one_clear_line(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "1_all_reduce.py").write_text("")  # no backend suffix: not a PKB solution file
    with pytest.raises(pkb_compat.NoSolutions, match=r"holds no PKB solution file \(<id>_<name>_<backend>.py"):
        pkb_compat.solutions_for(tmp_path)
    with pytest.raises(pkb_compat.NoSolutions, match="no such solutions directory"):
        pkb_compat.solutions_for(tmp_path / "absent")
    assert pkb_compat.solution_set_info(SOLUTIONS) == {
        "backend": "cuda", "precision": "bf16", "hardware": "cpu", "provider": "scripted", "model": "demo"}


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
    found = pkb_compat.solutions_for(SOLUTIONS)
    assert [p.name for p in pkb_compat.solutions_of(problems[1], found)] == ["2_all_gather_cuda.py"]
    (tmp_path / "2_all_gather_triton.py").write_text("")
    (tmp_path / "2_gemv_decode_cuda.py").write_text("")  # another reference with the same id
    found = pkb_compat.solutions_for(tmp_path)
    assert [p.name for p in pkb_compat.solutions_of(problems[1], found)] == ["2_all_gather_triton.py"]
    assert pkb_compat.solutions_of(problems[0], found) == []
