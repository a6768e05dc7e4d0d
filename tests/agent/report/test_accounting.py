"""Issue 44: every asked problem is accounted for (an arm whose problem was not judged is incomplete, names it and
shows both denominators; comparisons drop what one arm did not judge, and say so), and what was not measured is
never shown as 0 (emulated and untimed runs)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from agent import cli
from agent.report import accounting
from agent.report.build import build
from agent.report.figures import draw_all
from agent.report.html import to_html
from agent.report.markdown import to_markdown
from agent.report.paper import to_latex
from agent.report.run_reader import read_run
from agent.report.summary import run_summary
from harness.common import failures
from tests.report_support import (
    MULTICAST_FAILURE,
    OUTCOMES,
    SANDBOX_FAILURE,
    html_rows,
    make_run,
    md_rows,
)

INFRA = ("infra_error", None, None)
# zero-shot's all_gather never judged: the sandbox failed to start for each of its three samples
BROKEN = {**OUTCOMES, "zero-shot": {**OUTCOMES["zero-shot"], "all_gather": [INFRA, INFRA, INFRA]}}
LEFT_OUT = "all_gather (no sample judged: 3 infra_error (sandbox failed to start))"
HEADLINE = "| condition | problems | samples | pass@1 |"


def export(capsys: pytest.CaptureFixture[str], run: Path) -> list[dict]:
    capsys.readouterr()
    assert cli.main(["export", str(run)]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


# -- every problem accounted for ------------------------------------------------------------------------
def test_an_arm_whose_problem_was_never_judged_is_incomplete_until_it_is(tmp_path: Path):
    run = make_run(tmp_path, "run-a", BROKEN, failures={"infra_error": SANDBOX_FAILURE})
    rep = build([read_run(run)])
    arms = {a["condition"]: a for a in rep.data["arms"]}
    zero, agent = arms["zero-shot"], arms["agent:check+compile"]
    assert rep.data["complete"] is False and zero["complete"] is False and agent["complete"] is True
    assert zero["accounting"]["asked"] == 3 and zero["accounting"]["judged_problems"] == ["all_reduce",
                                                                                         "ulysses_all_to_all"]
    (left,) = zero["accounting"]["excluded"]
    assert (left["problem"], left["infra_error"]) == ("all_gather", 3)
    assert left["infra_causes"] == ["sandbox failed to start"]
    # both denominators: over the 2 judged problems (1/3 each), and over the 3 asked (all_gather counted unsolved)
    assert zero["problems"] == 2 and zero["pass_at_1"]["mean"] == pytest.approx(1 / 3)
    assert zero["over_asked"]["problems"] == 3 and zero["over_asked"]["pass_at_1"]["mean"] == pytest.approx(2 / 9)
    line = (f"zero-shot: 2 of 3 asked problems judged; left out: {LEFT_OUT}; "
            "3 infra_error sample(s) not judged again yet")
    assert rep.data["incomplete"] == [line]

    text = to_markdown(rep)
    assert text.splitlines()[0] == "# pkb-agent report (1 run) — incomplete"
    assert f"**Incomplete.** {line}." in text
    rows = {r[0]: r for r in md_rows(text, HEADLINE)}
    assert rows["zero-shot"][1:4] == ["2 of 3 asked", "9/9", "0.33 [0.33, 0.33]"]
    assert rows["zero-shot, over all asked"][1:4] == ["3 asked", "9 asked", "0.22 [0.00, 0.33]"]
    assert rows["agent:check+compile"][1] == "3" and "agent:check+compile, over all asked" not in rows
    (per_problem,) = [r for r in md_rows(text, "| problem | category |") if r[0] == "all_gather"]
    assert per_problem[2] == "not judged: no sample judged: 3 infra_error (sandbox failed to start)"
    data = json.loads(_json(rep))
    assert data["complete"] is False and data["arms"][0]["excluded_problems"] == ["all_gather"]
    assert data["arms"][0]["over_asked"]["pass_at_1"]["mean"] == pytest.approx(2 / 9)

    page = to_html(rep)
    assert "<h1>pkb-agent report — incomplete</h1>" in page
    assert re.search(r'<p class="incomplete"><strong>Incomplete\.</strong> zero-shot: 2 of 3 asked problems judged; '
                     r"left out: all_gather \(no sample judged: 3 infra_error \(sandbox failed to start\)\)", page)
    html_head = {r[0]: r for r in html_rows(page, "headline-table")}
    assert html_head["zero-shot"][1] == "2 of 3 asked" and html_head["zero-shot, over all asked"][1] == "3 asked"
    tex = to_latex(rep)
    assert "% INCOMPLETE: zero-shot: 2 of 3 asked problems judged" in tex
    assert r"Incomplete: zero-shot: 2 of 3 asked problems judged; left out: all\_gather" in tex
    assert r"zero-shot, over all asked & 3 asked & 0.67" in tex  # pass@3 over the 3 asked: (1 + 0 + 1) / 3

    # the export says which sample failed how; the end of `pkb run` says the same as the report's headline
    assert run_summary(run) == [f"Incomplete: {line}"]

    # --resume judged them (the infra samples replaced by judged ones): the problem counts, the note is gone
    make_run(tmp_path, "run-a", OUTCOMES)
    again = build([read_run(run)])
    zero = next(a for a in again.data["arms"] if a["condition"] == "zero-shot")
    assert again.data["complete"] is True and again.data["incomplete"] == [] and zero["problems"] == 3
    assert zero["accounting"]["excluded"] == [] and "all_gather" in zero["accounting"]["judged_problems"]
    for rendered in (to_markdown(again), to_html(again).split("</style>", 1)[1], to_latex(again)):
        assert "Incomplete" not in rendered and "incomplete" not in rendered and "over all asked" not in rendered
    assert run_summary(run) == []


def test_an_asked_problem_without_any_sample_and_an_unfinished_one_are_named(tmp_path: Path):
    run = make_run(tmp_path)
    shutil.rmtree(run / "samples" / "all_gather" / "zero-shot")  # never started
    sample = run / "samples" / "ulysses_all_to_all" / "zero-shot" / "2" / "sample.json"
    sample.write_text(json.dumps({**json.loads(sample.read_text()), "status": "running"}))  # a provider outage
    rep = build([read_run(run)], k=3)
    zero = next(a for a in rep.data["arms"] if a["condition"] == "zero-shot")
    reasons = {e["problem"]: e["reason"] for e in zero["accounting"]["excluded"]}
    assert reasons == {"all_gather": "no sample judged: 3 not started",
                       "ulysses_all_to_all": "2 of 3 samples judged, pass@3 needs 3: 1 unfinished"}
    assert zero["problems"] == 1 and zero["over_asked"]["problems"] == 3
    # per-problem table: the problem with no sample still has its row, saying why
    rows = {r[0]: r for r in md_rows(to_markdown(rep), "| problem | category |")}
    assert rows["all_gather"][2] == "not judged: no sample judged: 3 not started"


def test_the_export_names_the_failure_and_the_infra_cause_and_every_asked_sample(tmp_path: Path, capsys):
    hostile = "\x1b[2J\x1b]0;owned\x07boom \u202eevil\r\nsecond line"
    outcomes = {**OUTCOMES, "zero-shot": {**OUTCOMES["zero-shot"],
                                          "all_gather": [INFRA, ("runtime_error", None, None), INFRA]}}
    run = make_run(tmp_path, outcomes=outcomes, failures={"infra_error": MULTICAST_FAILURE,
                                                         "runtime_error": {"verdict": "runtime_error",
                                                                           "message": hostile}})
    shutil.rmtree(run / "samples" / "all_reduce" / "agent:check+compile" / "2")
    lines = {(r["condition"], r["problem"], r["sample"]): r for r in export(capsys, run)}
    assert len(lines) == 18  # the sample never started has its line too
    infra = lines[("zero-shot", "all_gather", 0)]
    assert (infra["failure_class"], infra["infra_cause"]) == ("infra_error", "multicast (refused)")
    assert infra["message"].startswith("not available in emulation: cuMulticastCreate")
    wrong = lines[("zero-shot", "all_reduce", 1)]  # compile_error: no failure recorded, no message
    assert (wrong["failure_class"], wrong["infra_cause"], wrong["message"]) == ("compile_error", None, None)
    assert lines[("zero-shot", "all_reduce", 0)]["failure_class"] == "correct"
    hostile_line = lines[("zero-shot", "all_gather", 1)]  # the failure's first line, without escapes or controls
    assert (hostile_line["failure_class"], hostile_line["infra_cause"]) == ("runtime_error", None)
    assert hostile_line["message"] == "boom evil"
    crashed = lines[("agent:check+compile", "all_reduce", 1)]
    assert crashed["failure_class"] == "correct" and crashed["message"] is None
    missing = lines[("agent:check+compile", "all_reduce", 2)]
    assert (missing["status"], missing["failure_class"], missing["verdict"]) == ("not_started", "not_started", None)
    assert set(missing) == set(infra)  # the same columns on every line


def test_the_failure_message_is_one_clean_line():
    hostile = "\x1b[2J\x1b]0;owned\x07boom \u202eevil\x00\r\nsecond line"
    record = {"verdict": "runtime_error", "correct": False, "status": "finished"}
    assert accounting.failure_message(record, {"failure": {"message": hostile}}) == "boom evil"
    assert accounting.clean_line("x" * 500).endswith("…") and len(accounting.clean_line("x" * 500)) == 240


@pytest.mark.parametrize(("failure", "cause"), [
    (MULTICAST_FAILURE, "multicast (refused)"),
    (SANDBOX_FAILURE, "sandbox failed to start"),
    ({"infra_cause": "environment", "message": "the candidate needs CUDA (line 3: import cupy), and this evaluation "
                                               "runs on CPU"}, failures.NEEDS_CUDA_LABEL),
    ({"infra_cause": "environment", "message": "the reference needs the package triton, which is not installed "
                                               "here (line 1: import triton)"}, "needs package triton"),
    ({"infra_cause": "executor", "message": "Ray worker died"}, "executor lost the evaluation"),
    ({"message": "odd\x1b[31m thing"}, "odd thing"),
    (None, "cause not recorded"),
])
def test_infra_causes_are_short(failure: dict | None, cause: str):
    record = {"verdict": "infra_error"}
    assert accounting.infra_cause(record, {"failure": failure} if failure else None) == cause
    assert accounting.infra_cause({"verdict": "runtime_error"}, {"failure": failure}) is None


# -- comparisons: only problems judged in both arms --------------------------------------------------------
def test_a_problem_judged_in_one_arm_only_is_dropped_from_the_comparison_counted_and_named(tmp_path: Path):
    a = make_run(tmp_path, "run-a", {"zero-shot": OUTCOMES["zero-shot"]})
    b = make_run(tmp_path, "run-b", {"zero-shot": BROKEN["zero-shot"]}, failures={"infra_error": SANDBOX_FAILURE})
    rep = build([read_run(a), read_run(b)])
    (c,) = rep.data["comparisons"]
    assert (c["baseline"], c["treatment"], c["shared_problems"]) == ("run-a/zero-shot", "run-b/zero-shot", 2)
    assert c["dropped"] == [{"problem": "all_gather",
                             "reason": "not judged in run-b/zero-shot (no sample judged: 3 infra_error (sandbox "
                                       "failed to start))"}]
    m = c["metrics"]
    assert m["pass_at_k"]["n"] == 2 and m["pass_at_k"]["problems"] == ["all_reduce", "ulysses_all_to_all"]
    assert m["pass_at_k"]["mean"] == 0.0  # the same outcomes on the shared problems
    note = "run-b/zero-shot vs run-a/zero-shot: compared on the 2 problem(s) judged in both; 1 dropped (all_gather)"
    assert note in rep.data["notes"]
    text = to_markdown(rep)
    (row,) = md_rows(text, "| treatment vs baseline |")
    assert row[2] == "2 (1 dropped)" and f"Note: {note}." in text
    (pair,) = md_rows(text, "| comparison |")
    assert pair[1] == "2 (1 dropped)"
    assert "2 (1 dropped)" in to_latex(rep) and "1 dropped (all_gather)" in to_html(rep)


# -- not measured is not zero ------------------------------------------------------------------------------
FAST_TITLES = ("fast_1@3", "fast_1.5@3")


def _assert_no_zero_speed(rep, reason: str, capsys, run: Path) -> None:
    cell = f"— (not measured: {reason})"
    data = rep.data
    for arm in data["arms"]:
        assert arm["fast_1_at_k"]["not_measured"] == reason and arm["geomean_speedup"] is None
        assert all(v != v for _, v in arm["fast_p_curve"])  # NaN (null in JSON), never 0
        assert arm["pass_at_k"]["mean"] > 0  # correctness still counts
    assert all(arm_json["fast_1_at_k"]["mean"] is None for arm_json in json.loads(_json(rep))["arms"])
    for key in ("fast_1_at_k", "fast_1_5_at_k", "speedup_ratio"):
        assert data["comparisons"][0]["metrics"][key]["not_measured"] == reason

    text = to_markdown(rep, {stem: f"f/{stem}.png" for stem, png in draw_all(rep).items() if png is not None})
    head = next(line for line in text.splitlines() if line.startswith(HEADLINE))
    titles = [h.strip() for h in head.strip("|").split("|")]
    for row in md_rows(text, HEADLINE):
        assert [row[titles.index(t)] for t in (*FAST_TITLES, "geomean speedup")] == [cell, cell, cell]
    for row in md_rows(text, "| p |"):
        assert row[1:] == ["—", "—"]
    assert f"zero-shot: {cell}" in text  # the curve table's column says why it is empty
    for row in md_rows(text, "| category |"):
        assert row[3:] == [cell, cell]
    for row in md_rows(text, "| arm | problems |"):
        assert row[3:5] == [cell, cell]
    for row in md_rows(text, "| comparison |"):
        assert row[4] == cell and row[6] == cell
    for row in md_rows(text, "| treatment vs baseline |"):  # Δfast_1@3, Δfast_1.5@3, the speedup ratio; no p-value
        assert [row[6], row[7], row[8], row[9], row[10]] == [cell, "—", cell, cell, "—"]
    assert "![fast_p curve](f/fast_p.png)" in text  # drawn, saying "not measured", not a line of zeros
    assert re.search(r"fast_p, speedups and their geometric mean were not measured", text)

    page = to_html(rep)
    for row in html_rows(page, "headline-table"):
        assert row[5:8] == [cell, cell, cell]
    assert all(row[1:] == ["—", "—"] for row in html_rows(page, "fast-p-table"))
    tex = to_latex(rep)
    tex_cell = "-- (not measured: " + reason.replace("--", "-{}-")  # the dash as LaTeX's en dash; the option kept
    arm_rows = [line for line in tex.splitlines() if line.startswith(("zero-shot &", "agent:check+compile &"))]
    assert len(arm_rows) == 2 and all(line.count(tex_cell) == 2 and "0.00" not in line.split("&")[3]
                                      for line in arm_rows)

    lines = export(capsys, run)
    correct = [r for r in lines if r["correct"]]
    assert correct and all(r["fast_1"] is None and r["speed_note"] == reason and r["counted_speedup"] is None
                           for r in correct)
    assert all(r["fast_1"] is False for r in lines if r["correct"] is False)  # a wrong sample is never fast


def _json(rep) -> str:
    from agent.report.build import to_json

    return to_json(rep)


def test_an_emulated_run_shows_no_zero_for_what_it_never_measured(tmp_path: Path, capsys):
    run = make_run(tmp_path, device="cuda", ranks_per_gpu=2)
    rep = build([read_run(run)])
    _assert_no_zero_speed(rep, accounting.EMULATED_REASON, capsys, run)
    assert run_summary(run) == [f"{c}: fast_p and speedups not measured (emulated: ranks shared a GPU)"
                                for c in OUTCOMES]


def test_an_untimed_run_shows_no_zero_for_what_it_never_measured(tmp_path: Path, capsys):
    untimed = {c: {p: [(v, None, r) for v, _, r in rows] for p, rows in by.items()} for c, by in OUTCOMES.items()}
    run = make_run(tmp_path, outcomes=untimed, device="cuda", skip_timing=True)
    rep = build([read_run(run)])
    _assert_no_zero_speed(rep, accounting.UNTIMED_REASON, capsys, run)


def test_a_measured_run_keeps_its_zeros(tmp_path: Path):
    """A real 0 stays 0: an arm timed on GPUs whose correct samples are all slower than the reference."""
    slow = {"zero-shot": {p: [(v, 0.5 if v == "correct" else None, r) for v, _, r in rows]
                          for p, rows in OUTCOMES["zero-shot"].items()}}
    rep = build([read_run(make_run(tmp_path, outcomes=slow, device="cuda"))])
    (arm,) = rep.data["arms"]
    assert arm["speed"] == {"measured": True, "not_measured": None} and arm["fast_1_at_k"]["mean"] == 0.0
    assert "not measured" not in to_markdown(rep)


def test_a_replayed_set_names_the_files_the_machine_could_not_judge(tmp_path: Path):
    """The issue's case: a recorded set replayed on one GPU, some files refused (multicast): `problems 18` with no
    word on the other 6 became `18 of 24 asked`, each left-out problem named with its cause."""
    replayed = {"replay": {"all_reduce": [("correct", 1.3, None)], "all_gather": [INFRA],
                           "ulysses_all_to_all": [("output_mismatch", None, None)]}}
    run = make_run(tmp_path, outcomes=replayed, samples=None, failures={"infra_error": MULTICAST_FAILURE},
                   device="cuda")
    rep = build([read_run(run)])
    (arm,) = rep.data["arms"]
    assert rep.k == 1 and arm["problems"] == 2 and arm["over_asked"]["problems"] == 3
    assert arm["pass_at_1"]["mean"] == 0.5 and arm["over_asked"]["pass_at_1"]["mean"] == pytest.approx(1 / 3)
    assert rep.data["incomplete"] == ["replay: 2 of 3 asked problems judged; left out: all_gather (no sample judged: "
                                      "1 infra_error (multicast (refused))); 1 infra_error sample(s) not judged "
                                      "again yet"]
    (row,) = [r for r in md_rows(to_markdown(rep), HEADLINE) if r[0] == "replay"]
    assert row[1] == "2 of 3 asked"
