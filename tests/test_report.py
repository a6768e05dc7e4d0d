"""`pkb report`: markdown, HTML and JSON from a synthetic run directory; bad input; a headless browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent import cli, cli_report
from agent.report import build
from harness.run_reader import RunFormatError, read_run

CONDITIONS = ("zero-shot", "agent:check+compile")
PROBLEMS = (("all_reduce", "collective"), ("all_gather", "collective"), ("ulysses_all_to_all", "sequence"))
# (verdict, speedup, roofline fraction) per condition, problem and sample: the agent does better.
OUTCOMES = {
    "zero-shot": {
        "all_reduce": [("correct", 0.8, 0.30), ("compile_error", None, None), ("output_mismatch", None, None)],
        "all_gather": [("no_code", None, None), ("runtime_error", None, None), ("deadlock", None, None)],
        "ulysses_all_to_all": [("correct", 1.2, 0.45), ("api_error", None, None), ("shape_mismatch", None, None)],
    },
    "agent:check+compile": {
        "all_reduce": [("correct", 1.6, 0.70), ("correct", 1.3, 0.55), ("output_mismatch", None, None)],
        "all_gather": [("correct", 1.1, 0.40), ("compile_error", None, None), ("correct", 0.9, 0.35)],
        "ulysses_all_to_all": [("correct", 2.4, 0.81), ("correct", 1.9, 0.66), ("correct", 1.4, 0.52)],
    },
}
HOSTILE = "<script>alert('x')</script> & </details>"  # must come out escaped, never as markup


def _write(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload, indent=1))


def make_run(root: Path, run_id: str = "run-a", outcomes: dict = OUTCOMES, samples: int = 3) -> Path:
    """A run directory in docs/run-layout.md's format, with transcripts and candidates."""
    run = root / run_id
    conditions = list(outcomes)
    _write(run / "run.json", {
        "schema": "pkb-run/1", "run_id": run_id, "created_at": "2026-11-29T19:00:00+00:00",
        "config": {"model": "scripted:demo", "conditions": conditions, "samples": samples,
                   "problems": [p for p, _ in PROBLEMS], "device": "cpu", "world_size": 2, "shape": "small",
                   "budgets": {"max_turns": 8}, "seed": 0},
        "versions": {"pkb_agent": "0.1.0", "torch": "2.13.0", "python": "3.11"},
        "prompt_hashes": {"system.md": "0" * 64}, "topology": None, "environment": {},
    })
    (run / "events.jsonl").write_text("")
    for condition in conditions:
        for problem, category in PROBLEMS:
            for k, (verdict, speedup, roof) in enumerate(outcomes[condition][problem]):
                d = run / "samples" / problem / condition / str(k)
                agent = condition.startswith("agent")
                _write(d / "sample.json", {
                    "schema": "pkb-sample/1", "problem": problem, "category": category, "condition": condition,
                    "sample": k, "model": "scripted:demo", "status": "finished",
                    "stop_reason": "no_code" if verdict == "no_code" else ("submitted" if agent else "zero_shot"),
                    "verdict": verdict, "correct": verdict == "correct", "speedup": speedup, "flags": [],
                    "roofline_fraction": roof,
                    "usage": {"input_tokens": 1200 * (3 if agent else 1), "output_tokens": 300, "cost_usd": 0.01},
                    "turns": 3 if agent else 1, "tool_calls": {"check": 1, "compile": 1} if agent else {},
                    "wall_s": 10.0, "gpu_s": 2.0 if agent else 0.5,
                    "started_at": "2026-11-29T19:00:01+00:00", "finished_at": "2026-11-29T19:00:11+00:00",
                })
                transcript = [
                    {"role": "system", "content": "You write multi-GPU kernels."},
                    {"role": "user", "content": f"Problem {problem}. {HOSTILE}"},
                ]
                if verdict != "no_code":
                    code = f"# candidate for {problem}\ndef solution(x):\n    return x  # {HOSTILE}\n"
                    _write(d / "candidates" / "000.py", code)
                    _write(d / "candidates" / "000.json", {"tool": "check" if agent else "submit", "verdict": verdict})
                    _write(d / "final.py", code)
                    _write(d / "result.json", {"schema_version": 1, "problem": problem, "verdict": verdict,
                                               "correct": verdict == "correct", "speedup": speedup})
                    transcript.append({"role": "assistant", "content": "Here is a kernel.",
                                       "candidate": "candidates/000.py",
                                       "tool_calls": [{"id": "c1", "name": "check", "args": {"trials": 2}}]
                                       if agent else [],
                                       "usage": {"input_tokens": 1200, "output_tokens": 300}})
                    if agent:
                        transcript.append({"role": "tool", "tool_call_id": "c1", "name": "check",
                                           "content": f"verdict: {verdict}"})
                _write(d / "transcript.json", transcript)
    return run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return make_run(tmp_path)


def pkb(argv: list[str]) -> int:
    """`pkb` with the report command registered (whether or not agent/cli.py lists it yet)."""
    modules = cli.COMMAND_MODULES
    if cli_report not in modules:
        cli.COMMAND_MODULES = (*modules, cli_report)
    try:
        return cli.main(argv)
    finally:
        cli.COMMAND_MODULES = modules


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


def html_escaped(text: str) -> str:
    import html

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
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_bad_inputs_exit_2_with_one_line(run_dir: Path, tmp_path: Path, capsys):
    assert pkb(["report", str(tmp_path / "nope")]) == 2
    assert "no such directory" in _one_line_error(capsys)

    (tmp_path / "empty").mkdir()
    assert pkb(["report", str(tmp_path / "empty")]) == 2
    assert "run.json is missing" in _one_line_error(capsys)

    other = tmp_path / "other"
    shutil.copytree(run_dir, other)
    header = json.loads((other / "run.json").read_text())
    (other / "run.json").write_text(json.dumps({**header, "schema": "pkb-run/2"}))
    assert pkb(["report", str(other)]) == 2
    assert "schema 'pkb-run/2'" in _one_line_error(capsys)

    assert pkb(["report", str(run_dir), "--k", "4"]) == 2
    assert "exceeds the 3 samples per problem" in _one_line_error(capsys)

    with pytest.raises(RunFormatError):
        read_run(tmp_path / "empty")


# -- a headless browser -------------------------------------------------------------------------------
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0"]


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (/usr/bin/chromium)")
def test_report_renders_in_headless_chromium(run_dir: Path, tmp_path: Path):
    from matplotlib.image import imread

    page = tmp_path / "report.html"
    assert pkb(["report", str(run_dir), "--format", "html", "--out", str(page)]) == 0
    url = page.resolve().as_uri()

    dom = _chromium(["--dump-dom", url], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not _console_errors(dom.stderr), _console_errors(dom.stderr)
    assert 'id="headline-table"' in dom.stdout and "pass@3" in dom.stdout
    assert re.search(r'<img[^>]+id="fast_p-plot"[^>]+src="data:image/png;base64,', dom.stdout)

    shot = tmp_path / "shot.png"
    run = _chromium([f"--screenshot={shot}", "--window-size=1400,2000", url], tmp_path / "profile-shot")
    assert run.returncode == 0, run.stderr[-2000:]
    assert not _console_errors(run.stderr), _console_errors(run.stderr)
    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (2000, 1400)
    colours = {tuple(p) for p in (pixels[::7, ::7] * 255).astype(int).reshape(-1, 3).tolist()}
    assert len(colours) > 50, "the screenshot is (nearly) one colour"
    # The fast_p plot sits right under the headline table: its first line is matplotlib's C0 blue, a colour
    # the page's CSS never uses, so finding it in the screenshot means the embedded PNG was drawn.
    blue = (abs(pixels[..., 0] * 255 - 31) < 12) & (abs(pixels[..., 1] * 255 - 119) < 12) & (
        abs(pixels[..., 2] * 255 - 180) < 12)
    assert int(blue.sum()) > 200, "the fast_p plot's line is not in the screenshot"
