"""`pkb run --precision bf16|fp32` on a ParallelKernelBench checkout: the default is the replayed set's precision
(its folder name says it), else bf16, PKB's published sets'; the choice reaches PKB's prompt, the inputs' dtype,
the tolerance and the run's manifest. Uses the real first public commit where it is unpacked, and this repo's
small checkout fixture for what does not need PKB's prompts."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import pytest
import torch

from agent import prompting
from agent.cli import run as cli_run
from agent.cli.common import CliError, Parser
from agent.cli.run_config import config_from_args
from agent.cli.source import resolve_source, select_in
from agent.conditions import parse_condition
from agent.runner import RunConfig, run_header
from harness.common.paths import REPO_ROOT
from harness.problems.parallelkernelbench import checkout
from tests.conftest import TESTS

# PKB's first public commit, with its recorded (bf16) sets: $PKB_FIRST, else unpacked in the repo at .pkb/first
FIRST = Path(os.environ.get("PKB_FIRST") or REPO_ROOT / ".pkb" / "first")
FIXTURE = TESTS / "fixtures" / "pkb_checkout"
GPT_SET = FIRST / "solutions_cuda_bf16_h100_8_openai_gpt-5.5"

needs_first = pytest.mark.skipif(not (FIRST / "kernelgen" / "prompts.toml").is_file(),
                                 reason="PKB's first public commit is not at $PKB_FIRST or .pkb/first (its prompts are "
                                        "read from the checkout, never vendored)")


def _args(*argv: str) -> argparse.Namespace:
    parser = Parser(prog="pkb run")
    cli_run.add_arguments(parser)
    return parser.parse_args(list(argv))


def _config(*argv: str) -> RunConfig:
    return config_from_args(_args(*argv))


def _prompt_and_manifest(config: RunConfig) -> tuple[str, dict, dict]:
    """PKB's zero-shot prompt for problem 1 as the run opens it, its record, and the manifest run.json would get."""
    problem = select_in(resolve_source(config.source, config.precision), ["1"])[0]
    opened = prompting.opening(config.prompt_choice, parse_condition("zero-shot"), problem, shape="default",
                               world_size=2, topology=None, guide_in_prompt=True, model_name=config.model, scratch=None)
    header = run_header("r", config, None, problems=[problem])
    return str(opened.messages[1].content), opened.record, header["manifest"]


@needs_first
def test_pkb_prompt_and_manifest_say_bf16_by_default_and_fp32_when_asked():
    """The checkout's prompts.toml defaults to fp32 (meta.default_precision): without --precision PKB's prompt
    used to tell the model FP32 while the published sets are bf16."""
    common = ("--model", "openai:gpt-5.5", "--prompt", "pkb", "--source", f"pkb:{FIRST}")
    default = _config(*common)
    assert default.precision == "bf16"
    text, record, manifest = _prompt_and_manifest(default)
    assert "optimized for BF16 (bfloat16) precision" in text and "FP32" not in text  # PKB's precision_note
    assert record["precision"] == "bf16" and "solutions_cuda_bf16_h100_8_openai_gpt-5.5/" in record["solution_path"]
    assert manifest["precision"] == "bf16"

    fp32 = _config(*common, "--precision", "fp32")
    text, record, manifest = _prompt_and_manifest(fp32)
    assert "optimized for FP32 (32-bit floating point) precision" in text and "BF16 (bfloat16)" not in text
    assert record["precision"] == "fp32" and manifest["precision"] == "fp32"


@needs_first
def test_a_replayed_set_gives_its_precision_and_the_problems_follow_it(tmp_path):
    assert _config("--model", f"replay:{GPT_SET}", "--source", f"pkb:{FIRST}").precision == "bf16"
    named_fp32 = tmp_path / "solutions_cuda_fp32_h100_8_openai_demo"
    named_fp32.mkdir()
    shutil.copy(next(GPT_SET.glob("1_*.py")), named_fp32)
    assert _config("--model", f"replay:{named_fp32}", "--source", f"pkb:{FIRST}").precision == "fp32"
    # an explicit --precision wins over the set's name
    assert _config("--model", f"replay:{GPT_SET}", "--source", f"pkb:{FIRST}",
                   "--precision", "fp32").precision == "fp32"
    named_fp16 = tmp_path / "solutions_cuda_fp16_h100_8_openai_demo"
    named_fp16.mkdir()
    with pytest.raises(CliError, match="precision 'fp16'.*pass --precision"):
        _config("--model", f"replay:{named_fp16}", "--source", f"pkb:{FIRST}")


def test_the_precision_sets_the_inputs_dtype_and_pkbs_tolerance():
    bf16 = {p.name: p for p in checkout.suite(FIXTURE)}
    fp32 = {p.name: p for p in checkout.suite(FIXTURE, "fp32")}
    name = next(iter(bf16))
    assert (bf16[name].dtype, bf16[name].atol, bf16[name].rtol) == (torch.bfloat16, 1e-2, 1e-2)
    assert (fp32[name].dtype, fp32[name].atol, fp32[name].rtol) == (torch.float32, 1e-5, 1e-5)
    # the loader spec carries it to every process that loads the problem (rank pools, the reference pool, Ray)
    assert bf16[name].spec == checkout.spec_for(FIXTURE.resolve(), bf16[name].path)  # unchanged for bf16
    assert fp32[name].spec == bf16[name].spec + "::fp32"
    loaded = checkout.load_spec(fp32[name].spec)
    assert (loaded.dtype, loaded.atol, loaded.spec) == (torch.float32, 1e-5, fp32[name].spec)
    assert checkout.parse_spec(fp32[name].spec) == checkout.parse_spec(bf16[name].spec)
    # caches keyed by the problem's hash (reference timings, traces) never mix the two
    assert fp32[name].source_sha256 != bf16[name].source_sha256
    gen = torch.Generator().manual_seed(1)
    drawn = loaded.make_inputs(loaded.shape("small"), 0, 2, gen, torch.device("cpu"))
    floats = [x for x in drawn if isinstance(x, torch.Tensor) and x.is_floating_point()]
    assert floats and all(x.dtype == torch.float32 for x in floats)
    with pytest.raises(checkout.CheckoutError, match="unknown precision 'fp8'"):
        checkout.suite(FIXTURE, "fp8")


def test_precision_applies_to_pkb_problems_or_pkbs_prompt_only():
    with pytest.raises(CliError, match="--precision applies to a ParallelKernelBench checkout"):
        _config("--model", "scripted:x", "--precision", "bf16")
    assert _config("--model", "scripted:x").precision is None  # this suite's problems keep their own dtypes
    with pytest.raises(CliError, match="--precision 'fp8': use bf16, fp32"):
        _config("--model", "scripted:x", "--source", f"pkb:{FIXTURE}", "--precision", "fp8")
    assert _config("--model", "scripted:x", "--source", f"pkb:{FIXTURE}").precision == "bf16"


def test_resume_keeps_the_stored_precision(tmp_path):
    from agent.cli.run_config import check_resume_args
    from agent.rundir import RunDir

    stored = _config("--model", "scripted:x", "--source", f"pkb:{FIXTURE}", "--precision", "fp32")
    args = _args("--run-id", "r", "--resume", "--precision", "bf16")
    with pytest.raises(CliError, match="was started with precision 'fp32'"):
        check_resume_args(args, stored, RunDir(tmp_path / "r"))
    check_resume_args(_args("--run-id", "r", "--resume", "--precision", "fp32"), stored, RunDir(tmp_path / "r"))


def test_a_run_written_before_the_option_reads_as_no_precision(tmp_path: Path):
    """run.json without `precision`: None (bf16 inputs, the checkout's own default in PKB's prompt, as then)."""
    old = RunConfig.model_validate({"model": "scripted:x", "conditions": ["zero-shot"], "problems": []})
    assert old.precision is None and old.infra_waits_s == [30.0, 120.0, 300.0]
