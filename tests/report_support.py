"""Shared by the report tests: a run directory of chosen outcomes, and the rows of its markdown and HTML tables."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

PROBLEMS = (("all_reduce", "collective"), ("all_gather", "collective"), ("ulysses_all_to_all", "sequence"))


# (verdict, speedup, roofline fraction) per condition, problem and sample: the agent does better.
Outcome = tuple[str, float | None, float | None]
OUTCOMES: dict[str, dict[str, list[Outcome]]] = {
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


def write_payload(path: Path, payload) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload, indent=1))


# result.json's `failure` of an infra_error, as harness.evaluate writes them (agent.report.accounting reads the cause)
SANDBOX_FAILURE = {"verdict": "infra_error", "phase": "launch", "infra_cause": "sandbox",
                   "message": "PKB_SANDBOX=require and no sandbox can be started here: bwrap: setting up uid map"}
MULTICAST_FAILURE = {"verdict": "infra_error", "phase": "check", "infra_cause": "emulation",
                     "message": "not available in emulation: cuMulticastCreate: one GPU has no multicast [multicast]"}


def make_run(root: Path, run_id: str = "run-a", outcomes: dict = OUTCOMES, samples: int | None = 3, *,
             usage: dict[str, dict] | None = None, failures: dict[str, dict] | None = None, **config) -> Path:
    """A run directory in docs/run-layout.md's format, with transcripts and candidates. `usage` adds keys to
    a condition's sample usage (e.g. cost_known); `failures` maps a verdict to the `failure` its samples'
    result.json carries (e.g. {"infra_error": SANDBOX_FAILURE}); `config` overrides run.json's config. Called
    again on the same folder it writes the samples anew (what a resumed run that judged them leaves)."""
    run = root / run_id
    conditions = list(outcomes)
    write_payload(run / "run.json", {
        "schema": "pkb-run/1", "run_id": run_id, "created_at": "2026-11-29T19:00:00+00:00",
        "config": {"model": "scripted:demo", "conditions": conditions, "samples": samples,
                   "problems": [p for p, _ in PROBLEMS], "device": "cpu", "world_size": 2, "shape": "small",
                   "budgets": {"max_turns": 8}, "seed": 0, **config},
        "versions": {"pkb_agent": "0.1.0", "torch": "2.13.0", "python": "3.11"},
        "prompt_hashes": {"system.md": "0" * 64}, "topology": None, "environment": {},
    })
    (run / "events.jsonl").write_text("")
    for condition in conditions:
        for problem, category in PROBLEMS:
            for k, (verdict, speedup, roof) in enumerate(outcomes[condition][problem]):
                d = run / "samples" / problem / condition / str(k)
                agent = condition.startswith("agent")
                write_payload(d / "sample.json", {
                    "schema": "pkb-sample/1", "problem": problem, "category": category, "condition": condition,
                    "sample": k, "model": "scripted:demo", "status": "finished",
                    "stop_reason": "no_code" if verdict == "no_code" else ("submitted" if agent else "zero_shot"),
                    "verdict": verdict, "correct": verdict == "correct", "speedup": speedup, "flags": [],
                    "roofline_fraction": roof,
                    "usage": {"input_tokens": 1200 * (3 if agent else 1), "output_tokens": 300, "cost_usd": 0.01,
                              **(usage or {}).get(condition, {})},
                    "turns": 3 if agent else 1, "tool_calls": {"check": 1, "compile": 1} if agent else {},
                    "wall_s": 10.0, "gpu_s": 2.0 if agent else 0.5,
                    "started_at": "2026-11-29T19:00:01+00:00", "finished_at": "2026-11-29T19:00:11+00:00",
                })
                transcript: list[dict[str, Any]] = [
                    {"role": "system", "content": "You write multi-GPU kernels."},
                    {"role": "user", "content": f"Problem {problem}. {HOSTILE}"},
                ]
                if verdict != "no_code":
                    code = f"# candidate for {problem}\ndef solution(x):\n    return x  # {HOSTILE}\n"
                    write_payload(d / "candidates" / "000.py", code)
                    write_payload(d / "candidates" / "000.json",
                                  {"tool": "check" if agent else "submit", "verdict": verdict})
                    write_payload(d / "final.py", code)
                    write_payload(d / "result.json", {"schema_version": 1, "problem": problem, "verdict": verdict,
                                               "correct": verdict == "correct", "speedup": speedup,
                                               "failure": (failures or {}).get(verdict)})
                    transcript.append({"role": "assistant", "content": "Here is a kernel.",
                                       "candidate": "candidates/000.py",
                                       "tool_calls": [{"id": "c1", "name": "check", "args": {"trials": 2}}]
                                       if agent else [],
                                       "usage": {"input_tokens": 1200, "output_tokens": 300}})
                    if agent:
                        transcript.append({"role": "tool", "tool_call_id": "c1", "name": "check",
                                           "content": f"verdict: {verdict}"})
                write_payload(d / "transcript.json", transcript)
    return run


def md_rows(text: str, header: str) -> list[list[str]]:
    """The body rows of the markdown table whose header line starts with `header`, as cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def html_rows(page: str, table_id: str) -> list[list[str]]:
    """The body rows of <table id=table_id>, as unescaped cell texts."""
    table = re.search(rf'<table id="{table_id}">(.*?)</table>', page, re.S)
    assert table, f"no table {table_id}"
    body = table.group(1).split("</thead>", 1)[1]
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
