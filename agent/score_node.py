"""The graph's `score` node: the submitted candidate, or else the last one (bash: the scratch folder's solution
file as the session ended), copied to final.py and scored finally (agent.sample_scoring), with the best
candidate by the tools' evidence scored apart. A search's proposer only names the file (NodeContext.score_final)."""

from __future__ import annotations

import hashlib
from typing import Any

from agent import sample_scoring
from agent.budgets import Spent
from agent.conditions import BASH
from agent.graph_state import MODEL_ENDED, NO_CODE, SUBMITTED, AgentState, NodeContext, drop_orphans, progress
from agent.rundir import write_bytes_atomic
from agent.sample_context import SampleContext
from agent.stop_reasons import checked
from agent.tool_calls import reply_candidate
from tools import bash as shell


def score(nodes: NodeContext, state: AgentState) -> dict[str, Any]:
    ctx, log = nodes.sample, nodes.log
    candidates = list(state.get("candidates") or [])
    update: dict[str, Any] = {}
    if ctx.condition.kind == BASH:  # the file in the scratch folder is the answer, as PKB's agent's is
        drop_orphans(ctx, state)
        final, added = _shell_file(ctx, candidates, Spent.from_dict(state.get("spent")))
        if added:
            update["candidates"] = candidates
        update["submitted"] = final
        if final is None and state.get("stop_reason") == SUBMITTED:
            update["stop_reason"] = NO_CODE
    else:
        final = state.get("submitted") or (candidates[-1]["path"] if candidates else None)
    reason = checked(update.get("stop_reason", state.get("stop_reason")))  # an unknown reason fails here
    if final is not None and reason == NO_CODE:  # a scored sample never says no_code
        update["stop_reason"] = MODEL_ENDED
    if final is None or not nodes.score_final:
        return {**update, "result": None, "held_out": [], "best": None,
                "scoring": {"seconds": 0.0, "gpu_s": 0.0, "attempts": 0, "final": final}}
    write_bytes_atomic(ctx.directory.final_py, (ctx.directory.path / final).read_bytes())
    scored = sample_scoring.score_file(ctx, ctx.directory.final_py, log_dir=ctx.directory.logs)
    if log is not None:
        log.info("scored", final=final, verdict=scored.result.verdict, speedup=scored.result.speedup,
                 seconds=round(scored.visible.seconds, 3), attempts=scored.visible.attempts,
                 held_out=[(h["shape"], h["verdict"]) for h in scored.shapes])
    best = sample_scoring.score_best(ctx, candidates, final)
    out = scored.state()
    out["scoring"].update(seconds=out["scoring"]["seconds"] + float((best or {}).get("seconds") or 0.0),
                          gpu_s=out["scoring"]["gpu_s"] + float((best or {}).get("gpu_s") or 0.0), final=final)
    return {**update, **out, "best": best}


def _shell_file(ctx: SampleContext, candidates: list[dict[str, Any]], spent: Spent) -> tuple[str | None, bool]:
    """The bash condition's solution file as the session ended: (its candidate path, whether that is a new
    entry); the last candidate's path when the file is unchanged since the last check, (None, False) when
    there is no such file."""
    text, _ = shell.read_file(ctx.directory.path / shell.SHELL_DIR, ctx.shell_solution)
    if text is None or not text.strip():
        return None, False
    text = text if text.endswith("\n") else text + "\n"
    if candidates and candidates[-1].get("sha256") == hashlib.sha256(text.encode()).hexdigest():
        return str(candidates[-1]["path"]), False
    entry = reply_candidate(ctx, text, None, source="shell", **progress(spent))
    candidates.append(entry)
    return str(entry["path"]), True
