"""The experiment runner: every (problem, condition, sample) of a run, concurrently and resumably.

Everything goes under runs/<run_id>/ as docs/run-layout.md says, each file written atomically. A sample
is done when its sample.json says `"status": "finished"` (agent.sample_life writes it last); on resume a
finished sample is never redone; an unfinished agent sample continues from its LangGraph checkpoint
(runs/<id>/checkpoints.sqlite, thread "<problem>/<condition>/<k>"), so the turns it already took are neither
repeated nor counted twice.

Samples run in `concurrency` threads (agent.run_loop); their evaluations share the devices through one
DeviceScheduler, or, with a Ray executor (agent.executors.ray_cluster), go to a cluster as tasks while the agent
loops stay here. The executor is not part of the run's config: a run started on one executor resumes on the other.
What is not the model's fault is reported apart: an infra_error of the final scoring (retried, see
agent.final_scoring), provider outages that outlast the retries (the sample stays unfinished for
`--resume`), and internal errors (logged with their traceback in events.jsonl). run.json and sample.json are
built by agent.run_records.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel

from agent.conditions import REPLAY, Condition
from agent.eventlog import open_event_log
from agent.executors.interface import Executor
from agent.executors.local import LocalExecutor
from agent.providers import make_chat_model, parse_model_spec
from agent.replay import ReplaySet
from agent.run_config import DEFAULT_INFRA_WAITS_S as DEFAULT_INFRA_WAITS_S  # re-exported: the run's settings' home
from agent.run_config import RunConfig as RunConfig
from agent.run_config import RunError as RunError
from agent.run_config import load_run_config as load_run_config
from agent.run_loop import Job, RunLoop
from agent.run_loop import RunInterrupted as RunInterrupted  # re-exported: the CLI and the tests know them here
from agent.run_loop import RunSummary as RunSummary
from agent.run_loop import is_infra as is_infra
from agent.run_records import create_run as create_run  # re-exported: the CLI and the tests know them here
from agent.run_records import run_header as run_header
from agent.run_records import sample_record as sample_record
from agent.run_records import topology_record as topology_record
from agent.rundir import FINISHED, RunDir
from agent.sample_life import SampleLife
from agent.sample_spec import SampleSpec as SampleSpec
from agent.scheduler import DeviceScheduler
from agent.usage import PriceTable
from harness import cancel
from harness.config import EvalConfig
from harness.problems.problem import Problem


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
        # ends at once, with harness.cancel.Cancelled) and `clock` are injectable, so tests never wait (RunLoop).
        self._sleep = sleep
        self._clock = clock
        # Called at once on Ctrl-C with the number of running samples, before they are stopped (the CLI says so).
        self.on_interrupt: Callable[[int], None] | None = None
        self.topology = topology_record(config.device)
        self.conditions = config.parsed_conditions
        self.prompt_choice = config.prompt_choice
        self.models, self.policy = config.model_context()
        self._abort = threading.Event()  # a provider error that ends the run: no later pass starts a sample
        self._life: SampleLife | None = None  # the samples' work, once run() has opened the event log

    def _default_model_factory(self) -> BaseChatModel:
        return make_chat_model(self.spec, base_url=self.config.base_url, api_key_env=self.config.api_key_env,
                               temperature=self.config.temperature, max_output_tokens=self.config.max_reply_tokens,
                               reasoning=self.config.reasoning, models=self.models)

    # -- what to run ------------------------------------------------------------------------------------
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

    # -- running ----------------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        from langgraph.checkpoint.sqlite import SqliteSaver

        from agent.checkpoint_serde import RedactingSerializer  # deferred with LangGraph's saver

        specs = self.plan()
        summary = RunSummary(run_id=self.run_dir.path.name, total=len(specs))
        log, handle = open_event_log(self.run_dir.events)
        if self.scheduler is not None:  # every lease in events.jsonl: a run stopped mid-way says who queued, who held
            self.scheduler.listener = lambda event, fields: log.info(event, **fields)
        conn = sqlite3.connect(str(self.run_dir.checkpoints), check_same_thread=False)
        saver = SqliteSaver(conn, serde=RedactingSerializer())
        saver.setup()
        self._life = SampleLife(run_dir=self.run_dir, config=self.config, eval_config=self.eval_config,
                                prices=self.prices, topology=self.topology,
                                policy=self.policy, prompt=self.prompt_choice, scheduler=self.scheduler,
                                executor=self.remote,
                                model_factory=self.model_factory, saver=saver, log=log)
        waits = list(self.config.infra_waits_s)
        left = 0  # sample threads still running after Ctrl-C
        try:
            jobs = self._jobs(specs, summary)
            log.info("run_started", run_id=summary.run_id, total=len(specs), finished_before=summary.skipped,
                     pending=len(jobs), judged_again=sum(j.again for j in jobs), concurrency=self.concurrency,
                     infra_waits_s=waits, **self._where())
            loop = RunLoop(summary, self.concurrency, run_sample=self.run_sample, rejudge=self.rejudge, log=log,
                           waits=waits, sleep=self._sleep, clock=self._clock, on_sample=self.on_sample,
                           on_interrupt=self.on_interrupt, abort=self._abort)
            try:
                loop.run(jobs)
            except RunInterrupted as stop:
                left = stop.still_running
                raise
            log.info("run_finished" if summary.fatal is None else "run_aborted", finished=len(summary.records),
                     total=summary.total, infra_errors=summary.infra_errors, interrupted=len(summary.interrupted),
                     errors=len(summary.errors), fatal=summary.fatal)
        finally:
            if not left:  # a thread still in a model call may yet write a checkpoint; the process ends anyway
                conn.close()
            if self.scheduler is not None:
                self.scheduler.listener = None
            handle.close()
        return summary

    def _jobs(self, specs: list[SampleSpec], summary: RunSummary) -> list[Job]:
        """What this pass does: unfinished samples run (not with retry_infra_only), finished ones in infra_error
        judged again (--resume, --retry-infra), the other finished ones kept in the summary as they are."""
        jobs: list[Job] = []
        for spec in specs:
            record = self.run_dir.sample(spec.problem.name, spec.condition.name, spec.k).record()
            finished = record is not None and record.get("status") == FINISHED
            if finished and is_infra(record):  # the harness's failure: judged again
                jobs.append(Job(spec, again=True))
            elif finished:
                assert record is not None
                summary.records.append(record)
                summary.skipped += 1
                if self.on_sample:
                    self.on_sample(record, True)
            elif not self.retry_infra_only:
                jobs.append(Job(spec))
        return jobs

    def run_sample(self, spec: SampleSpec) -> dict[str, Any]:
        """One sample, start to sample.json (agent.sample_life); the run loop calls it through the runner."""
        assert self._life is not None, "run() opens the run before a sample runs"
        return self._life.run_through(spec)

    def rejudge(self, spec: SampleSpec, after_wait_s: float | None = None) -> dict[str, Any]:
        """A finished sample in infra_error judged again (agent.sample_life.SampleLife.judge_again)."""
        assert self._life is not None, "run() opens the run before a sample is judged again"
        return self._life.judge_again(spec, after_wait_s)

    def _where(self) -> dict[str, Any]:
        """The executor and how many evaluations it runs at once, for the event log."""
        if self.remote is None:
            return {"executor": LocalExecutor.name, "capacity": self.scheduler.capacity if self.scheduler else 1}
        return {"executor": self.remote.name, "capacity": self.remote.capacity(self.config.world_size,
                                                                                self.config.device)}
