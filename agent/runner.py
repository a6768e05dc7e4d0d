"""The experiment runner: every (problem, condition, sample) of a run, concurrently and resumably.

Everything goes under runs/<run_id>/ as docs/run-layout.md says, each file written atomically. A sample
is done when its sample.json says `"status": "finished"`; that file is written last, after the
transcript, the candidates and result.json, so a run killed at any moment has either a finished sample
with all its files or an unfinished one. On resume a finished sample is never redone; an unfinished
agent sample continues from its LangGraph checkpoint (runs/<id>/checkpoints.sqlite, thread
"<problem>/<condition>/<k>"), so the turns it already took are neither repeated nor counted twice.

Samples run in `concurrency` threads; their evaluations share the devices through one DeviceScheduler, or,
with a Ray executor (agent.executors.ray_cluster), go to a cluster as tasks while the agent loops stay here. The
executor is not part of the run's config: a run started on one executor resumes on the other.
What is not the model's fault is reported apart: an infra_error of the final scoring (retried, see
agent.final_scoring), provider outages that outlast the retries (the sample stays unfinished for
`--resume`), and internal errors (logged with their traceback in events.jsonl).
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage

import prompts
from agent import final_scoring, interrupts, manifest
from agent.budgets import Spent
from agent.conditions import BASH, REPLAY, Condition
from agent.context import ContextPolicy
from agent.eventlog import open_event_log
from agent.executors.interface import Executor, as_evaluate
from agent.executors.local import LocalExecutor
from agent.graph import (
    NO_CODE,
    REPLAYED,
    FatalProviderError,
    TransientProviderError,
    build_graph,
    opening,
    recursion_limit,
    write_transcript,
)
from agent.providers import make_chat_model, parse_model_spec
from agent.replay import ReplaySet
from agent.run_config import DEFAULT_INFRA_WAITS_S as DEFAULT_INFRA_WAITS_S  # re-exported: the run's settings' home
from agent.run_config import RunConfig as RunConfig
from agent.run_config import RunError as RunError
from agent.run_config import load_run_config as load_run_config
from agent.rundir import (
    FINISHED,
    RUN_SCHEMA,
    RUNNING,
    SAMPLE_SCHEMA,
    RunDir,
    SampleDir,
    read_json,
    write_bytes_atomic,
    write_json_atomic,
)
from agent.sample_context import SampleContext
from agent.scheduler import DeviceScheduler
from agent.scripted import ScriptedChatModel
from agent.stop_reasons import checked
from agent.tool_calls import tool_context
from agent.usage import PriceTable
from agent.versions import versions
from harness import cancel
from harness.common import failures
from harness.common.flags import is_emulated
from harness.config import EvalConfig
from harness.measure import topology
from harness.measure.discovery import TopologyError
from harness.problems.problem import Problem
from harness.records.environment import environment
from tools.bash import prepare as prepare_shell


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped the run: the running samples' evaluations were stopped, queued samples never
    started, finished ones are on disk. `still_running`: sample threads left in a model call (the caller ends the
    process without waiting for them)."""

    def __init__(self, summary: RunSummary, still_running: int) -> None:
        super().__init__(f"run {summary.run_id} interrupted: {len(summary.records)} of {summary.total} finished")
        self.summary = summary
        self.still_running = still_running


@dataclass(frozen=True)
class SampleSpec:
    problem: Problem
    condition: Condition
    k: int
    file: Path | None = None  # replay: the solution file (None: the directory has none for this problem)

    @property
    def thread_id(self) -> str:
        return f"{self.problem.name}/{self.condition.name}/{self.k}"


@dataclass(frozen=True)
class _Job:
    """A sample to run, or (`again`) to judge again after `after_wait_s`."""

    spec: SampleSpec
    again: bool = False
    after_wait_s: float | None = None


@dataclass(frozen=True)
class _Later:
    """An infra_error sample waiting until `due` (the runner's clock) to be judged again; `record` is on disk."""

    due: float
    spec: SampleSpec
    record: dict[str, Any]
    wait_s: float


def is_infra(record: dict[str, Any] | None) -> bool:
    """A finished sample whose verdict is the harness's failure, not the model's."""
    return record is not None and record.get("verdict") == failures.INFRA_ERROR


@dataclass
class RunSummary:
    run_id: str
    total: int
    records: list[dict[str, Any]] = field(default_factory=list)  # finished samples (this call and before)
    skipped: int = 0  # finished before this call: not redone
    interrupted: list[str] = field(default_factory=list)  # provider outages: unfinished, --resume continues
    errors: list[str] = field(default_factory=list)  # internal errors: unfinished
    fatal: str | None = None  # the provider error that ended the run

    @property
    def infra_records(self) -> list[dict[str, Any]]:
        """Finished samples still in infra_error: the run is incomplete while there are any."""
        return [r for r in self.records if is_infra(r)]

    @property
    def infra_errors(self) -> int:
        return len(self.infra_records)

    @property
    def complete(self) -> bool:
        return len(self.records) == self.total


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- run.json ---------------------------------------------------------------------------------------
def topology_record(device: str) -> dict[str, Any] | None:
    """The saved topology profile (`pkb topology`), on CUDA runs; None on CPU or where none is saved."""
    if device != "cuda":
        return None
    try:
        profile = topology.load()
    except TopologyError:
        return None
    return profile.model_dump(mode="json") if profile is not None else None


def run_header(run_id: str, config: RunConfig, prices: PriceTable | None, *, problems: Sequence[Problem] = (),
               executor: str | None = None) -> dict[str, Any]:
    dumped = config.model_dump(mode="json")
    hashes = prompts.hashes()
    env = environment()
    return {
        "schema": RUN_SCHEMA,
        "run_id": run_id,
        "created_at": now(),
        "config": dumped,
        "versions": versions(),
        "prompt_hashes": hashes,
        "prices": {"source": prices.source, "version": prices.version} if prices is not None else None,
        "topology": topology_record(config.device),
        "environment": env,
        # agent.manifest: the code's commit, the problems' hashes, the hardware: what a comparison must hold equal
        "manifest": manifest.build(dumped, problem_hashes=manifest.problem_hashes(problems), prompt_hashes=hashes,
                                   environment=env, executor=executor),
    }


def create_run(run_dir: RunDir, config: RunConfig, prices: PriceTable | None, *, problems: Sequence[Problem] = (),
               executor: str | None = None) -> dict[str, Any]:
    """Start a new run: refuse an existing one (it needs --resume). `problems` and `executor` go into its manifest."""
    if run_dir.run_json.exists():
        raise RunError(f"run {run_dir.path} already exists; add --resume to continue it, or pick another --run-id")
    run_dir.path.mkdir(parents=True, exist_ok=True)
    header = run_header(run_dir.path.name, config, prices, problems=problems, executor=executor)
    write_json_atomic(run_dir.run_json, header)
    return header


# -- records ----------------------------------------------------------------------------------------
def roofline_fraction(result: dict[str, Any] | None) -> float | None:
    """The candidate's fraction of the hardware bound (harness.measure.roofline: roofline.candidate.fraction)."""
    roofline = (result or {}).get("roofline")
    achieved = roofline.get("candidate") if isinstance(roofline, dict) else None
    value = achieved.get("fraction") if isinstance(achieved, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


MAX_MESSAGE_CHARS = 300  # an attempt's failure line in sample.json


def judgement(state: dict[str, Any]) -> dict[str, Any]:
    """The fields of sample.json that the final scoring decides (`result`, `held_out` and `scoring` of the state):
    one place for a first judgement and a judgement again (Runner.rejudge)."""
    result = state.get("result")
    scoring = state.get("scoring") or {}
    overall = final_scoring.combined(result, state.get("held_out"))
    verdict = overall["verdict"] if result else NO_CODE
    failure = (result or {}).get("failure") or {}
    return {
        "verdict": verdict,
        # correct on the visible shape and on every held-out shape (agent.final_scoring); both figures kept
        "correct": overall["correct"],
        "correct_visible": overall["correct_visible"],
        "held_out": {"correct": overall["held_out_correct"], "shapes": list(state.get("held_out") or [])},
        "speedup": result.get("speedup") if result else None,
        "flags": list(result.get("flags") or []) if result else [],
        # False when an integrity flag (harness.common.integrity.SPEEDUP_DISQUALIFIERS) voids the speedup for fast_p;
        # results written before the harness had the field count as eligible.
        "fast_eligible": bool(result.get("fast_eligible", True)) if result else False,
        # True when ranks shared GPUs (harness.emulation): the speedup is recorded, never counted.
        "emulated": is_emulated(result) if result else False,
        "roofline_fraction": roofline_fraction(result),
        "scoring_seed": result.get("seed") if result else None,
        "scoring_attempts": scoring.get("attempts", 0),
        # infra_error: which of harness.common.failures.INFRA_CAUSES (null: a held-out shape's, or an older result)
        "infra_cause": (failure.get("infra_cause") if verdict == failures.INFRA_ERROR
                        and (result or {}).get("verdict") == failures.INFRA_ERROR else None),
    }


def failure_line(state: dict[str, Any]) -> str | None:
    """The first line of the message of the failure that decided the verdict (a held-out shape's when only that
    failed), at most MAX_MESSAGE_CHARS; None when correct or without code."""
    result = state.get("result")
    if not result or final_scoring.combined(result, state.get("held_out"))["correct"]:
        return None
    text = str((result.get("failure") or {}).get("message") or "")
    if result.get("correct"):
        text = next((str(h.get("message") or "") for h in state.get("held_out") or [] if not h.get("correct")), text)
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:MAX_MESSAGE_CHARS]


def attempt_entry(record: dict[str, Any], attempt: int, message: str | None, *, after_wait_s: float | None = None,
                  kept: str | None = None) -> dict[str, Any]:
    """One judgement of a sample in sample.json's `attempts`: its verdict and infra cause, when it ended, the wait
    before it, and `kept`: the folder its records were set aside in (null: the sample's own files, the last)."""
    return {"attempt": attempt, "verdict": record.get("verdict"), "infra_cause": record.get("infra_cause"),
            "message": message, "finished_at": record.get("finished_at"), "after_wait_s": after_wait_s,
            "kept": kept}


def sample_record(spec: SampleSpec, model: str, *, status: str, started_at: str, state: dict[str, Any] | None = None,
                  finished_at: str | None = None, error: str | None = None) -> dict[str, Any]:
    """sample.json (docs/run-layout.md)."""
    state = state or {}
    spent = Spent.from_dict(state.get("spent"))
    scoring = state.get("scoring") or {}
    record: dict[str, Any] = {
        "schema": SAMPLE_SCHEMA,
        "problem": spec.problem.name,
        "category": spec.problem.category,
        "condition": spec.condition.name,
        "sample": spec.k,
        "model": model,
        "status": status,
        "stop_reason": checked(state.get("stop_reason")),
        **judgement(state),
        "usage": {"input_tokens": spent.input_tokens, "output_tokens": spent.output_tokens,
                  "cache_read_tokens": spent.cache_read_tokens, "cache_write_tokens": spent.cache_write_tokens,
                  "reasoning_tokens": spent.reasoning_tokens,
                  "cost_usd": round(spent.cost_usd, 6),
                  # cost_usd is 0 where the price table does not list the model: this says so
                  "cost_known": spent.cost_known,
                  "usage_reported": spent.usage_reported},
        "turns": spent.turns,
        "tool_calls": dict(spent.tool_calls),
        "wall_s": round(spent.wall_s + float(scoring.get("seconds") or 0.0), 3),
        "gpu_s": round(spent.gpu_s + float(scoring.get("gpu_s") or 0.0), 3),
        "candidates": len(state.get("candidates") or []),
        # agent.context: how many old candidates the requests carried as references, in how many batches
        "context": {"shortened": len((state.get("context") or {}).get("shortened") or []),
                    "batches": int((state.get("context") or {}).get("batches") or 0)},
        "final": "final.py" if scoring.get("final") else None,
        "prompt": state.get("prompt"),  # which prompt and which extraction rule (agent.prompting)
        "best": state.get("best"),  # the best candidate by the tools' evidence, scored apart
        "trajectory": final_scoring.trajectory(state.get("candidates") or []),
        "started_at": started_at,
        "finished_at": finished_at,
    }
    if status == FINISHED:  # every judgement of the sample; Runner.rejudge adds one per judgement again
        record["attempts"] = [attempt_entry(record, 1, failure_line(state))]
    if error or state.get("error"):
        record["error"] = error or state.get("error")
    return record


# -- the runner -------------------------------------------------------------------------------------
class Runner:
    """Runs the samples of one run directory. `run()` may be called on a fresh or a partly done run."""

    def __init__(
        self,
        run_dir: RunDir,
        config: RunConfig,
        problems: Sequence[Problem],
        *,
        concurrency: int = 1,
        prices: PriceTable | None = None,
        replay: ReplaySet | None = None,
        scheduler: DeviceScheduler | None = None,
        executor: Executor | None = None,
        model_factory: Callable[[], BaseChatModel] | None = None,
        eval_config: EvalConfig | None = None,
        on_sample: Callable[[dict[str, Any], bool], None] | None = None,
        retry_infra_only: bool = False,
        sleep: Callable[[float], None] = cancel.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if concurrency < 1:
            raise RunError(f"concurrency must be at least 1, got {concurrency}")
        self.run_dir = run_dir
        self.config = config
        self.problems = list(problems)
        self.concurrency = concurrency
        self.prices = prices
        self.replay = replay
        if isinstance(executor, LocalExecutor):  # this node: the graph's own leases of its scheduler
            scheduler = scheduler or executor.scheduler  # type: ignore[assignment]
            executor = None
        # remote: where every evaluation goes (the caller closes it); None: this node, through `scheduler`
        self.remote = executor
        if executor is None:
            self.scheduler: DeviceScheduler | None = scheduler or DeviceScheduler(
                config.device, config.world_size, ranks_per_gpu=config.ranks_per_gpu)
        else:
            self.scheduler = scheduler  # unused: the driver may have no devices at all
        self.spec = parse_model_spec(config.model)
        self.model_factory = model_factory or self._default_model_factory
        self.eval_config = eval_config or config.eval_config()
        self.on_sample = on_sample
        # `pkb run --retry-infra`: judge again the samples that ended in infra_error, and run nothing else
        self.retry_infra_only = retry_infra_only
        # The waits between judgements of an infra_error (config.infra_waits_s): `sleep` (by default one that Ctrl-C
        # ends at once, with harness.cancel.Cancelled) and `clock` are injectable, so tests never wait.
        self._sleep = sleep
        self._clock = clock
        # Called at once on Ctrl-C with the number of running samples, before they are stopped (the CLI says so).
        self.on_interrupt: Callable[[int], None] | None = None
        self.topology = topology_record(config.device)
        self.conditions = config.parsed_conditions
        self.prompt_choice = config.prompt_choice
        self.models = config.model_table() if self.spec.is_chat_model else None
        self.policy = config.context_policy(self.models) if self.models is not None else ContextPolicy(None)
        self._abort = threading.Event()
        self._saver: Any = None
        self.log: Any = None

    def _default_model_factory(self) -> BaseChatModel:
        return make_chat_model(self.spec, base_url=self.config.base_url, api_key_env=self.config.api_key_env,
                               temperature=self.config.temperature, max_output_tokens=self.config.max_reply_tokens,
                               reasoning=self.config.reasoning, models=self.models)

    # -- what to run --------------------------------------------------------------------------------
    def plan(self) -> list[SampleSpec]:
        """Every sample of the run, sample index first so early results cover every problem."""
        specs: list[SampleSpec] = []
        if any(c.kind == REPLAY for c in self.conditions):
            if self.replay is None:
                raise RunError("a replay run needs its solution directory")
            condition = Condition(REPLAY)
            for problem in self.problems:
                files = self.replay.solutions(problem.name)
                if self.config.samples is not None:
                    files = files[: self.config.samples]
                specs.extend(SampleSpec(problem, condition, k, f) for k, f in enumerate(files))
                if not files:
                    specs.append(SampleSpec(problem, condition, 0, None))
            return specs
        samples = self.config.samples or 1
        for k in range(samples):
            for problem in self.problems:
                specs.extend(SampleSpec(problem, c, k) for c in self.conditions)
        return specs

    def is_finished(self, spec: SampleSpec) -> bool:
        record = self.run_dir.sample(spec.problem.name, spec.condition.name, spec.k).record()
        return record is not None and record.get("status") == FINISHED

    # -- running ------------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        from langgraph.checkpoint.sqlite import SqliteSaver

        from agent.checkpoint_serde import RedactingSerializer  # deferred with LangGraph's saver

        specs = self.plan()
        summary = RunSummary(run_id=self.run_dir.path.name, total=len(specs))
        self.log, handle = open_event_log(self.run_dir.events)
        if self.scheduler is not None:  # every lease in events.jsonl: a run stopped mid-way says who queued, who held
            self.scheduler.listener = lambda event, fields: self.log.info(event, **fields)
        conn = sqlite3.connect(str(self.run_dir.checkpoints), check_same_thread=False)
        self._saver = SqliteSaver(conn, serde=RedactingSerializer())
        self._saver.setup()
        lock = threading.Lock()
        left = 0  # sample threads still running after Ctrl-C
        waits = list(self.config.infra_waits_s)
        judged: dict[str, int] = {}  # judgements of each sample in this pass
        later: list[_Later] = []  # infra_error samples waiting to be judged again
        try:
            pending: list[_Job] = []
            for spec in specs:
                record = self.run_dir.sample(spec.problem.name, spec.condition.name, spec.k).record()
                finished = record is not None and record.get("status") == FINISHED
                if finished and is_infra(record):  # the harness's failure: judged again (--resume, --retry-infra)
                    pending.append(_Job(spec, again=True))
                elif finished:
                    assert record is not None
                    summary.records.append(record)
                    summary.skipped += 1
                    if self.on_sample:
                        self.on_sample(record, True)
                elif not self.retry_infra_only:
                    pending.append(_Job(spec))
            self.log.info("run_started", run_id=summary.run_id, total=len(specs), finished_before=summary.skipped,
                          pending=len(pending), judged_again=sum(j.again for j in pending),
                          concurrency=self.concurrency, infra_waits_s=waits, **self._where())

            def settle(waiting: list[_Later]) -> None:
                """Infra samples that will not be judged again in this pass: finished as they are."""
                with lock:
                    summary.records.extend(w.record for w in waiting)
                    waiting.clear()

            def one(job: _Job) -> None:
                spec = job.spec
                if self._abort.is_set():
                    return
                try:
                    record = self.rejudge(spec, job.after_wait_s) if job.again else self.run_sample(spec)
                except FatalProviderError as err:
                    self._abort.set()
                    with lock:
                        summary.fatal = summary.fatal or str(err)
                    return
                except TransientProviderError as err:
                    with lock:
                        summary.interrupted.append(f"{spec.thread_id}: {err}")
                    return
                except Exception as err:  # an internal error ends this sample, not the run
                    self.log.error("sample_crashed", sample=spec.thread_id, error=f"{type(err).__name__}: {err}",
                                   traceback=traceback.format_exc())
                    with lock:
                        summary.errors.append(f"{spec.thread_id}: {type(err).__name__}: {err}")
                    return
                with lock:
                    judged[spec.thread_id] = n = judged.get(spec.thread_id, 0) + 1
                    # Judged again after the n-th wait; a lasting cause (a multicast refusal, a missing package)
                    # meets this machine again, so waiting would only hold the devices: --resume elsewhere can.
                    if (is_infra(record) and record.get("infra_cause") not in failures.LASTING_INFRA_CAUSES
                            and n <= len(waits)):
                        later.append(_Later(self._clock() + waits[n - 1], spec, record, waits[n - 1]))
                        self.log.info("sample_infra_wait", sample=spec.thread_id, judgement=n, wait_s=waits[n - 1],
                                      infra_cause=record.get("infra_cause"))
                        return
                    summary.records.append(record)
                if self.on_sample:
                    self.on_sample(record, False)

            # Samples are handed to the pool as slots free up, never all at once: on Ctrl-C nothing is queued
            # in the pool, and only the `concurrency` running ones have anything to stop. An infra_error sample
            # waits in `later`, holding no slot, until its wait is over.
            pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="sample")
            queue = list(pending)
            running: set[Future[None]] = set()
            try:
                while queue or running or later:
                    if cancel.requested():  # Ctrl-C (agent.interrupts): polled, never raised into this loop
                        raise KeyboardInterrupt
                    if self._abort.is_set():
                        settle(later)
                    with lock:
                        due = [w for w in later if w.due <= self._clock()]
                        for w in due:
                            later.remove(w)
                    queue.extend(_Job(w.spec, again=True, after_wait_s=w.wait_s) for w in due)
                    while (queue and len(running) < self.concurrency and not self._abort.is_set()
                           and not cancel.requested()):
                        running.add(pool.submit(one, queue.pop(0)))
                    if not running:
                        with lock:
                            first = min((w.due for w in later), default=None)
                        if first is None or self._abort.is_set():
                            break
                        # Nothing else to do: wait for the next judgement (Ctrl-C ends the wait at once)
                        self._sleep(max(0.0, first - self._clock()))
                        continue
                    done, _ = wait(running, timeout=interrupts.CANCEL_POLL_S, return_when=FIRST_COMPLETED)
                    for f in done:
                        f.result()  # a sample stopped by Ctrl-C raises Cancelled: it stays in `running`, counted
                        running.discard(f)
            except (KeyboardInterrupt, cancel.Cancelled):
                settle(later)  # finished (in infra_error) on disk: --resume or --retry-infra judges them again
                left = self._stop(running, summary)
                raise RunInterrupted(summary, left) from None
            finally:
                # after Ctrl-C, threads still in a model call are not waited for (the process ends)
                pool.shutdown(wait=not left, cancel_futures=True)
            settle(later)
            self.log.info("run_finished" if summary.fatal is None else "run_aborted", finished=len(summary.records),
                          total=summary.total, infra_errors=summary.infra_errors, interrupted=len(summary.interrupted),
                          errors=len(summary.errors), fatal=summary.fatal)
        finally:
            if not left:  # a thread still in a model call may yet write a checkpoint; the process ends anyway
                conn.close()
            if self.scheduler is not None:
                self.scheduler.listener = None
            handle.close()
        return summary

    def _stop(self, running: set[Future[None]], summary: RunSummary) -> int:
        """Ctrl-C: say so at once, stop the running samples' evaluations (agent.interrupts), keep the finished
        ones; returns how many sample threads are still running (in a model call)."""
        busy = interrupts.interrupted(running)
        if self.on_interrupt is not None:
            self.on_interrupt(busy)
        self.log.info("run_interrupted", running=busy, finished=len(summary.records), total=summary.total)
        left = interrupts.stop_work(running)
        self.log.info("run_stopped", still_running=left, finished=len(summary.records), total=summary.total)
        return left

    def run_sample(self, spec: SampleSpec) -> dict[str, Any]:
        """One sample, start to sample.json; resumes from its checkpoint where one exists."""
        sdir = self.run_dir.sample(spec.problem.name, spec.condition.name, spec.k)
        previous = sdir.record() or {}
        started_at = previous.get("started_at") or now()
        log = self.log.bind(problem=spec.problem.name, condition=spec.condition.name, sample=spec.k)
        log.info("sample_started", resumed=bool(previous))
        write_json_atomic(sdir.sample_json, sample_record(spec, self.config.model, status=RUNNING,
                                                          started_at=started_at))
        try:
            if spec.condition.kind == REPLAY:
                state = self._replay(spec, sdir, log)
            else:
                state = self._model_sample(spec, sdir, log)
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
            self._saver.delete_thread(spec.thread_id)  # its files hold it now; deleting the folder redoes it
        log.info("sample_finished", stop_reason=record["stop_reason"], verdict=record["verdict"],
                 speedup=record["speedup"], turns=record["turns"], cost_usd=record["usage"]["cost_usd"])
        return record

    def _where(self) -> dict[str, Any]:
        """The executor and how many evaluations it runs at once, for the event log."""
        if self.remote is None:
            return {"executor": LocalExecutor.name, "capacity": self.scheduler.capacity if self.scheduler else 1}
        return {"executor": self.remote.name, "capacity": self.remote.capacity(self.config.world_size,
                                                                                self.config.device)}

    def _remote_args(self) -> dict[str, Any]:
        """executor= for the graph when evaluations leave this node (nothing otherwise)."""
        return {"executor": self.remote} if self.remote is not None else {}

    def _context(self, spec: SampleSpec, sdir: SampleDir, log: Any, model: BaseChatModel | None) -> SampleContext:
        return SampleContext(
            problem=spec.problem, condition=spec.condition, model=model,
            model_name=self.spec.text, directory=sdir, budget=self.config.budget, prices=self.prices,
            config=self.eval_config, scheduler=self.scheduler, world_size=self.config.world_size,
            device=self.config.device, shape=self.config.shape, topology=self.topology, log=log,
            model_attempts=self.config.model_attempts, answer_tokens=self.config.answer_tokens,
            guide_in_prompt=self.config.guide_in_prompt, context_policy=self.policy,
            prompt_cache=self.config.prompt_cache, prompt=self.prompt_choice,
            shell_timeout_s=self.config.shell_timeout_s, **self._remote_args(),
        )

    def _model_sample(self, spec: SampleSpec, sdir: SampleDir, log: Any) -> dict[str, Any]:
        thread = {"configurable": {"thread_id": spec.thread_id}, "recursion_limit": recursion_limit(self.config.budget)}
        model = self.model_factory()
        ctx = self._context(spec, sdir, log, model)
        first = opening(ctx)
        ctx.shell_solution = first.solution_file
        if spec.condition.kind == BASH:  # its scratch folder, with the files the prompt names
            prepare_shell(tool_context(ctx, gpus=None), first.shell_files)
        snapshot = build_graph(ctx, self._saver).get_state(thread)
        values = snapshot.values or {}
        if "scoring" in values:  # the score node had run; only the files were not written
            log.info("sample_recovered")
            return dict(values)
        # durability="sync": a step's checkpoint is on disk before the next step starts, so a kill during a
        # tool call resumes at that tool call (LangGraph's default writes checkpoints in the background).
        if values:
            ctx.model = _resumed(model, values.get("messages") or [])
            log.info("sample_resumed", next=list(snapshot.next), turns=Spent.from_dict(values.get("spent")).turns)
            return dict(build_graph(ctx, self._saver).invoke(None, thread, durability="sync"))
        start = {"messages": first.messages, "spent": Spent().as_dict(), "candidates": [],
                 "stop_reason": None, "submitted": None, "prompt": first.record}
        return dict(build_graph(ctx, self._saver).invoke(start, thread, durability="sync"))

    def _replay(self, spec: SampleSpec, sdir: SampleDir, log: Any) -> dict[str, Any]:
        state: dict[str, Any] = {"messages": [], "candidates": [], "stop_reason": REPLAYED, "result": None}
        if spec.file is None:
            return state
        path = sdir.candidate(0)
        write_bytes_atomic(path, spec.file.read_bytes())
        write_json_atomic(path.with_suffix(".json"), {"source": "replay", "file": str(spec.file)})
        state["candidates"] = [{"index": 0, "path": sdir.relative(path), "tool": None, "tool_call_id": None,
                                "message_id": None, "verdict": None}]
        write_bytes_atomic(sdir.final_py, spec.file.read_bytes())
        state.update(self._score_final(spec, sdir, log))
        state["scoring"]["final"] = sdir.relative(path)
        log.info("scored", file=str(spec.file), verdict=state["result"]["verdict"],
                 seed=final_scoring.scoring_seed(self.eval_config.seed))
        return state

    def _score_final(self, spec: SampleSpec, sdir: SampleDir, log: Any) -> dict[str, Any]:
        """The sample's final.py scored by agent.final_scoring (visible shape and held-out shapes, its own quick
        infra retries): the state's `result`, `held_out` and `scoring`."""
        executor = self.remote if self.remote is not None else LocalExecutor(self.scheduler)
        return final_scoring.score_submission(
            spec.problem, sdir.final_py, evaluate=as_evaluate(executor), config=self.eval_config,
            world_size=self.config.world_size, device=self.config.device, shape=self.config.shape, log_dir=sdir.logs,
            log=log).state()

    # -- judging an infra_error again ---------------------------------------------------------------------
    def rejudge(self, spec: SampleSpec, after_wait_s: float | None = None) -> dict[str, Any]:
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
        history[-1]["kept"] = self._keep_aside(sdir, n, previous)
        log.info("sample_judged_again", judgement=n + 1, after_wait_s=after_wait_s,
                 earlier_infra_cause=previous.get("infra_cause"))
        state = self._score_final(spec, sdir, log)
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

    @staticmethod
    def _keep_aside(sdir: SampleDir, n: int, previous: dict[str, Any]) -> str:
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


def _resumed(model: BaseChatModel, messages: list[Any]) -> BaseChatModel:
    """A scripted model picks up at the reply the checkpoint is waiting for (a real one needs nothing)."""
    answered = sum(1 for m in messages if isinstance(m, AIMessage))
    if isinstance(model, ScriptedChatModel) and answered:
        return ScriptedChatModel(script=model.script[answered:], script_name=model.script_name, usage=model.usage)
    return model
