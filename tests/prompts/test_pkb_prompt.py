"""`--prompt pkb`: ParallelKernelBench's own prompt, assembled from a checkout at run time, and its code rule.

The checkout is tests/fixtures/pkb_checkout (our own text in PKB's format: kernelgen/prompts.toml, a
generator with SYSTEM_PROMPT, ALLOWED_MODELS and a footer). The expected texts below are written out by hand
from the rules PKB's generator follows, not produced by the code under test.
benchmarks/pkb_prompt_identity.py compares the same assembly with the real generator (docs/pkb.md).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.conditions import parse_condition
from agent.prompting import PKB, PromptChoiceError, check_conditions, extract, parse_prompt
from harness.common.paths import REPO_ROOT
from prompts import pkb_generator as pkb
from tests.conftest import TESTS

REPO = REPO_ROOT
CHECKOUT = TESTS / "fixtures" / "pkb_checkout"
REFERENCE = (CHECKOUT / "reference" / "1_all_reduce.py").read_text()
BEFORE = (CHECKOUT / "kernelgen" / "example_reference.py").read_text()
AFTER = (CHECKOUT / "kernelgen" / "example_custom.py").read_text()


def _expected_body(hardware: bool, footer_path: str) -> str:
    parts = [
        "Fixture statement: write fixture CUDA kernels for the code below.",
        "Fixture: one example of fixture CUDA kernels.\n\n\nFixture example: doubling\nBefore:\n" + BEFORE
        + "\nAfter (fixture CUDA kernels):\n" + AFTER.rstrip("\n"),
        "Fixture reference:\n\n" + REFERENCE.rstrip("\n"),
        "Fixture precision: fixture bfloat16.",
    ]
    if hardware:
        parts.append("Fixture hardware:\n\nGPU Fixture GPU (Fixture arch): fast\n\n\nTerms: words\n\n\n"
                     "Advice: be careful")
    parts.append("Fixture instruction: answer with one ```python``` block.")
    return "\n\n".join(parts) + f"\nFixture footer: save it as {footer_path}."


def test_zero_shot_prompt_is_the_checkouts_template_filled_in() -> None:
    built = pkb.zero_shot_prompt(CHECKOUT, REFERENCE, "1_all_reduce", provider="openai", model="fixture-model")
    path = "solutions_cuda_bf16_h100_8_openai_fixture-model/1_all_reduce_cuda.py"
    assert built.system == "Fixture system text: kernels only.\n\nKeep the signature."  # the generator's constant
    assert built.user == _expected_body(True, path)
    assert built.record["extraction"] == pkb.PKB_RULE and built.record["solution_path"] == path
    assert built.record["hardware"] == "h100_8" and built.record["backend"] == "cuda"
    assert set(built.record["files"]) == {pkb.TEMPLATES, pkb.GENERATOR}
    # no hardware profile: that component is empty and left out; a model the generator does not list keeps its
    # own provider, and its id is slugged as PKB names folders
    bare = pkb.zero_shot_prompt(CHECKOUT, REFERENCE, "1_all_reduce", provider="anthropic", model="vendor/Big Model!",
                                settings=pkb.PkbSettings(hardware=None))
    slugged = "solutions_cuda_bf16_none_anthropic_vendor_Big_Model/1_all_reduce_cuda.py"
    assert bare.user == _expected_body(False, slugged)
    listed = pkb.zero_shot_prompt(CHECKOUT, REFERENCE, "1_all_reduce", provider="openai", model="vendor/fixture-big")
    assert "_together_vendor_fixture-big/" in listed.record["solution_path"]  # the generator's own provider


def test_a_backend_with_its_own_system_text_and_several_examples() -> None:
    built = pkb.zero_shot_prompt(CHECKOUT, REFERENCE, "1_all_reduce", provider="openai", model="m",
                                 settings=pkb.PkbSettings(backend="twoshot", precision="fp32"))
    assert built.system == "Fixture system text of the twoshot backend."
    assert built.user.startswith("Fixture statement: write fixture two-example kernels for the code below.\n\n"
                                 "Fixture: several examples of fixture two-example kernels.\n\n\nFirst\n")
    assert "\n\nExample 2\nBefore:\n" in built.user  # an example without a label is numbered
    assert "Fixture precision: fixture float32." in built.user
    assert built.user.endswith("save it as solutions_twoshot_fp32_h100_8_openai_m/1_all_reduce_twoshot.py.")


def test_agent_task_wraps_the_body_with_the_check_command() -> None:
    rel = "solutions_cuda/1_all_reduce_cuda.py"
    built = pkb.agent_prompt(CHECKOUT, REFERENCE, "1_all_reduce", root="/scratch", eval_command=f"pkb-check {rel}")
    assert built.system == "Fixture agent system text for {backend} (braces stay as they are)."
    assert built.user == (f"Fixture task in /scratch: write {rel} (cuda); the reference is reference/1_all_reduce.py."
                          f"\n\nFixture check: run pkb-check {rel} on {rel} (dry run: (fixture: no dry run)).\n\n"
                          + _expected_body(True, rel))
    assert built.record["reference_path"] == "reference/1_all_reduce.py" and built.record["solution_path"] == rel


@pytest.mark.parametrize(("reply", "code"), [
    ("plan\n```python\nA = 1\n```\nmore\n```python\nB = 2\n```", "A = 1"),  # the first block, not the last
    ("```\nuntagged = 1\n```\n```cuda\nx\n```", "untagged = 1"),
    ("```cuda\n__global__ void k() {}\n```\n```python\nP = 1\n```", "P = 1"),
    ("  just text, no block  ", "just text, no block"),  # PKB writes the whole reply as the file
    ("```python\n\n   spaced = 1   \n\n```", "spaced = 1"),
])
def test_first_block_rule(reply: str, code: str) -> None:
    assert pkb.first_block(reply) == code
    assert extract({"extraction": pkb.PKB_RULE}, reply) == code + "\n"


def test_the_two_rules_take_different_blocks() -> None:
    reply = "```python\nfirst = 1\n```\n```python\nlast = 2\n```"
    assert extract({"extraction": pkb.PKB_RULE}, reply) == "first = 1\n"
    assert extract({"extraction": "pkb-agent:last-python-block"}, reply) == "last = 2\n"
    assert extract({"extraction": pkb.PKB_RULE}, "   ") is None


def test_bad_checkouts_and_settings_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(pkb.PkbPromptError, match="no kernelgen/prompts.toml"):
        pkb.load_templates(tmp_path)
    copy = tmp_path / "co"
    shutil.copytree(CHECKOUT, copy)
    with pytest.raises(pkb.PkbPromptError, match="no hardware profile 'b200_72'"):
        pkb.zero_shot_prompt(copy, REFERENCE, "1_all_reduce", provider="openai", model="m",
                             settings=pkb.PkbSettings(hardware="b200_72"))
    (copy / "kernelgen" / "generate_kernel.py").write_text("x = 1\n")
    with pytest.raises(pkb.PkbPromptError, match="no SYSTEM_PROMPT"):
        pkb.generator_facts(copy)


def test_the_prompt_choice_of_a_run() -> None:
    assert parse_prompt(None, None).name == "pkb-agent"
    with pytest.raises(PromptChoiceError, match="give --prompt pkb:CHECKOUT or --source"):
        parse_prompt("pkb", None)
    choice = parse_prompt("pkb", f"pkb:{CHECKOUT}")
    assert choice.name == PKB and choice.checkout == str(CHECKOUT.resolve()) and choice.hardware == "h100_8"
    assert parse_prompt(f"pkb:{CHECKOUT}", None, "none").hardware is None
    with pytest.raises(PromptChoiceError, match="applies to zero-shot and bash"):
        check_conditions(choice, [parse_condition("agent:check")])
    check_conditions(choice, [parse_condition("zero-shot"), parse_condition("bash")])
    with pytest.raises(PromptChoiceError, match="unknown --prompt"):
        parse_prompt("kernelbench", None)


@pytest.mark.skipif(importlib.util.find_spec("toml") is None, reason="PKB's generator needs the toml package")
def test_identity_benchmark_runs_the_checkouts_own_generator(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "pkb_prompt_identity.py"), str(CHECKOUT),
                           "--problems", "1_all_reduce", "--model", "fixture-model", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "identity.json").read_text())
    assert summary["identical"] == summary["compared"] == 8
