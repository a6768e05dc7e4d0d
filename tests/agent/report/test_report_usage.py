"""`pkb report`: unknown dollars and tokens are shown as unknown (never $0), notes on what is not comparable,
run labels, and k for runs without a fixed sample count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import cli
from agent.report.build import build
from agent.report.html import to_html
from agent.report.markdown import to_markdown
from agent.report.run_reader import read_run
from harness.common.flags import CPU_TIMING_NOTE
from tests.report_support import OUTCOMES, html_rows, make_run, md_rows

HEADLINE = "| condition | problems | samples |"
COST, TOKENS, GPU = 8, 9, 11  # columns of the headline table


def report_json(capsys, *runs: Path | str) -> dict:
    capsys.readouterr()
    assert cli.main(["report", *map(str, runs), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_unknown_cost_is_na_in_markdown_html_and_json(tmp_path: Path, capsys):
    """A model missing from the price table (cost_known false, cost_usd 0.0 in sample.json) costs n/a."""
    run = make_run(tmp_path, usage={"zero-shot": {"cost_usd": 0.0, "cost_known": False}})
    data = report_json(capsys, run)
    usage = {a["condition"]: a["usage"] for a in data["arms"]}
    assert usage["zero-shot"]["cost_usd"] is None and usage["zero-shot"]["cost_known"] is False
    assert usage["agent:check+compile"]["cost_usd"] == pytest.approx(0.09)
    assert usage["agent:check+compile"]["cost_known"] is True

    rep = build([read_run(run)])
    md = {r[0]: r for r in md_rows(to_markdown(rep), HEADLINE)}
    assert md["zero-shot"][COST] == "n/a" and md["agent:check+compile"][COST] == "$0.0900"
    page = to_html(rep)
    rows = {r[0]: r for r in html_rows(page, "headline-table")}
    assert rows["zero-shot"][COST] == "n/a" and rows["agent:check+compile"][COST] == "$0.0900"
    # each sample's line in the transcripts: 9 unknown, 9 at a cent
    assert page.count("cost n/a") == 9 and page.count("cost $0.0100") == 9 and "$0.0000" not in page

    # one unpriced sample makes its condition's total unknown
    sample = run / "samples" / "all_gather" / "agent:check+compile" / "2" / "sample.json"
    record = json.loads(sample.read_text())
    record["usage"].update(cost_usd=0.0, cost_known=False)
    sample.write_text(json.dumps(record))
    data = report_json(capsys, run)
    assert [a["usage"]["cost_usd"] for a in data["arms"]] == [None, None]


def test_replayed_code_has_no_known_cost_or_tokens(tmp_path: Path, capsys):
    """replay scores files made elsewhere: their tokens and dollars are not in the run (not zero)."""
    run = make_run(tmp_path, "replayed", {"replay": OUTCOMES["zero-shot"]},
                   usage={"replay": {"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "cost_known": True}})
    data = report_json(capsys, run)
    (arm,) = data["arms"]
    assert arm["usage"]["cost_usd"] is None and arm["usage"]["cost_known"] is False
    assert arm["usage"]["usage_reported"] is False and arm["usage"]["tokens"] == 0
    rep = build([read_run(run)])
    (row,) = md_rows(to_markdown(rep), HEADLINE)
    assert row[COST] == row[TOKENS] == "n/a"
    # one rule for the same run everywhere (issue 46): the compact table and every sample say n/a too, never 0
    (arm_row,) = md_rows(to_markdown(rep), "| arm | problems |")
    assert arm_row[6:8] == ["n/a", "n/a"] and data["arms"][0]["per_solved"]["tokens"] is None
    page = to_html(rep)
    assert page.count("tokens n/a") == 9 and "tokens 0 in" not in page


def test_tokens_a_provider_did_not_report_are_a_lower_bound(tmp_path: Path):
    run = make_run(tmp_path, usage={"zero-shot": {"usage_reported": False}})
    rows = {r[0]: r for r in md_rows(to_markdown(build([read_run(run)])), HEADLINE)}
    assert rows["zero-shot"][TOKENS] == "≥13.5k"  # 9 samples of 1,500 counted tokens, some replies uncounted
    assert rows["agent:check+compile"][TOKENS] == "35.1k"  # 9 x (3,600 + 300)
    arms = {r[0]: r for r in md_rows(to_markdown(build([read_run(run)])), "| arm | problems |")}
    assert arms["zero-shot"][7] == "≥6.8k" and arms["agent:check+compile"][7] == "11.7k"  # per solved, same rule


def test_gpu_seconds_only_for_gpu_runs(tmp_path: Path):
    cpu = make_run(tmp_path, "cpu-run")
    gpu = make_run(tmp_path, "gpu-run", device="cuda")
    # runs on other devices are compared only when forced (their manifests differ in the device)
    rows = {r[0]: r for r in md_rows(to_markdown(build([read_run(cpu), read_run(gpu)], force=True)), HEADLINE)}
    assert rows["cpu-run/zero-shot"][GPU] == "n/a (cpu)"
    assert rows["gpu-run/zero-shot"][GPU] == "4.5 s"  # 9 samples of 0.5 s
    assert rows["gpu-run/agent:check+compile"][GPU] == "18 s"


def test_notes_on_what_is_not_comparable(tmp_path: Path, capsys):
    a = make_run(tmp_path, "run-a")
    b = make_run(tmp_path, "run-b", {"zero-shot": OUTCOMES["zero-shot"]}, device="cuda", world_size=4)
    header = json.loads((b / "run.json").read_text())  # run-b was asked for an agent condition too
    header["config"]["conditions"] = ["zero-shot", "agent:bench"]
    (b / "run.json").write_text(json.dumps(header))
    capsys.readouterr()
    assert cli.main(["report", str(a), str(b)]) == 2  # refused: the manifests differ in device and world size
    assert "differ in device, world_size besides the compared run" in capsys.readouterr().err
    data = report_json(capsys, a, b, "--force")
    assert data["notes"][:4] == [
        "the runs differ in device (run-a: cpu, run-b: cuda): their speedups and costs are not comparable",
        "the runs differ in world size (run-a: 2, run-b: 4): their speedups and costs are not comparable",
        f"run run-a ran on CPU: {CPU_TIMING_NOTE}; its fast_p and speedups show that the pipeline works, not how "
        "fast a kernel is",  # run-b ran on CUDA: no such note
        "run run-b: no sample yet for agent:bench",
    ]
    assert "marked †" in data["notes"][4]
    rep = build([read_run(a), read_run(b)], force=True)
    assert "Note: run run-b: no sample yet for agent:bench." in to_markdown(rep)
    assert '<p class="note">Note: the runs differ in device (run-a: cpu, run-b: cuda)' in to_html(rep)
    assert [n for n in build([read_run(a), read_run(make_run(tmp_path, "run-c"))]).data["notes"]
            if CPU_TIMING_NOTE not in n] == []  # two CPU runs alike: nothing but what CPU timings are


def test_runs_sharing_a_run_id_get_distinct_labels(tmp_path: Path):
    first = make_run(tmp_path / "machine-1", "nightly")
    second = make_run(tmp_path / "machine-2", "nightly", {"zero-shot": OUTCOMES["agent:check+compile"]})
    rep = build([read_run(first), read_run(second)])
    assert [a["label"] for a in rep.data["arms"]] == [
        "machine-1/nightly/zero-shot", "machine-1/nightly/agent:check+compile", "machine-2/nightly/zero-shot"]
    assert rep.data["comparisons"][-1]["treatment"] == "machine-2/nightly/zero-shot"


def test_k_of_a_run_without_a_fixed_sample_count_keeps_every_problem(tmp_path: Path):
    """A replay run scores every file: problems have different sample counts; k is the fewest, so none is
    left out of pass@k."""
    outcomes = {"replay": {"all_reduce": OUTCOMES["zero-shot"]["all_reduce"],
                           "all_gather": OUTCOMES["agent:check+compile"]["all_gather"][:1],
                           "ulysses_all_to_all": OUTCOMES["zero-shot"]["ulysses_all_to_all"][:2]}}
    run = make_run(tmp_path, "replayed", outcomes, samples=None)
    rep = build([read_run(run)])
    (arm,) = rep.data["arms"]
    assert rep.k == 1 and arm["excluded_problems"] == [] and arm["problems"] == 3
    assert arm["pass_at_1"]["mean"] == pytest.approx((1 / 3 + 1 + 1 / 2) / 3)
    assert build([read_run(run)], k=2).data["arms"][0]["excluded_problems"] == ["all_gather"]


def test_speedups_an_integrity_flag_disqualifies_are_said_not_to_count(tmp_path: Path, capsys):
    """A correct sample flagged uses_torch_collectives keeps its measured speedup in sample.json, but it is not
    fast: the report leaves it out of fast_p and the speedup figures and says so, with the flag."""
    run = make_run(tmp_path)
    for k in (0, 1):  # the agent's 1.6x and 1.3x on all_reduce
        sample = run / "samples" / "all_reduce" / "agent:check+compile" / str(k) / "sample.json"
        record = json.loads(sample.read_text())
        sample.write_text(json.dumps({**record, "flags": ["uses_torch_collectives", "spawned_threads"]}))
    data = report_json(capsys, run)
    agent = {a["condition"]: a for a in data["arms"]}["agent:check+compile"]
    assert agent["speedups_not_counted"] == {"samples": 2, "flags": {"uses_torch_collectives": 2}}
    assert sorted(agent["speedups"]) == [0.9, 1.1, 1.4, 1.9, 2.4]
    assert agent["pass_at_k"]["mean"] == 1.0  # still correct
    assert agent["fast_1_5_at_k"]["mean"] == pytest.approx(1 / 3)  # only ulysses' 2.4x/1.9x now
    assert [n for n in data["notes"] if CPU_TIMING_NOTE not in n] == [
        "agent:check+compile: the speedups of 2 correct sample(s) do not count toward fast_p or the speedup figures "
        "(uses_torch_collectives ×2)"]
    page = to_html(build([read_run(run)]))
    assert page.count("x (not counted)") == 2 and "1.60x (not counted)" in page
