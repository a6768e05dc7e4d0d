"""`pkb report`: markdown, HTML and JSON of a synthetic run directory (exact numbers) and of a real CPU
`pkb run` with a scripted model (also opened in a headless Chromium); bad input."""

from __future__ import annotations

import base64
import html
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from langchain_core.messages import AIMessage

from agent import cli
from agent.report import metrics
from agent.report.build import build
from agent.report.markdown import to_markdown
from agent.report.run_reader import RunFormatError, read_run
from agent.scripted import register_script
from tests.conftest import CANDIDATES
from tests.report_support import HOSTILE, OUTCOMES, html_rows, make_run, md_rows

CONDITIONS = ("zero-shot", "agent:check+compile")






@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return make_run(tmp_path)


def pkb(argv: list[str]) -> int:
    return cli.main(argv)


# -- the report's numbers -----------------------------------------------------------------------------
def test_metrics_of_the_synthetic_run(run_dir: Path):
    rep = build([read_run(run_dir)])
    assert rep.k == 3
    arms = {a["condition"]: a for a in rep.data["arms"]}
    zero, agent = arms["zero-shot"], arms["agent:check+compile"]
    # zero-shot: 2 of 3 problems have a correct sample; pass@1 = mean(1/3, 0, 1/3)
    assert zero["pass_at_k"]["mean"] == pytest.approx(2 / 3)
    assert zero["pass_at_1"]["mean"] == pytest.approx(2 / 9)
    assert zero["fast_1_at_k"]["mean"] == pytest.approx(1 / 3)  # only the 1.2x sample is faster
    assert agent["pass_at_k"]["mean"] == pytest.approx(1.0)
    assert agent["pass_at_1"]["mean"] == pytest.approx((2 / 3 + 2 / 3 + 1) / 3)
    assert agent["fast_1_5_at_k"]["mean"] == pytest.approx(2 / 3)  # 1.6x and 2.4x/1.9x
    assert zero["failures"]["no code"] == 1 and zero["failures"]["nvcc/syntax"] == 1
    assert zero["usage"]["tokens"] == 9 * 1500 and agent["usage"]["cost_usd"] == pytest.approx(0.09)
    (comparison,) = rep.data["comparisons"]
    assert comparison["baseline"] == "zero-shot"
    assert comparison["metrics"]["pass_at_k"]["mean"] == pytest.approx(1 / 3)
    assert comparison["metrics"]["pass_at_1"]["wins"] == 3


# -- formats ------------------------------------------------------------------------------------------
def test_markdown_has_headline_and_plot(run_dir: Path, tmp_path: Path, capsys):
    out = tmp_path / "out" / "report.md"
    assert pkb(["report", str(run_dir), "--out", str(out)]) == 0
    text = out.read_text()
    assert "## Headline" in text
    assert re.search(r"\| condition \| problems \| samples \| pass@1 \| pass@3 \| fast_1@3 \| fast_1.5@3 \|", text)
    assert "| agent:check+compile | 3 | 9/9 | 0.78 [" in text
    assert "![fast_p curve](report_figures/fast_p.png)" in text
    png = out.parent / "report_figures" / "fast_p.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## Comparison" in text and "agent:check+compile vs zero-shot" in text
    # to stdout, markdown carries the curve as a table
    assert pkb(["report", str(run_dir)]) == 0
    assert "## fast_p curve (k = 3)" in capsys.readouterr().out


def test_html_is_self_contained_and_escaped(run_dir: Path, tmp_path: Path):
    out = tmp_path / "report.html"
    assert pkb(["report", str(run_dir), "--out", str(out)]) == 0
    text = out.read_text()
    assert '<table id="headline-table">' in text
    assert re.search(r'<img class="figure" id="fast_p-plot" alt="fast_p curve" src="data:image/png;base64,', text)
    assert "<details class=\"sample\">" in text and "candidates/000.py" in text
    assert not re.search(r'(src|href)="(https?:)?//', text)  # nothing fetched from anywhere
    assert "<script" not in text and HOSTILE not in text
    assert html_escaped(HOSTILE) in text
    # each scored file once: final.py is a copy of candidates/000.py, named rather than shown twice (issue 46)
    samples_with_code = sum(1 for c in OUTCOMES.values() for rows in c.values() for v, _, _ in rows if v != "no_code")
    assert text.count("the same file as <code>candidates/000.py</code> above") == samples_with_code
    assert text.count(f"return x  # {html_escaped(HOSTILE)}") == samples_with_code


def html_escaped(text: str) -> str:

    return html.escape(text, quote=True)


def test_json_is_the_metrics(run_dir: Path, capsys):
    assert pkb(["report", str(run_dir), "--format", "json", "--k", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "pkb-report/1" and data["k"] == 2
    assert {a["condition"] for a in data["arms"]} == set(CONDITIONS)
    assert len(data["arms"][0]["fast_p_curve"]) == 61 and data["arms"][0]["fast_p_curve"][-1][0] == 3.0


def test_two_runs_side_by_side(tmp_path: Path):
    a = make_run(tmp_path, "run-a")
    b = make_run(tmp_path, "run-b", {"zero-shot": OUTCOMES["agent:check+compile"]})
    rep = build([read_run(a), read_run(b)])
    labels = [arm["label"] for arm in rep.data["arms"]]
    assert labels == ["run-a/zero-shot", "run-a/agent:check+compile", "run-b/zero-shot"]
    assert rep.data["baseline"] == "run-a/zero-shot"
    last = rep.data["comparisons"][-1]
    assert last["treatment"] == "run-b/zero-shot"
    assert last["metrics"]["pass_at_k"]["mean"] == pytest.approx(1 / 3)


# -- bad input ----------------------------------------------------------------------------------------
def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and err.startswith("pkb: error: "), err
    return err


def test_bad_inputs_exit_2_with_one_line(run_dir: Path, tmp_path: Path, capsys):
    assert pkb(["report", str(tmp_path / "nope")]) == 2
    assert "no such directory" in _one_line_error(capsys)

    (tmp_path / "empty").mkdir()
    assert pkb(["report", str(tmp_path / "empty")]) == 2
    assert "run.json is missing" in _one_line_error(capsys)

    # the folder of runs instead of a run: the error names the runs in it
    assert pkb(["report", str(tmp_path)]) == 2
    assert "it holds runs: run-a (give one of those)" in _one_line_error(capsys)

    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    header = json.loads((other / "run.json").read_text())
    (other / "run.json").write_text(json.dumps({**header, "schema": "pkb-run/2"}))
    assert pkb(["report", str(other)]) == 2
    assert "schema 'pkb-run/2'" in _one_line_error(capsys)

    # a run of this version holding a sample written by another one
    newer = tmp_path / "newer"
    shutil.copytree(run_dir, newer)
    sample = newer / "samples" / "all_reduce" / "zero-shot" / "1" / "sample.json"
    sample.write_text(json.dumps({**json.loads(sample.read_text()), "schema": "pkb-sample/2"}))
    assert pkb(["report", str(newer)]) == 2
    assert "schema 'pkb-sample/2'; this version reads 'pkb-sample/1'" in _one_line_error(capsys)

    assert pkb(["report", str(run_dir), "--k", "4"]) == 2
    assert "exceeds the 3 samples per problem" in _one_line_error(capsys)
    assert pkb(["report", str(run_dir), "--k", "0"]) == 2
    assert "--k must be at least 1" in _one_line_error(capsys)

    assert pkb(["report", str(run_dir), str(run_dir) + "/"]) == 2
    assert "is given twice" in _one_line_error(capsys)

    assert pkb(["report", str(run_dir), "--out", str(tmp_path)]) == 2
    assert "is a folder; --out writes a regular file" in _one_line_error(capsys)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert pkb(["report", str(run_dir), "--out", str(blocked / "report.html")]) == 2
    assert f"cannot write {blocked / 'report.html'}" in _one_line_error(capsys)
    assert pkb(["report", str(run_dir), "--out", str(blocked / "report.md")]) == 2
    assert f"cannot write {blocked / 'report.md'}" in _one_line_error(capsys)  # said before the figures are drawn

    with pytest.raises(RunFormatError):
        read_run(tmp_path / "empty")


def test_a_run_without_samples_is_one_line_and_exit_2(tmp_path: Path, capsys):
    """run.json written, no sample yet (just started, or killed early): no report of empty tables."""
    run = make_run(tmp_path, "starting")
    shutil.rmtree(run / "samples")
    for fmt in ("md", "html", "json"):
        assert pkb(["report", str(run), "--format", fmt]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        err = captured.err.strip()
        assert len(err.splitlines()) == 1 and "run starting" in err and "has no sample yet" in err, err
    # beside a run that has samples it is refused too: it would silently be missing from the comparison
    assert pkb(["report", str(make_run(tmp_path, "run-b")), str(run)]) == 2
    assert "run starting" in _one_line_error(capsys)


# -- a real run: `pkb run` on CPU with a scripted model ------------------------------------------------
CORRECT = (CANDIDATES / "correct_all_gather_sum.py").read_text()
BROKEN = (CANDIDATES / "compile_error_syntax.py").read_text()  # fails to compile: no rank starts
REAL_CONDITIONS = ("zero-shot", "agent:compile")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pkb run` on CPU (gloo, W=2, shape small): zero-shot and agent:compile, 2 samples of all_reduce.

    The scripted model's first reply has broken code in its text and a compile call of a correct kernel:
    zero-shot scores the text (compile_error); the agent compiles, then submits the correct kernel, which
    the final scoring checks and times. The scripted model has no price, so the run's cost is unknown.
    """
    register_script("test-report", [
        AIMessage(content=f"A kernel:\n\n```python\n{BROKEN}```\n",
                  tool_calls=[{"name": "compile", "args": {"source": CORRECT}, "id": "call_0", "type": "tool_call"}]),
        ("tool", "submit", {"source": CORRECT}),
    ])
    runs = tmp_path_factory.mktemp("runs")
    code = pkb(["run", "--model", "scripted:test-report", "--condition", ",".join(REAL_CONDITIONS),
                "--problems", "all_reduce", "--samples", "2", "--device", "cpu", "--world-size", "2",
                "--shape", "small", "--trials", "2", "--runs-dir", str(runs), "--run-id", "real"])
    assert code == 0
    return runs / "real"






def test_report_of_a_real_run_markdown_and_json(real_run: Path, tmp_path: Path, capsys):
    run = read_run(real_run)
    assert {(s.record.condition, s.record.sample): s.record.verdict for s in run.samples} == {
        ("zero-shot", 0): "compile_error", ("zero-shot", 1): "compile_error",
        ("agent:compile", 0): "correct", ("agent:compile", 1): "correct"}
    correct = [s.record for s in run.samples if s.record.correct]
    assert all(r.speedup and r.speedup > 0 for r in correct)  # timed: on CPU any value
    # a speedup counts unless an integrity flag disqualifies it (on CPU the kernel's collectives are torch's:
    # uses_torch_collectives); the report must agree with agent.report.metrics on which
    speedups = sorted(v for r in correct if (v := metrics.counted_speedup(r.metrics_view())) is not None)
    uncounted = len(correct) - len(speedups)

    capsys.readouterr()
    assert pkb(["report", str(real_run), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    arms = {a["condition"]: a for a in data["arms"]}
    assert data["k"] == 2 and list(arms) == list(REAL_CONDITIONS)
    zero, agent = arms["zero-shot"], arms["agent:compile"]
    assert zero["pass_at_1"]["mean"] == zero["pass_at_k"]["mean"] == 0.0
    assert agent["pass_at_1"]["mean"] == agent["pass_at_k"]["mean"] == 1.0
    assert zero["failures"]["nvcc/syntax"] == 2 and agent["failures"]["correct"] == 2
    assert sorted(agent["speedups"]) == pytest.approx(speedups)
    assert agent["speedups_not_counted"]["samples"] == uncounted
    cpu, *notes = data["notes"]
    assert cpu.startswith("run real ran on CPU: CPU timings only prove the plumbing"), cpu
    if uncounted:  # said, with the flags, rather than leaving an empty fast_p curve unexplained
        (note,) = notes
        assert note.startswith(f"agent:compile: the speedups of {uncounted} correct sample(s) do not count"), note
    else:
        assert notes == []
    assert agent["fast_1_at_k"]["mean"] == float(any(v > 1.0 for v in speedups))
    curve = {p: v for p, v in agent["fast_p_curve"]}
    assert curve[0.0] == float(bool(speedups)) and curve[3.0] == float(any(v > 3.0 for v in speedups))
    # the scripted model is not in the price table: its cost is unknown (null), not $0; each reply reports
    # 100 input and 20 output tokens (zero-shot: one reply a sample; the agent: compile, then submit)
    for arm, replies in ((zero, 2), (agent, 4)):
        assert arm["usage"]["cost_usd"] is None and arm["usage"]["cost_known"] is False
        assert arm["usage"]["tokens"] == replies * 120 and arm["usage"]["usage_reported"] is True
    (comparison,) = data["comparisons"]
    assert comparison["treatment"] == "agent:compile" and comparison["metrics"]["pass_at_k"]["mean"] == 1.0

    out = tmp_path / "real.md"
    assert pkb(["report", str(real_run), "--out", str(out)]) == 0
    text = out.read_text()
    rows = {row[0]: row for row in md_rows(text, "| condition | problems | samples | pass@1 | pass@2 |")}
    assert list(rows) == list(REAL_CONDITIONS)
    # not [0.00, 0.00]: a bootstrap over one problem resamples nothing; said once, not in every cell (issue 46)
    assert rows["zero-shot"][1:5] == ["1", "2/2", "0.00", "0.00"]
    assert rows["agent:compile"][1:5] == ["1", "2/2", "1.00", "1.00"]
    assert text.count("shown without an interval") == 1
    assert rows["agent:compile"][7] == (f"{np.exp(np.mean(np.log(speedups))):.2f}x (CPU: plumbing)" if speedups
                                        else "—")  # geomean, labelled as what a CPU speedup is
    assert "ran on CPU: CPU timings only prove the plumbing" in text
    assert [rows[c][8:10] for c in REAL_CONDITIONS] == [["n/a", "240"], ["n/a", "480"]]  # cost, tokens
    assert "$0.00" not in text and "n/a (cpu)" in rows["agent:compile"][11]  # no GPU seconds on a CPU run
    assert "![fast_p curve](real_figures/fast_p.png)" in text
    assert (out.parent / "real_figures" / "fast_p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- a headless browser -------------------------------------------------------------------------------
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0"]
TABLE_HEADER = (0xEE, 0xF0, 0xF3)  # the CSS's th background


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def _rgb8(image: np.ndarray) -> np.ndarray:
    return (image[..., :3] * 255).round().astype(np.uint8)


def find_image(screen: np.ndarray, image: np.ndarray) -> tuple[int, int] | None:
    """(top, left) where `image` is drawn pixel for pixel in `screen`, None if nowhere.

    One busy row of the image is searched for in each screen row as bytes, then the whole image is compared
    at each hit. Exact: the page shows the PNG at its own size (max-width only shrinks a wider one).
    """
    h, w, _ = image.shape
    row = int(np.argmax((image < 250).any(axis=2).sum(axis=1)))
    needle = image[row].tobytes()
    for y in range(row, screen.shape[0] - (h - row) + 1):
        line = screen[y].tobytes()
        at = line.find(needle)
        while at != -1:
            top, left = y - row, at // 3
            if at % 3 == 0 and np.array_equal(screen[top:top + h, left:left + w], image):
                return top, left
            at = line.find(needle, at + 1)
    return None


def header_bands(screen: np.ndarray) -> int:
    """How many separate horizontal bands of table-header background (a table's header row) are drawn."""
    rows = (screen == np.array(TABLE_HEADER, dtype=np.uint8)).all(axis=2).sum(axis=1) > 40
    return int(np.sum(rows[1:] & ~rows[:-1]) + rows[0])


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (/usr/bin/chromium)")
def test_report_of_a_real_run_renders_in_headless_chromium(real_run: Path, tmp_path: Path):
    from matplotlib.image import imread

    # the console check can fail: a page that logs an error is caught
    bad = tmp_path / "bad.html"
    bad.write_text('<!doctype html><html><body><script>console.error("boom")</script></body></html>')
    probe = _chromium(["--dump-dom", bad.resolve().as_uri()], tmp_path / "profile-probe")
    assert any("boom" in line for line in _console_errors(probe.stderr)), probe.stderr[-2000:]

    page = tmp_path / "report.html"
    assert pkb(["report", str(real_run), "--format", "html", "--out", str(page)]) == 0
    text = page.read_text()
    url = page.resolve().as_uri()

    dom = _chromium(["--dump-dom", url], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not _console_errors(dom.stderr), _console_errors(dom.stderr)
    rows = html_rows(dom.stdout, "headline-table")
    assert [r[0] for r in rows] == list(REAL_CONDITIONS)
    assert rows[0][2:5] == ["2/2", "0.00", "0.00"]  # one problem: no interval, said once under the table
    assert rows[1][2:5] == ["2/2", "1.00", "1.00"]
    assert dom.stdout.count("shown without an interval") == 1
    runs = html_rows(dom.stdout, "runs-table")
    assert runs[0][3:5] == ["4/4", "2"]  # the header agrees with the headline: 2/2 + 2/2 samples, 2 per problem
    assert rows[0][8] == rows[1][8] == "n/a"  # cost
    assert "cost n/a" in dom.stdout and "$0.0000" not in dom.stdout  # every sample's line, too
    assert re.search(r'<img[^>]+id="fast_p-plot"[^>]+src="data:image/png;base64,', dom.stdout)

    shot = tmp_path / "shot.png"
    run = _chromium([f"--screenshot={shot}", "--window-size=1400,2000", url], tmp_path / "profile-shot")
    assert run.returncode == 0, run.stderr[-2000:]
    assert not _console_errors(run.stderr), _console_errors(run.stderr)
    screen = _rgb8(imread(shot))
    assert screen.shape[:2] == (2000, 1400)
    # the fast_p plot: the PNG embedded in the page, found pixel for pixel in the screenshot
    encoded = re.search(r'id="fast_p-plot"[^>]+src="data:image/png;base64,([^"]+)"', text)
    assert encoded
    plot = _rgb8(imread(io.BytesIO(base64.b64decode(encoded.group(1))), format="png"))
    where = find_image(screen, plot)
    assert where is not None, "the fast_p plot is not drawn in the screenshot"
    # above it, the tables are drawn: the runs table, the headline table, the comparison and the compact table's
    # two (arms, comparisons), each with its header row in the CSS's header colour
    assert header_bands(screen[:where[0]]) == 5


def test_k_1_shows_pass_at_1_once_and_one_problem_has_no_interval(run_dir: Path):
    from agent.report.paper import comparison_rows
    from agent.report.rows import fmt_interval, headline_rows

    rep = build([read_run(run_dir)], k=1)
    head, _ = headline_rows(rep)
    assert head.count("pass@1") == 1 and "fast_1@1" in head  # pass@k is pass@1 at k = 1: shown once
    assert [h for h in comparison_rows(rep)[0] if h.startswith("Δ pass@")] == ["Δ pass@1"]
    assert fmt_interval({"mean": 0.5, "low": 0.5, "high": 0.5, "n": 1}) == "0.50"  # the note says why, once
    # the sequence category has one problem: its cells are bare means, and the report says why once
    text = to_markdown(rep)
    assert text.count("shown without an interval") == 1
    assert [r[1] for r in md_rows(text, "| category |") if r[0] == "sequence"] == ["0.33"]
    assert fmt_interval({"mean": 0.5, "low": 0.25, "high": 0.75, "n": 3}) == "0.50 [0.25, 0.75]"
