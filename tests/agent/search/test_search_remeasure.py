"""The search's final re-measurement and `pkb rescore` (agent.remeasure, one function for both): the winner is
the best by re-measured median, never the luckiest in-search draw; each re-measurement is k fresh evaluations
on fresh seeds, on the visible and the held-out shapes; both paths call the same function and keep records of
the same shape; and a real search on CPU prints both figures per problem."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from agent import remeasure
from agent.cli import main
from agent.executors.local import LocalExecutor
from agent.remeasure import CPU, EMULATED, NOT_MEASURED, Remeasurement, Round, agree, median_interval
from agent.rescore import RESCORED_FILE, RescoreSummary, rescore_sample
from agent.runner import RunConfig
from agent.search import report
from agent.search.archive import Archive, Candidate, Rescore
from agent.search.config import Limits, SearchConfig, StrategyConfig
from agent.search.layout import SearchDir, create
from agent.search.loop import Search
from agent.search.rescore import rescore_search
from agent.search.scoring import CLI_REMEASURE, SEARCH_REMEASURE, remeasure_seeds
from agent.search.summary import figures_line, problem_rows, reported_best
from harness.problems.problem import Problem, load_problem
from harness.problems.registry import SUITE_ROOT
from harness.records.results import EvalResult
from tests import search_fakes

PROBLEMS = ["all_reduce", "all_gather"]
HELD_OUT = "held-out:small"


@pytest.fixture(scope="module")
def suite() -> list[Problem]:
    return [load_problem(SUITE_ROOT / "collective" / f"{name}.py") for name in PROBLEMS]


class Recorder:
    """search_fakes.evaluate, keeping (shape, seed, skip_timing, use_reference_cache) of every call; `scale`
    multiplies the speedup of a source on seeds other than `search_seed` (a kernel that was lucky in the search)."""

    def __init__(self, search_seed: int = 0, scale: dict[str, float] | None = None) -> None:
        self.calls: list[tuple[str, int, bool, bool]] = []
        self.search_seed = search_seed
        self.scale = scale or {}
        self.lock = threading.Lock()

    def __call__(self, problem: Problem, path: Path, **kw: Any) -> EvalResult:
        config = kw["config"]
        with self.lock:
            self.calls.append((kw["shape"], config.seed, config.skip_timing, config.use_reference_cache))
        result = search_fakes.evaluate(problem, path, **kw)
        factor = self.scale.get(Path(path).read_text())
        if factor is not None and config.seed != self.search_seed and result.speedup is not None:
            result = result.model_copy(update={"speedup": result.speedup * factor})
        return result


def make(tmp_path: Path, suite: list[Problem], name: str, evaluate: Any, **fields: Any) -> tuple[Search, SearchDir]:
    fields.setdefault("budget", Limits(candidates=16))
    config = SearchConfig(model="scripted:mutator", problems=PROBLEMS, strategy=StrategyConfig(name="best_first"),
                          **fields)
    directory = SearchDir(tmp_path / name)
    create(directory, config)
    search = Search(directory, config, suite, executor=LocalExecutor(None), evaluate=evaluate,
                    bound=search_fakes.bound, sleep=lambda s: None)
    return search, directory


# -- (1) the winner is chosen by re-measured figures ---------------------------------------------------------
def _candidate(i: int, speedup: float) -> Candidate:
    return Candidate(id=i, problem="p", seq=i, island=None, parents=[], strategy="best_first", status="evaluated",
                     verdict="correct", correct=True, speedup=speedup, trusted=True, source=f"# {i}")


def _rescore(candidate: int, seed: int, speedup: float) -> Rescore:
    return Rescore("p", candidate, seed, "correct", True, speedup, None, [], True)


def test_the_winner_is_the_best_by_re_measured_median_not_the_luckiest_in_search_draw() -> None:
    lucky, steady = _candidate(1, 5.01), _candidate(2, 3.0)  # in the search: 5.01x against 3.0x
    rows = [_rescore(1, s, x) for s, x in ((11, 1.23), (12, 1.4), (13, 1.3))] \
        + [_rescore(2, s, x) for s, x in ((11, 2.9), (12, 3.1), (13, 2.8))]
    top, failed = reported_best([lucky, steady], rows, 3, "cuda")
    assert top is not None and not failed
    assert top.candidate.id == 2 and top.speedup == pytest.approx(2.9)
    assert top.remeasured is not None and top.remeasured.interval == median_interval([2.9, 3.1, 2.8])
    # ... and with a round short, or a round that failed, the steady one is not confirmed: the lucky one wins
    top, failed = reported_best([lucky, steady], rows[:-1], 3, "cuda")
    assert top is not None and top.candidate.id == 1 and failed == []
    wrong = [*rows[:-1], Rescore("p", 2, 13, "output_mismatch", False, None, None, [], False)]
    top, failed = reported_best([lucky, steady], wrong, 3, "cuda")
    assert top is not None and top.candidate.id == 1 and failed == [2]


def test_a_search_reports_the_kernel_that_is_fast_on_re_measurement(tmp_path: Path, suite: list[Problem]) -> None:
    """The in-search best of each problem was a lucky draw (a third as fast on any fresh seed): the report, the
    terminal's line and the live page name another kernel, the best by re-measured median."""
    first, plain = make(tmp_path, suite, "plain", Recorder(), remeasure=3, remeasure_top=3)
    first.run()
    with Archive(plain.archive) as a:
        tops = {p: max((c for c in a.candidates(p) if c.trusted), key=lambda c: c.speedup or 0) for p in PROBLEMS}
    lucky = Recorder(scale={c.source or "": 1 / 3 for c in tops.values()})
    search, directory = make(tmp_path, suite, "lucky", lucky, remeasure=3, remeasure_top=3)
    search.run()
    built = report.build(directory.path)
    with Archive(directory.archive) as a:
        rows = problem_rows(a, PROBLEMS, 3, "cpu")
    for p, row in zip(built["problems"], rows, strict=True):
        top = tops[p["problem"]]
        assert row.best is not None and row.best.id == top.id  # the same search: the same in-search best
        winner = p["best"]
        assert winner["confirmed"] and winner["candidate"] != top.id
        medians = {m["candidate"]: m["speedup"]["median"] for m in p["remeasured"]}
        assert len(medians) == 3 and top.id in medians
        assert winner["rescored_speedup"] == max(medians.values()) > medians[top.id]
        assert winner["search_speedup"] < top.speedup  # lower in the search, higher re-measured
        line = figures_line(row)
        assert line.startswith(f"{p['problem']}: #{winner['candidate']} in-search ")
        assert f"(the in-search best #{top.id}" in line and "CI of the median, k=3" in line
    live = (directory.path / "live.html")
    assert not live.exists() or "in-search" in live.read_text()
    html = report.to_html(built)
    assert "<th>in-search</th>" in html and "<th>interval</th>" in html and "re-measured" in html


# -- (2) k fresh evaluations, fresh seeds, visible and held-out shapes ---------------------------------------
def test_remeasure_runs_k_fresh_evaluations_on_the_visible_and_held_out_shapes(tmp_path: Path,
                                                                              suite: list[Problem]) -> None:
    config = SearchConfig(model="scripted:mutator", problems=PROBLEMS, budget=Limits(candidates=3), seed=7)
    seeds = remeasure_seeds(config, SEARCH_REMEASURE)
    assert len(seeds) == config.remeasure == 3 and len(set(seeds)) == 3 and config.seed not in seeds
    assert not set(seeds) & set(remeasure_seeds(config, CLI_REMEASURE))  # pkb rescore draws seeds of its own
    path = tmp_path / "k.py"
    path.write_text("def solution(x):\n    return x\n")  # correct for the fake evaluator
    recorder = Recorder(search_seed=config.seed)
    stored: list[tuple[Round, EvalResult]] = []
    measured = remeasure.remeasure(suite[0], path, evaluate=recorder, config=config.eval_config(), seeds=seeds,
                                   world_size=2, device="cpu", shape="small",
                                   on_round=lambda r, result: stored.append((r, result)))
    visible = [c for c in recorder.calls if c[0] == "small"]
    held = [c for c in recorder.calls if c[0] == HELD_OUT]
    assert [c[1] for c in visible] == seeds  # one fresh evaluation per seed, in order
    assert len(held) == 3 and len({c[1] for c in held} | set(seeds)) == 6  # the held-out shape on seeds of its own
    assert all(not c[2] for c in visible) and all(c[2] for c in held)  # timed there, checked here
    assert all(not c[3] for c in recorder.calls)  # never the cached reference: a fresh bench
    assert len(measured.rounds) == len(stored) == 3 and measured.confirmed
    assert all(r.held_out and r.held_out[0]["shape"] == HELD_OUT and r.held_out[0]["correct"] for r in measured.rounds)
    assert measured.timing == CPU and measured.interval is not None and "plumbing only" in measured.text()
    # resumed: the rounds done are kept, only the missing one runs
    recorder.calls.clear()
    again = remeasure.remeasure(suite[0], path, evaluate=recorder, config=config.eval_config(), seeds=seeds,
                                world_size=2, device="cpu", shape="small",
                                done={r.seed: r for r in measured.rounds[:2]})
    assert [c[1] for c in recorder.calls if c[0] == "small"] == seeds[2:] and again.rounds[:2] == measured.rounds[:2]
    assert again.seeds == seeds and again.interval == measured.interval  # the fake's figures: seed and source


def test_the_search_re_measures_its_top_kernels_k_times_on_both_shapes(tmp_path: Path, suite: list[Problem]) -> None:
    recorder = Recorder()
    search, directory = make(tmp_path, suite, "s", recorder, remeasure=4, remeasure_top=2)
    search.run()
    seeds = remeasure_seeds(search.config, SEARCH_REMEASURE)  # what agent.search.final drew
    with Archive(directory.archive) as a:
        rescores = a.rescores()
    per_kernel: dict[tuple[str, int], list[int]] = {}
    for r in rescores:
        per_kernel.setdefault((r.problem, r.candidate), []).append(r.seed)
        assert r.record is not None and r.record["held_out"][0]["shape"] == HELD_OUT
    assert len(per_kernel) == 4 and all(sorted(s) == sorted(seeds) for s in per_kernel.values())
    fresh = [c for c in recorder.calls if c[1] != 0]
    assert sum(c[0] == "small" for c in fresh) == 4 * 4 and sum(c[0] == HELD_OUT for c in fresh) == 4 * 4


def test_an_emulated_or_untimed_re_measurement_has_no_speedup() -> None:
    def round_(timing: str, speedup: float | None) -> Round:
        return Round(seed=1, shape="small", verdict="correct", correct=True, correct_visible=True, held_out=[],
                     timing=timing, speedup=speedup, candidate_ms=None, reference_ms=None, flags=["emulated"],
                     fast_eligible=False, trusted=False)

    measured = Remeasurement(k=1, rounds=[round_(EMULATED, None)])
    assert measured.interval is None and measured.record()["speedup"] is None
    assert measured.text() == "not measured (emulated ranks: checked, no speedup)"
    assert measured.record()["timing"] == EMULATED and not measured.confirmed


def test_the_interval_is_an_order_statistic_interval_of_the_median() -> None:
    three = median_interval([1.3, 1.0, 2.0])
    assert three is not None and (three.median, three.low, three.high) == (1.3, 1.0, 2.0)
    assert three.confidence == pytest.approx(0.75)  # k=3: min-max holds the median 75% of the time
    ten = median_interval([float(x) for x in range(10)])
    assert ten is not None and (ten.low, ten.high) == (1.0, 8.0) and ten.confidence >= 0.9
    assert median_interval([]) is None
    one = median_interval([2.0])
    assert one is not None and one.confidence == 0.0 and "no interval" in one.text()
    assert agree(three, ten) is True and agree(three, median_interval([3.0, 4.0, 5.0])) is False
    assert agree(three, None) is None
    assert NOT_MEASURED in Remeasurement(k=1, rounds=[Round(
        seed=1, shape="s", verdict="correct", correct=True, correct_visible=True, held_out=[], timing="untimed",
        speedup=None, candidate_ms=None, reference_ms=None, flags=[], fast_eligible=True, trusted=True)]).text()


# -- (3) one function for the search, pkb rescore of a search and of a sample run ------------------------------
def test_rescore_and_the_search_call_the_same_function_with_records_of_the_same_shape(
        tmp_path: Path, suite: list[Problem], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[str] = []
    original = remeasure.remeasure

    def spy(*args: Any, **kwargs: Any) -> Remeasurement:
        calls.append(str(args[1]))
        return original(*args, **kwargs)

    monkeypatch.setattr(remeasure, "remeasure", spy)
    search, directory = make(tmp_path, suite, "s", search_fakes.evaluate, remeasure=3, remeasure_top=2)
    search.run()
    from_search = len(calls)
    assert from_search == 2 * 2  # the search's own re-measurement: the top 2 kernels of both problems
    rows = rescore_search(directory, {p.name: p for p in suite}, search_fakes.evaluate)
    assert len(calls) == from_search + 2  # pkb rescore: each problem's reported kernel, through the same function
    for row in rows:
        assert row.search is not None and row.rescore is not None and row.agree is True
        mine, theirs = row.search.record(), row.rescore.record()
        assert set(mine) == set(theirs) and len(mine["rounds"]) == len(theirs["rounds"]) == 3
        assert [set(r) for r in mine["rounds"]] == [set(r) for r in theirs["rounds"]]
        assert not set(mine["seeds"]) & set(theirs["seeds"])  # fresh seeds again
    stored = json.loads(directory.rescored.read_text())
    assert set(stored["problems"]) == set(PROBLEMS)
    assert all(p["rescore"].endswith("agree (intervals overlap)") for p in report.build(directory.path)["problems"])
    # through the CLI: the stored rounds are read back, nothing is measured again
    assert main(["rescore", str(directory.path), "--evaluator", "tests.search_fakes"]) == 0
    assert len(calls) == from_search + 4 and all(c.endswith(".py") for c in calls)
    out = capsys.readouterr().out
    for name in PROBLEMS:
        line = next(x for x in out.splitlines() if x.startswith(f"{name}: #"))
        assert "in-search" in line and "search re-measured" in line and "rescore" in line and "agree" in line

    # a sample run's rescore (agent.rescore) goes through it too, and keeps its record beside the old fields
    folder = tmp_path / "run" / "samples" / "all_reduce" / "zero-shot" / "0"
    (folder / "candidates").mkdir(parents=True)
    source = next(c.source for c in Archive(directory.archive).candidates() if c.trusted)
    (folder / "candidates" / "000.py").write_text(source or "")
    config = RunConfig(model="scripted:x", conditions=["zero-shot"], problems=["all_reduce"])
    rescore_sample(folder, suite[0], config, search_fakes.evaluate, RescoreSummary(), threading.Lock())
    assert len(calls) == from_search + 5
    entry = json.loads((folder / RESCORED_FILE).read_text())["candidates"]["candidates/000.py"]
    assert entry["correct"] and entry["held_out"][0]["shape"] == HELD_OUT and entry["timing"] == CPU
    assert rows[0].rescore is not None and set(entry["remeasured"]) == set(rows[0].rescore.record())


def test_an_archive_from_before_rounds_opens_and_reads(tmp_path: Path) -> None:
    """An archive whose rescores table has no `record` column still opens (the column is added), and its rows
    read as rounds without held-out shapes."""
    import sqlite3

    path = tmp_path / "archive.sqlite"
    with Archive(path):
        pass
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE rescores DROP COLUMN record")
    db.execute("INSERT INTO rescores (problem, candidate, seed, verdict, correct, speedup, flags, trusted) "
               "VALUES ('p', 1, 5, 'correct', 1, 2.5, '[]', 1)")
    db.commit()
    db.close()
    with Archive(path) as a:
        (old,) = a.rescores()
    assert old.record is None and old.speedup == 2.5
    top, _ = reported_best([_candidate(1, 3.0)], [old], 1, "cuda")
    assert top is not None and top.speedup == 2.5 and top.remeasured is not None
    assert top.remeasured.rounds[0].held_out == []


def test_the_settings_and_their_old_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    default = SearchConfig(model="m", problems=["p"], budget=Limits(candidates=1))
    assert (default.remeasure, default.remeasure_top) == (3, 3)
    old = SearchConfig.model_validate({"model": "m", "problems": ["p"], "budget": {"candidates": 1},
                                       "rescore_seeds": 2, "rescore_candidates": 1})  # a search.json of before
    assert (old.remeasure, old.remeasure_top) == (2, 1)
    assert "rescore_seeds" not in old.model_dump() and old.model_dump()["remeasure"] == 2
    assert main(["rescore", str(tmp_path), "--remeasure", "0"]) == 2
    assert main(["rescore", str(tmp_path), "--remeasure", "2"]) == 2  # not a search run
    assert "--remeasure and --evaluator are for a search run" in capsys.readouterr().err


# -- (4) the real offline search on CPU ----------------------------------------------------------------------
@pytest.mark.slow
def test_a_cpu_search_prints_in_search_and_re_measured_figures_and_rescore_agrees(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    runs = tmp_path / "runs"
    assert main(["search", "--model", "scripted:mutator:syntax=0,wrong=0,hang=0,runtime=0,collective=0,no_code=0",
                 "--problems", "all_reduce", "all_gather", "--budget-candidates", "2", "--window", "1",
                 "--trials", "2", "--remeasure", "2", "--remeasure-top", "1", "--phase-timeout", "60",
                 "--runs-dir", str(runs), "--run-id", "cpu", "--no-live"]) == 0
    out = capsys.readouterr().out
    number = r"\d[\d.]*"
    figure = number + "x"
    interval = rf"re-measured {figure} \[{number}-{figure}, 50% CI of the median, k=2\] \(CPU: plumbing only\)"
    lines = {name: [x for x in out.splitlines() if x.startswith(f"{name}: ")] for name in ("all_reduce", "all_gather")}
    assert all(len(found) == 1 for found in lines.values()), out  # one line per problem
    # A CPU shared with other work can flag a timing (timing_inconsistent): that problem's line then says so
    # ("no trusted kernel", "not confirmed (seed ...: flagged ...)"); every confirmed one shows both figures.
    reported = [found[0] for found in lines.values() if "CI of the median" in found[0]]
    assert reported, out
    for line in reported:
        assert re.search(rf": #\d+ in-search {figure}; {interval}", line), line
    with Archive(runs / "cpu" / "archive.sqlite") as a:
        rounds = a.rescores()
    assert len(rounds) >= 2 * len(reported) and all(r.record and r.record["held_out"] for r in rounds if r.correct)
    assert main(["rescore", str(runs / "cpu")]) == 0
    out = capsys.readouterr().out
    for line in reported:
        name = line.split(":")[0]
        again = next(x for x in out.splitlines() if x.startswith(f"{name}: #"))
        assert "search re-measured" in again and re.search(rf"rescore ({figure} \[|not confirmed)", again), out
    stored = json.loads((runs / "cpu" / "rescored.json").read_text())["problems"]
    assert all(stored[line.split(":")[0]]["agree"] is not None for line in reported)
