"""No secret of the harness reaches a record (harness.records.redaction, harness.launch.sandbox.clean_environment).

The secrets are marker values in environment variables named like API keys. The unit tests pin the
redaction's forms and every writer it sits in; the slow ones run a candidate that tries every way to leak
them (tests/exploits/leak_secrets.py, link_environ_at_issue.py) through an evaluation, sandboxed and not,
and through a whole `pkb run` with its report, and search every byte written for the markers.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness.common.paths import REPO_ROOT
from harness.launch.sandbox import clean_environment, probe
from harness.records import redaction

ROOT = REPO_ROOT
EXPLOITS = ROOT / "tests" / "exploits"
LEAKERS = [EXPLOITS / "leak_secrets.py", EXPLOITS / "link_environ_at_issue.py"]


# link_environ_at_issue.py without its helper file: right through a collective (correct, flagged, timed),
# links to /proc/self/environ wherever a rank may report a timed output it could not copy.
LINKER = """import os, sys
from pathlib import Path
import torch.distributed as dist
from harness.common.seeds import TIMED_CALL_OFFSET, TIMING_TRIAL_BASE

_kept = Path(sys.argv[sys.argv.index("--init-file") + 1]).parent / "kept"
_kept.mkdir(exist_ok=True)
_rank = int(sys.argv[sys.argv.index("--rank") + 1])
_first = TIMING_TRIAL_BASE + TIMED_CALL_OFFSET  # the trial number of the timing phase's first call
for _n in range(_first, _first + 600):
    try:
        os.symlink("/proc/self/environ", _kept / f"kept-{_n}-r{_rank}.issue")
    except FileExistsError:
        pass


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    return out
"""


def markers() -> dict[str, str]:
    tag = secrets.token_hex(12)
    return {"PKBTEST_ANTHROPIC_API_KEY": f"sk-ant-{tag}-a", "PKBTEST_GITHUB_TOKEN": f"ghp_{tag}b",
            "PKBTEST_CLIENT_SECRET": f"cs-{tag}-c"}


def leaks(data: bytes, values: dict[str, str]) -> list[str]:
    """The markers found in `data`: raw, hex, base64 at any alignment (checked here without the module
    under test for the raw and hex forms)."""
    found = {name for name, value in values.items()
             if value.encode() in data or value.encode().hex().encode() in data}
    return sorted(found | set(redaction.contains_secret(data, values)))


# -- the redaction itself ---------------------------------------------------------------------------
def test_every_form_of_a_secret_is_replaced():
    env = markers()
    key = env["PKBTEST_ANTHROPIC_API_KEY"]
    for prefix in (b"", b"x", b"xy", b"xyz"):
        text = (f"raw {key} hex {key.encode().hex()} HEX {key.encode().hex().upper()} "
                f"b64 {base64.b64encode(prefix + key.encode() + b'!').decode()} "
                f"url {base64.urlsafe_b64encode(prefix + key.encode()).decode()} json {json.dumps({'k': key})}")
        assert leaks(text.encode(), env) == ["PKBTEST_ANTHROPIC_API_KEY"]
        out = redaction.redact_text(text, env)
        assert leaks(out.encode(), env) == [], out
        assert "[redacted:PKBTEST_ANTHROPIC_API_KEY]" in out
    same = redaction.redact_bytes(f"a{key}b".encode(), same_length=True, environ=env)
    assert same == b"a" + b"*" * len(key) + b"b"


def test_only_secret_names_and_long_values_count():
    env = {"OPENAI_API_KEY": "short", "PATH": "/usr/bin:/bin", "MY_TOKEN": "tok-123456789"}
    assert redaction.secret_names(env) == ["MY_TOKEN"]
    assert redaction.redact_text("/usr/bin short tok-123456789", env) == "/usr/bin short [redacted:MY_TOKEN]"


def test_a_candidates_environment_is_an_allow_list_without_secret_values(tmp_path):
    env = {**markers(), "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0", "HF_HOME": "/x", "AWS_PROFILE": "p"}
    env["CUDA_SMUGGLED"] = env["PKBTEST_GITHUB_TOKEN"]  # a secret's value under a name the list keeps
    kept = clean_environment(env, tmp_path)
    assert "PATH" in kept and kept["CUDA_VISIBLE_DEVICES"] == "0"
    assert not {"PKBTEST_ANTHROPIC_API_KEY", "PKBTEST_GITHUB_TOKEN", "PKBTEST_CLIENT_SECRET", "CUDA_SMUGGLED",
                "HF_HOME", "AWS_PROFILE"} & set(kept)


def test_every_writer_of_a_run_redacts(tmp_path, monkeypatch):
    """Run files, tool records, the event log, the search archive and the LangGraph checkpoints."""
    from agent.checkpoint_serde import RedactingSerializer
    from agent.eventlog import open_event_log
    from agent.rundir import write_json_atomic
    from agent.search.archive import Archive
    from tools.base import write_atomic

    env = markers()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    key = env["PKBTEST_ANTHROPIC_API_KEY"]
    write_json_atomic(tmp_path / "sample.json", {"message": f"leaked {key}"})
    write_atomic(tmp_path / "record.json", f"leaked {key.encode().hex()}")
    log, handle = open_event_log(tmp_path / "events.jsonl")
    log.info("tool_call", text=f"leaked {key}")
    handle.close()
    with Archive(tmp_path / "archive.sqlite") as archive:
        archive.set_meta("note", f"leaked {base64.b64encode(key.encode()).decode()}")
    serde = RedactingSerializer()
    typed = serde.dumps_typed({"messages": [f"tool said {key}"]})
    assert serde.loads_typed(typed) == {"messages": ["tool said " + "*" * len(key)]}  # masked in place
    for path in tmp_path.iterdir():
        assert leaks(path.read_bytes(), env) == [], path.name
    with sqlite3.connect(tmp_path / "archive.sqlite") as db:
        (note,) = db.execute("SELECT value FROM meta WHERE key = 'note'").fetchone()
    assert note == "leaked [redacted:PKBTEST_ANTHROPIC_API_KEY]"


# -- an evaluation and a run, end to end --------------------------------------------------------------
def _all_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}


# Evaluations in a fresh interpreter whose environment holds the markers from its start, as a harness started
# with API keys has them: /proc/PID/environ shows a process's initial environment only, so keys set later in
# this test process would be invisible to a candidate and prove nothing. One interpreter for a test's
# evaluations (arguments in threes: candidate, log folder, redaction or not), one JSON line each.
EVALUATE = """
import sys
from pathlib import Path
import harness.evaluate
from harness.config import EvalConfig, TimingConfig
from harness.problems.registry import get, load_suite
redacting = harness.evaluate.secret_names
args = sys.argv[1:]
for candidate, logs, redaction in zip(args[0::3], args[1::3], args[2::3]):
    # the control, "no-redaction": what reaches the record without the redaction
    harness.evaluate.secret_names = redacting if redaction == "redaction" else (lambda: [])
    r = harness.evaluate.evaluate(get(load_suite(), "all_reduce"), Path(candidate), world_size=2, device="cpu",
                                  shape="small", config=EvalConfig(trials=2, timing=TimingConfig.for_device("cpu")),
                                  log_dir=Path(logs))
    print(r.model_dump_json(), flush=True)
"""


def _evaluate_with_keys(jobs: list[tuple[Path, Path, bool]], env: dict[str, str]) -> list[str]:
    """The records of (candidate, log folder, redaction on) evaluations, in order."""
    args = [str(a) for candidate, logs, redaction in jobs
            for a in (candidate, logs, "redaction" if redaction else "no-redaction")]
    done = subprocess.run([sys.executable, "-c", EVALUATE, *args], env=env, capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    records = done.stdout.strip().splitlines()[-len(jobs):]
    assert len(records) == len(jobs) and all(r.startswith("{") for r in records), done.stdout[-3000:]
    return records


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["bwrap", "off"])
def test_an_evaluation_records_no_secret(sandbox, tmp_path):
    if sandbox == "bwrap" and probe().backend != "bwrap":
        pytest.skip(f"no sandbox here: {probe().reason}")
    values = markers()
    env = {**os.environ, **values, "PYTHONPATH": str(ROOT)}
    if sandbox == "off":
        env["PKB_SANDBOX"] = "off"
    jobs = [(candidate, tmp_path / candidate.stem, True) for candidate in LEAKERS]
    *records, raw = _evaluate_with_keys([*jobs, (LEAKERS[0], tmp_path / "control", False)], env)
    for (candidate, logs, _), record in zip(jobs, records):
        result = json.loads(record)
        assert not result["correct"] and result["verdict"] != "infra_error", result["failure"]
        assert leaks(record.encode(), values) == [], candidate.name
        for name, data in _all_bytes(logs).items():
            assert leaks(data, values) == [], f"{candidate.name}: {name}"
    if sandbox == "off":
        # The control: without a sandbox the candidate does reach the harness's keys (its parent's
        # /proc/PID/environ), and only the redaction keeps them out of the record.
        assert values["PKBTEST_ANTHROPIC_API_KEY"] in raw
    else:
        # Sandboxed, the candidate finds nothing to leak in the first place.
        assert leaks(raw.encode(), values) == []


@pytest.mark.slow
def test_a_pkb_run_and_its_report_hold_no_secret(tmp_path):
    """`pkb run` replaying the leaking candidates without a sandbox (where they find the keys), then its
    report in markdown and HTML: no byte of the run folder holds a marker, and the redaction did happen."""
    solutions = tmp_path / "solutions" / "all_reduce"
    solutions.mkdir(parents=True)
    shutil.copy(LEAKERS[0], solutions / "a_leak_secrets.py")
    (solutions / "b_link_environ.py").write_text(LINKER)  # replayed files are copied: no helper beside them
    env = {**os.environ, **markers(), "PYTHONPATH": str(ROOT)}
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "agent.cli.run", "--model", f"replay:{solutions.parent}",
                           "--problems", "all_reduce", "--trials", "2", "--runs-dir", str(runs), "--run-id", "leak",
                           "--no-sandbox"], env=env, capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    run = runs / "leak"
    for fmt in ("md", "html", "json"):
        report = subprocess.run([sys.executable, "-m", "agent.cli", "report", str(run), "--out",
                                 str(run / f"report.{fmt}")], env=env, capture_output=True, text=True, timeout=600,
                                cwd=tmp_path)
        assert report.returncode == 0, report.stderr[-2000:]
    files = _all_bytes(run)
    assert {"events.jsonl", "checkpoints.sqlite", "report.html", "report.md"} <= set(files)
    assert any(name.endswith("result.json") for name in files)
    values = {k: v for k, v in env.items() if k.startswith("PKBTEST_")}
    for name, data in files.items():
        assert leaks(data, values) == [], name
    for output in (proc.stdout, proc.stderr):
        assert leaks(output.encode(), values) == []
    # The candidate did find the keys: the records say where they were removed.
    assert any(b"[redacted:PKBTEST_" in data for data in files.values())
    results = [json.loads(data) for name, data in files.items() if name.endswith("result.json")]
    assert results and all(r["integrity"]["sandbox"]["weaker_fallback"] == "turned off by --no-sandbox"
                           for r in results)
