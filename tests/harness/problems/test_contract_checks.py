"""The input checks catch constant, rank-identical, trial-identical and irreproducible inputs."""

from __future__ import annotations

from harness.problems.contract_checks import input_issues
from harness.problems.problem import load_problem
from tests.registry_support import GOOD, write


def test_good_inputs_pass(tmp_path):
    assert input_issues(load_problem(write(tmp_path, GOOD)), "small", 2) == []


def test_constant_inputs_are_caught(tmp_path):
    text = GOOD.replace('torch.randn(shape["n"], generator=generator, device=device)', 'torch.ones(shape["n"])')
    issues = input_issues(load_problem(write(tmp_path, text)), "small", 2)
    assert any("constant tensor" in i for i in issues)
    assert any("every rank gets identical inputs" in i for i in issues)
    assert any("identical across trials" in i for i in issues)


def test_unseeded_randomness_is_caught(tmp_path):
    text = GOOD.replace("generator=generator, device=device", "device=device")
    issues = input_issues(load_problem(write(tmp_path, text)), "small", 2)
    assert any("not reproducible" in i for i in issues)
