"""What the final scoring adds (agent.final_scoring): held-out shapes, the best candidate by the tools' evidence,
per-candidate trajectories in sample.json, the report's section and `pkb rescore`; and the conditions that
compare with ParallelKernelBench: `--prompt pkb` and the bash-only agent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent import final_scoring
from agent.rescore import RESCORED_FILE, rescore_run
from agent.rundir import RunDir
from agent.runner import RunConfig, Runner, create_run
from agent.scheduler import DeviceScheduler
from harness.common.paths import REPO_ROOT
from harness.launch.sandbox import SandboxInfo, probe
from harness.problems.parallelkernelbench import checkout
from harness.problems.problem import MalformedProblem, load_problem
from harness.problems.registry import discover, get, load_suite
from tests.agent_support import CORRECT, eval_config, fenced, run_samples, scripted
from tests.conftest import CANDIDATES, TESTS

WRONG = (CANDIDATES / "output_mismatch_rank1.py").read_text()
# Correct at the visible shape only: it returns its input unless x has the `small` shape's 8 rows, the way a
# kernel fitted to the shape the tools used fails on another size.
FITTED = CORRECT.replace("def solution(x):\n", "def solution(x):\n    if x.shape[0] != 8:\n        return x.clone()\n")
PKB_CHECKOUT = TESTS / "fixtures" / "pkb_checkout"
# The bash condition's shell runs only in the bubblewrap sandbox (tools/bash.py refuses to run without it).
needs_sandbox = pytest.mark.skipif(probe().backend != "bwrap",
                                   reason=f"the bash condition needs the sandbox; there is none here: {probe().reason}")


# -- pure helpers ------------------------------------------------------------------------------------------
def test_best_by_evidence_prefers_the_fastest_counted_then_the_latest_correct() -> None:
    entries: list[dict[str, Any]] = [{"index": 0, "correct": False}, {"index": 1, "correct": True, "speedup": None},
               {"index": 2, "correct": True, "speedup": 1.4}, {"index": 3, "correct": True, "speedup": 1.1},
               {"index": 4, "correct": True, "speedup": None}, {"index": 5, "correct": None}]
    assert (final_scoring.best_by_evidence(entries) or {}).get("index") == 2
    assert (final_scoring.best_by_evidence([e for e in entries if e.get("speedup") is None]) or {}).get("index") == 4
    assert final_scoring.best_by_evidence([entries[0], entries[5]]) is None


def test_a_tools_judgement_counts_only_what_may_count() -> None:
    judge = final_scoring.tool_judgement
    assert judge({"verdict": "compiled", "ok": True}) == (None, None)  # compile judges nothing
    assert judge({"correct": True, "speedup": 1.3, "result": {"fast_eligible": True}}) == (True, 1.3)
    assert judge({"correct": True, "speedup": 1.3, "result": {"fast_eligible": False}}) == (True, None)
    assert judge({"correct": True, "speedup": 1.3, "result": {"emulated": True}}) == (True, None)
    assert judge({"candidate": {"correct": False, "speedup": None}}) == (False, None)  # roofline's candidate


def test_combined_verdict_over_every_shape() -> None:
    ok = {"verdict": "correct", "correct": True}
    held_bad = [{"shape": "held-out:small", "verdict": "output_mismatch", "correct": False}]
    assert final_scoring.combined(ok, []) == {"correct": True, "correct_visible": True, "held_out_correct": None,
                                              "verdict": "correct"}
    both = final_scoring.combined(ok, held_bad)
    assert both["correct"] is False and both["correct_visible"] is True and both["verdict"] == "output_mismatch"
    failed = final_scoring.combined({"verdict": "runtime_error", "correct": False}, [])
    assert failed["verdict"] == "runtime_error" and failed["correct_visible"] is False


# -- the problem contract ----------------------------------------------------------------------------------
def test_every_problem_of_the_suite_has_held_out_shapes() -> None:
    suite, malformed = discover()
    assert not malformed
    for problem in suite:
        for visible in ("small", "default"):
            assert problem.held_out_shapes(visible) == [f"held-out:{visible}"], problem.name
            held = problem.shape(f"held-out:{visible}")
            assert set(held) == set(problem.shapes[visible]) and held != problem.shapes[visible], problem.name
    for problem in checkout.list_problems(PKB_CHECKOUT):  # PKB's: another base_shape, as many elements
        for visible in ("small", "default"):
            seen, held = problem.shapes[visible]["base_shape"], problem.shape(f"held-out:{visible}")["base_shape"]
            assert held != seen and held[0] * held[1] == seen[0] * seen[1]


@pytest.mark.parametrize(("held_out", "message"), [
    ({"small": {"tokens": 12}}, "must have exactly its keys"),
    ({"small": {"tokens": 8, "hidden": 64}}, "equals it"),
    ({"tiny": {"tokens": 1, "hidden": 2}}, "not one of the shapes"),
])
def test_bad_held_out_declarations_are_refused(tmp_path: Path, held_out: dict[str, Any], message: str) -> None:
    source = (Path(get(load_suite(), "all_reduce").path)).read_text()
    start = source.index('    "held_out": {')
    end = source.index("    },\n", start) + len("    },\n")
    folder = tmp_path / "collective"
    folder.mkdir()
    (folder / "all_reduce.py").write_text(source[:start] + f'    "held_out": {held_out!r},\n' + source[end:])
    with pytest.raises(MalformedProblem, match=message):
        load_problem(folder / "all_reduce.py")


# -- the final scoring, end to end (scripted models, CPU) ---------------------------------------------------
@pytest.mark.slow
def test_a_kernel_fitted_to_the_visible_shape_is_not_correct(tmp_path: Path) -> None:
    _, summary = run_samples(tmp_path, [scripted([("text", fenced(FITTED))])], conditions=["zero-shot"])
    record = summary.records[0]
    assert record["correct_visible"] is True and record["correct"] is False
    assert record["verdict"] == "output_mismatch"
    shapes = record["held_out"]["shapes"]
    assert [s["shape"] for s in shapes] == ["held-out:small"] and record["held_out"]["correct"] is False
    assert shapes[0]["seed"] == final_scoring.held_out_seed(0, 0) != record["scoring_seed"]
    assert record["prompt"]["name"] == "pkb-agent" and record["prompt"]["extraction"] == "pkb-agent:last-python-block"


@pytest.mark.slow
def test_best_candidate_trajectory_report_and_rescore(tmp_path: Path) -> None:
    steps = [("tool", "check", {"source": WRONG}), ("tool", "bench", {"source": CORRECT}),
             ("tool", "submit", {"source": WRONG})]
    runner, summary = run_samples(tmp_path, [scripted(steps)], conditions=["agent:bench+check"])
    record = summary.records[0]
    assert record["correct"] is False  # the submitted file is wrong ...
    best = record["best"]  # ... and the best one the tools saw is scored apart
    assert best["candidate"] == "candidates/001.py" and best["same_as_final"] is False
    assert best["correct"] is True and best["correct_visible"] is True and best["held_out_correct"] is True
    assert best["evidence"].startswith("bench: correct")
    trajectory = record["trajectory"]
    assert [(t["tool"], t["turn"], t["correct"]) for t in trajectory] == [
        ("check", 1, False), ("bench", 2, True), ("submit", 3, None)]
    assert all(t["tokens"] > 0 and len(t["sha256"]) == 64 for t in trajectory)
    assert trajectory[0]["sha256"] == trajectory[2]["sha256"]  # the same source twice

    # pkb rescore: every distinct source once, by the final scorer; the report draws both curves
    rescored = rescore_run(runner.run_dir, runner.config, {p.name: p for p in load_suite()},
                           scheduler=DeviceScheduler("cpu", 2, cpu_slots=1))
    assert (rescored.scored, rescored.reused) == (2, 1)
    sample_dir = next((runner.run_dir.path / "samples").glob("*/*/0"))
    scores = json.loads((sample_dir / RESCORED_FILE).read_text())["candidates"]
    assert [scores[f"candidates/00{i}.py"]["correct"] for i in range(3)] == [False, True, False]
    assert scores["candidates/002.py"]["same_source_as"] == "candidates/000.py"

    from agent.report.build import build
    from agent.report.figures import draw_all
    from agent.report.markdown import to_markdown
    from agent.report.run_reader import read_run

    report = build([read_run(runner.run_dir.path)])
    arm = report.data["trajectories"][0]
    assert arm["final_scoring"]["best_apart_correct"] == 1 and arm["rescored_samples"] == 1
    assert [p["pass"] for p in arm["curves"]["tools"]["turn"]] == [0.0, 1.0, 1.0]
    assert [p["pass"] for p in arm["curves"]["rescored"]["turn"]] == [0.0, 1.0, 1.0]
    assert arm["curves"]["tools"]["tokens"] and draw_all(report)["trajectory"] is not None
    assert "## Held-out shapes, best candidate, trajectories" in to_markdown(report)


BASH_SOLUTION = "cat > solution.py <<'EOF'\n" + CORRECT + "EOF"


def test_the_shell_refuses_to_run_without_the_sandbox(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tools import bash
    from tools.base import ToolInputError

    monkeypatch.setattr(bash, "probe", lambda: SandboxInfo("none", reason="bubblewrap is not installed (test)"))
    ran: list[object] = []
    monkeypatch.setattr("tools.bash.subprocess.Popen", lambda *a, **k: ran.append(a))
    with pytest.raises(ToolInputError, match="needs the bubblewrap sandbox.*not installed"):
        bash.run_shell(None, "touch /tmp/escaped", 5.0)  # type: ignore[arg-type]  # refused before the context is read
    assert not ran


@needs_sandbox
@pytest.mark.slow
def test_bash_condition_writes_checks_and_is_scored_by_its_file(tmp_path: Path) -> None:
    repo = REPO_ROOT
    steps = [("tool", "bash", {"command": BASH_SOLUTION}),
             ("tool", "bash", {"command": f"ls {repo}/problems; grep def reference.py; id -u"}),
             ("tool", "bash", {"command": "pkb-check"}),
             ("tool", "bash", {"command": "sleep 30"}),
             ("text", "done")]
    model = scripted(steps)
    runner, summary = run_samples(tmp_path, [model], conditions=["bash"], shell_timeout_s=5.0)
    record = summary.records[0]
    assert record["condition"] == "bash" and record["verdict"] == "correct" and record["correct"] is True
    assert record["prompt"]["extraction"] == "shell-file:solution.py" and record["stop_reason"] == "submitted"
    sample_dir = next((runner.run_dir.path / "samples").glob("*/*/0"))
    answers = [json.loads(p.read_text()) for p in sorted((sample_dir / "candidates").glob("*.json"))]
    assert answers[0]["data"]["harness"] == "check" and answers[0]["data"]["verdict"] == "correct"
    transcript = json.loads((sample_dir / "transcript.json").read_text())
    tool_answers = [m["content"] for m in transcript if m["role"] == "tool"]
    assert "No such file or directory" in tool_answers[1]  # the checkout (oracles, held-out shapes) is hidden
    assert "def solution" in tool_answers[1] and "65534" in tool_answers[1]  # the reference is there; not root
    assert tool_answers[3].startswith("[killed after")  # the per-command limit (the test sets 5 s)
    assert "bash" in model.bound_tool_names and len(model.bound_tool_names) == 1
    assert [t["tool"] for t in record["trajectory"]] == ["bash"]  # the checked file; unchanged at the end


@needs_sandbox
@pytest.mark.slow
def test_pkb_prompt_zero_shot_and_bash_on_a_checkout(tmp_path: Path) -> None:
    spec = f"pkb:{PKB_CHECKOUT}"
    problem = next(p for p in checkout.list_problems(PKB_CHECKOUT) if p.name == "1_all_reduce")
    code = "import torch.distributed as dist\n\n\ndef solution(tensor):\n    out = tensor.clone()\n" \
           "    dist.all_reduce(out)\n    return out\n"
    # PKB's rule takes the first block (correct); this project's would take the last (a syntax error)
    reply = f"Plan.\n```python\n{code}```\nAnd a sketch:\n```python\ndef broken(:\n```\n"
    rel = "solutions_cuda/1_all_reduce_cuda.py"
    bash_steps = [("tool", "bash", {"command": f"ls reference; mkdir -p solutions_cuda && cat > {rel} <<'EOF'\n"
                                               f"{code}EOF"}), ("tool", "bash", {"command": f"pkb-check {rel}"}),
                  ("text", "done")]
    models = {"zero-shot": scripted([("text", reply)]), "bash": scripted(bash_steps)}
    config = RunConfig(model="scripted:test", conditions=["zero-shot", "bash"], samples=1, problems=[problem.name],
                       source=spec, trials=2, model_attempts=1, prompt=f"pkb:{PKB_CHECKOUT.resolve()}")
    run_dir = RunDir(tmp_path / "run")
    create_run(run_dir, config, None)
    order = iter(["zero-shot", "bash"])
    runner = Runner(run_dir, config, [problem], model_factory=lambda: models[next(order)], eval_config=eval_config(),
                    scheduler=DeviceScheduler("cpu", 2, cpu_slots=1))
    summary = runner.run()
    by = {r["condition"]: r for r in summary.records}
    zero = by["zero-shot"]
    assert zero["verdict"] == "correct" and zero["prompt"]["name"] == "pkb"
    assert zero["prompt"]["extraction"] == "pkb:first-python-block" and zero["prompt"]["kind"] == "generate_kernel"
    assert zero["held_out"]["shapes"][0]["shape"] == "held-out:small" and zero["correct"] is True
    system, user = models["zero-shot"].calls[0]["messages"][:2]
    assert system.content == "Fixture system text: kernels only.\n\nKeep the signature."
    assert user.content.startswith("Fixture statement:") and "save it as solutions_cuda_bf16_h100_8_" in user.content
    shell = by["bash"]
    assert shell["verdict"] == "correct" and shell["prompt"]["kind"] == "generate_kernel_agent"
    assert shell["prompt"]["extraction"] == f"shell-file:{rel}"
    task = models["bash"].calls[0]["messages"][1].content
    assert task.startswith("Fixture task in ") and f"run pkb-check {rel} on {rel}" in task
    first_answer = models["bash"].calls[1]["messages"][-1].content
    assert "1_all_reduce.py" in first_answer  # PKB's reference path exists in the scratch folder


@pytest.mark.slow
def test_validate_checks_the_held_out_shape_against_the_oracle(tmp_path: Path) -> None:
    from harness.validate import validate_problems

    problem = get(load_suite(), "all_reduce")
    rows = validate_problems([problem], [2], shape="small", trials=2)
    assert [(v.shape, v.ok) for v in rows] == [("small", True), ("held-out:small", True)]
    source = problem.path.read_text()
    start = source.index('    "held_out": {')
    folder = tmp_path / "collective"
    folder.mkdir()
    (folder / "all_reduce.py").write_text(source[:start] + source[source.index("    },\n", start) + 7:])
    bare = load_problem(folder / "all_reduce.py")
    (row,) = validate_problems([bare], [2], shape="small", trials=2)
    assert row.verdict == "contract" and "no held-out shape for 'small'" in row.message
