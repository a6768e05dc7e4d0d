"""One sample's life in its folder (docs/run-layout.md): run, scored, written; an infra_error judged again.

A model sample runs its graph (agent.graph) from its LangGraph checkpoint where one exists, so the turns it
already took are neither repeated nor counted twice; a replayed file is scored as it is. sample.json is written
first as running, and last as finished, after the transcript, the candidates and result.json, so a sample killed
at any moment is either finished with all its files or unfinished. A sample whose final scoring ended in
infra_error is judged again (`judge_again`) with the earlier judgement's records set aside in attempts/<n>/.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage

from agent import final_scoring, sample_scoring
from agent.budgets import Spent
from agent.conditions import BASH, REPLAY, Condition
from agent.context import ContextPolicy
from agent.executors.interface import Executor
from agent.graph import REPLAYED, TransientProviderError, build_graph, opening, recursion_limit, write_transcript
from agent.prompting import PromptChoice
from agent.run_config import RunConfig, RunError
from agent.run_records import attempt_entry, failure_line, judgement, now, sample_record
from agent.rundir import FINISHED, RUNNING, RunDir, SampleDir, read_json, write_bytes_atomic, write_json_atomic
from agent.sample_context import SampleContext
from agent.sample_spec import SampleSpec
from agent.scheduler import DeviceScheduler
from agent.scripted import ScriptedChatModel
from agent.tool_calls import tool_context
from agent.usage import PriceTable
from harness.config import EvalConfig
from harness.problems.problem import Problem
from tools.bash import prepare as prepare_shell

Record = dict[str, Any]


@dataclass(frozen=True)
class SampleLife:
    """The samples of one run directory, one at a time each (the run loop runs several at once), under the
    run's settings (agent.runner.Runner holds them)."""

    run_dir: RunDir
    config: RunConfig
    eval_config: EvalConfig  # what the tools evaluate with; the final scoring uses scoring_seed(seed)
    prices: PriceTable | None
    topology: dict[str, Any] | None  # the saved topology profile, for the prompt
    policy: ContextPolicy
    prompt: PromptChoice  # which prompt the samples open with (agent.prompting)
    scheduler: DeviceScheduler | None  # this node's devices (None only with an executor)
    executor: Executor | None  # where evaluations go when not on this node's scheduler
    model_factory: Callable[[], BaseChatModel]
    saver: Any  # LangGraph's SqliteSaver over the run's checkpoints
    log: Any  # the run's event log

    def run_through(self, spec: SampleSpec) -> Record:
        """One sample, start to sample.json; resumes from its checkpoint where one exists."""
        sdir = self.run_dir.sample(spec.problem.name, spec.condition.name, spec.k)
        sdir.remove_leftovers()
        previous = sdir.record() or {}
        started_at = previous.get("started_at") or now()
        log = self.log.bind(problem=spec.problem.name, condition=spec.condition.name, sample=spec.k)
        log.info("sample_started", resumed=bool(previous))
        write_json_atomic(sdir.sample_json, sample_record(spec, self.config.model, status=RUNNING,
                                                          started_at=started_at))
        try:
            if spec.condition.kind == REPLAY:
                state = _replay(self._context(spec.problem, spec.condition, sdir, log, None), spec.file)
            else:
                ctx = self._context(spec.problem, spec.condition, sdir, log, self.model_factory())
                state = self._converse(ctx, spec.thread_id)
        except TransientProviderError as err:
            log.warning("sample_interrupted", error=str(err))
            write_json_atomic(sdir.sample_json, sample_record(spec, self.config.model, status=RUNNING,
                                                              started_at=started_at, error=str(err)))
            raise
        write_transcript(sdir, state.get("messages") or [], state.get("candidates") or [])
        if state.get("result") is not None:
            write_json_atomic(sdir.result_json, state["result"])
        else:
            sdir.result_json.unlink(missing_ok=True)  # left by an earlier attempt that was killed
        record = sample_record(spec, self.config.model, status=FINISHED, started_at=started_at, state=state,
                               finished_at=now())
        write_json_atomic(sdir.sample_json, record)  # last: this is what makes the sample finished
        if spec.condition.uses_model:
            self.saver.delete_thread(spec.thread_id)  # its files hold it now; deleting the folder redoes it
        log.info("sample_finished", stop_reason=record["stop_reason"], verdict=record["verdict"],
                 speedup=record["speedup"], turns=record["turns"], cost_usd=record["usage"]["cost_usd"])
        return record

    def _converse(self, ctx: SampleContext, thread_id: str) -> dict[str, Any]:
        """A model sample's graph, from its checkpoint (LangGraph thread `thread_id`) where one exists."""
        thread = {"configurable": {"thread_id": thread_id}, "recursion_limit": recursion_limit(ctx.budget)}
        first = opening(ctx)
        ctx.shell_solution = first.solution_file
        if ctx.condition.kind == BASH:  # its scratch folder, with the files the prompt names
            prepare_shell(tool_context(ctx, gpus=None), first.shell_files)
        snapshot = build_graph(ctx, self.saver).get_state(thread)
        values = snapshot.values or {}
        if "scoring" in values:  # the score node had run; only the files were not written
            ctx.log.info("sample_recovered")
            return dict(values)
        # durability="sync": a step's checkpoint is on disk before the next step starts, so a kill during a
        # tool call resumes at that tool call (LangGraph's default writes checkpoints in the background).
        if values:
            ctx.model = _resumed(ctx.model, values.get("messages") or [])
            ctx.log.info("sample_resumed", next=list(snapshot.next),
                         turns=Spent.from_dict(values.get("spent")).turns)
            return dict(build_graph(ctx, self.saver).invoke(None, thread, durability="sync"))
        start = {"messages": first.messages, "spent": Spent().as_dict(), "candidates": [],
                 "stop_reason": None, "submitted": None, "prompt": first.record}
        return dict(build_graph(ctx, self.saver).invoke(start, thread, durability="sync"))

    def _context(self, problem: Problem, condition: Condition, sdir: SampleDir, log: Any,
                 model: BaseChatModel | None) -> SampleContext:
        """What the sample's graph, tools and scoring need that is not state (None: no model)."""
        return SampleContext(
            problem=problem, condition=condition, model=model, run=self.config, directory=sdir, prices=self.prices,
            config=self.eval_config, scheduler=self.scheduler, topology=self.topology, log=log,
            executor=self.executor, context_policy=self.policy, prompt=self.prompt)

    def judge_again(self, spec: SampleSpec, after_wait_s: float | None = None) -> Record:
        """A finished sample that ended in infra_error, judged again: its final.py scored anew (the same request:
        same seed, same shapes). The model's work (transcript, candidates, usage, best) is kept as it was; the
        earlier judgement's sample.json, result.json and logs/ are set aside in attempts/<n>/ first, and the new
        sample.json (written last, as always) lists every judgement in `attempts`. A pass killed midway leaves
        the earlier, finished record in place, to be judged again."""
        sdir = self.run_dir.sample(spec.problem.name, spec.condition.name, spec.k)
        previous = sdir.record()
        if previous is None or previous.get("status") != FINISHED or not sdir.final_py.is_file():
            raise RunError(f"{spec.thread_id}: no finished judgement with a final.py to judge again")
        log = self.log.bind(problem=spec.problem.name, condition=spec.condition.name, sample=spec.k)
        history = [dict(a) for a in previous.get("attempts") or []] or [
            attempt_entry(previous, 1, failure_line({"result": read_json(sdir.result_json),
                                                     "held_out": (previous.get("held_out") or {}).get("shapes")}))]
        n = len(history)
        history[-1]["kept"] = _keep_aside(sdir, n, previous)
        log.info("sample_judged_again", judgement=n + 1, after_wait_s=after_wait_s,
                 earlier_infra_cause=previous.get("infra_cause"))
        ctx = self._context(spec.problem, spec.condition, sdir, log, None)
        state = sample_scoring.score_file(ctx, sdir.final_py, log_dir=sdir.logs).state()
        write_json_atomic(sdir.result_json, state["result"])
        scoring = state["scoring"]
        record = {**previous, **judgement(state), "status": FINISHED, "finished_at": now(),
                  # the sample's time and device time include every judgement
                  "wall_s": round(float(previous.get("wall_s") or 0.0) + scoring["seconds"], 3),
                  "gpu_s": round(float(previous.get("gpu_s") or 0.0) + scoring["gpu_s"], 3)}
        record["attempts"] = [*history, attempt_entry(record, n + 1, failure_line(state), after_wait_s=after_wait_s)]
        write_json_atomic(sdir.sample_json, record)
        log.info("sample_finished", stop_reason=record.get("stop_reason"), verdict=record["verdict"],
                 speedup=record["speedup"], judgement=n + 1, infra_cause=record["infra_cause"])
        return record


def _replay(ctx: SampleContext, file: Path | None) -> dict[str, Any]:
    """A replayed solution file as the sample's only candidate and final.py, scored finally (None: no file)."""
    state: dict[str, Any] = {"messages": [], "candidates": [], "stop_reason": REPLAYED, "result": None}
    if file is None:
        return state
    sdir = ctx.directory
    path = sdir.candidate(0)
    write_bytes_atomic(path, file.read_bytes())
    write_json_atomic(path.with_suffix(".json"), {"source": "replay", "file": str(file)})
    state["candidates"] = [{"index": 0, "path": sdir.relative(path), "tool": None, "tool_call_id": None,
                            "message_id": None, "verdict": None}]
    write_bytes_atomic(sdir.final_py, file.read_bytes())
    state.update(sample_scoring.score_file(ctx, sdir.final_py, log_dir=sdir.logs).state())
    state["scoring"]["final"] = sdir.relative(path)
    ctx.log.info("scored", file=str(file), verdict=state["result"]["verdict"],
                 seed=final_scoring.scoring_seed(ctx.config.seed))
    return state


def _keep_aside(sdir: SampleDir, n: int, previous: Record) -> str:
    """The n-th judgement's records into attempts/<n>/ (copies of sample.json and result.json, the rank logs
    moved): nothing of it is lost when the next judgement writes the sample's own files. Returns the folder,
    relative to the sample's."""
    folder = sdir.attempts / str(n)
    write_json_atomic(folder / sdir.sample_json.name, previous)
    if sdir.result_json.is_file():
        write_bytes_atomic(folder / sdir.result_json.name, sdir.result_json.read_bytes())
    target = folder / sdir.logs.name
    if sdir.logs.is_dir() and target.exists():  # a pass killed after moving them: what is here is the
        shutil.rmtree(sdir.logs)  # unfinished judgement's, which has no verdict
    elif sdir.logs.is_dir():
        sdir.logs.rename(target)
    return sdir.relative(folder)


def _resumed(model: BaseChatModel | None, messages: list[Any]) -> BaseChatModel | None:
    """A scripted model picks up at the reply the checkpoint is waiting for (a real one needs nothing)."""
    answered = sum(1 for m in messages if isinstance(m, AIMessage))
    if isinstance(model, ScriptedChatModel) and answered:
        return ScriptedChatModel(script=model.script[answered:], script_name=model.script_name, usage=model.usage)
    return model
