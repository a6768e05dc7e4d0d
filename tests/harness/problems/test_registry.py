"""Discovering, selecting and refusing problems."""

from __future__ import annotations

import json

import pytest

from agent.cli import main as pkb
from harness.problems.problem import MalformedProblem, load_problem
from harness.problems.registry import UnknownProblem, discover, load_suite, select
from tests.registry_support import GOOD, write


def test_a_well_formed_problem_loads(tmp_path):
    p = load_problem(write(tmp_path, GOOD))
    assert p.name == "toy" and p.world_sizes == (2,) and p.shape("small") == {"n": 4}


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda s: s.replace("def oracle", "def not_oracle"), "missing function oracle()"),
        (lambda s: s.replace('"small": {"n": 4}', '"tiny": {"n": 4}'), "missing the 'small' shape"),
        (lambda s: s.replace('"symbol": "z"', '"symbol": ""'), "missing 'symbol'"),
        (lambda s: s.replace('"summary": "A toy.", ', ""), "missing 'summary'"),
        (lambda s: s.replace('"category": "collective"', '"category": "magic"'), "unknown category"),
        (lambda s: s.replace('"dtype": "float32"', '"dtype": "float33"'), "not a torch dtype"),
        (lambda s: s.replace("PROBLEM = {", "SPEC = {"), "missing PROBLEM"),
        (lambda s: s + "\nthis is not python\n", "cannot import"),
    ],
)
def test_malformed_problem_names_file_and_piece(tmp_path, edit, needle):
    path = write(tmp_path, edit(GOOD))
    with pytest.raises(MalformedProblem) as info:
        load_problem(path)
    assert str(path) in str(info.value)
    assert needle in str(info.value)


def test_name_must_match_file(tmp_path):
    with pytest.raises(MalformedProblem, match="file is named 'other'"):
        load_problem(write(tmp_path, GOOD, name="other"))


def test_discover_keeps_going_past_a_bad_file(tmp_path):
    write(tmp_path, GOOD)
    write(tmp_path, "PROBLEM = 3", name="broken")
    problems, errors = discover(tmp_path)
    assert [p.name for p in problems] == ["toy"]
    assert len(errors) == 1 and "broken.py" in str(errors[0])


def test_selection_by_name_glob_and_category():
    suite = load_suite()
    assert [p.name for p in select(suite, ["all_reduce"])] == ["all_reduce"]
    assert all(p.name.startswith("all_") for p in select(suite, ["all_*"]))
    collectives = select(suite, ["collective"])
    assert collectives and all(p.category == "collective" for p in collectives)
    assert select(suite, ["category:collective"]) == collectives
    assert len(select(suite, None)) == len(suite)
    with pytest.raises(UnknownProblem, match="did you mean"):
        select(suite, ["all_reduse"])


def test_cli_list_json_has_every_field(capsys):
    assert pkb(["problems", "list", "--json", "all_reduce"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["name"] == "all_reduce"
    assert rows[0]["source"]["codebase"] and rows[0]["world_sizes"] == [2, 4, 8]


def test_cli_show_prints_reference_source(capsys):
    assert pkb(["problems", "show", "all_reduce"]) == 0
    out = capsys.readouterr().out
    assert "def solution" in out and "Megatron-LM" in out
