"""Executors: `local` and `ray` give the same verdicts; a Ray worker or node that dies mid-evaluation is retried.

The local tests always run. The Ray tests start a cluster of logical nodes on loopback (a head without
resources and two nodes of 2 logical GPUs each; ranks run on CPU under gloo), connect to it by address as
`pkb run --executor ray --ray-address` does, and always shut it down; they skip where Ray is not installed.
Besides single evaluations they run whole `pkb run`s on it: a scripted run gives the local run's results, a
run resumes across executors, and a run whose Ray worker is killed mid-evaluation completes. They run in file
order: the last one removes a node.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import operator
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.cli import run as cli_run
from agent.cli.common import CliError
from agent.cli.options import add_executor_arguments, executor_from_args
from agent.executors import ExecutorError
from agent.executors.factory import make_executor
from agent.executors.interface import as_evaluate, evaluate_all
from agent.executors.local import LocalExecutor
from agent.executors.ray_cluster import RayExecutor
from agent.executors.reaper import reap_on_death
from agent.executors.request import EvalRequest, device_seconds
from agent.rundir import RunDir
from agent.runner import RunConfig, Runner, create_run
from agent.scheduler import DeviceScheduler, MemoryGate
from harness.common.flags import FROM_TIMES
from harness.config import EvalConfig, Limits, TimingConfig
from harness.evaluate import evaluate
from harness.problems.problem import MalformedProblem, load_problem
from harness.problems.registry import get, load_suite
from harness.records.results import EvalResult
from tests.agent_support import CORRECT, eval_config, fenced, scripted
from tests.conftest import CANDIDATES, failure_of, live_children, pid_alive, timings_of

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (pip install 'pkb-agent[ray]'); "
                                                    "the local-executor tests still run")
# check_s bounds the deadlock candidate; every other candidate finishes its checks in well under a second.
CONFIG = EvalConfig(trials=3, timing=TimingConfig.for_device("cpu"), limits=Limits(check_s=8))
EXPECTED_VERDICTS = {"correct", "compile_error", "api_error", "runtime_error", "shape_mismatch",
                     "output_mismatch", "deadlock"}

# The process that runs the evaluation (the Ray worker): the parent of the pool's launcher, which is every
# rank's parent.
HARNESS_PID = '''
def harness_pid():
    with open(f"/proc/{{os.getppid()}}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
'''
# Stalls in its first call until the test creates RELEASE, after noting its pid, the pid of the process that
# runs the evaluation, the folder it was written to and its rank group's rendezvous folder; correct once
# released.
STALL = '''
import os, sys, time
import torch.distributed as dist

MARKER = {marker!r}
''' + HARNESS_PID + '''

def solution(x):
    if not os.path.exists(os.path.join(MARKER, "release")):
        pool = os.path.dirname(sys.argv[sys.argv.index("--init-file") + 1])
        with open(os.path.join(MARKER, f"rank{{dist.get_rank()}}.pid"), "w") as f:
            f.write(f"{{os.getpid()}} {{harness_pid()}} {{pool}} {{os.path.dirname(os.path.abspath(__file__))}}")
        time.sleep(120)
    out = x.clone()
    dist.all_reduce(out)
    return out
'''
# Kills the process that evaluates it (the Ray worker) on every attempt; rank 0 notes each attempt once (its
# process keeps running trials until the reaper kills it).
KILL_PARENT = '''
import os, signal
import torch.distributed as dist

MARKER = {marker!r}
''' + HARNESS_PID + '''
_HARNESS = harness_pid()  # read at import, while the process that runs the evaluation is surely alive
_noted = False

def solution(x):
    global _noted
    if not _noted:
        _noted = True
        with open(os.path.join(MARKER, f"rank{{dist.get_rank()}}.{{os.getpid()}}"), "w") as f:
            f.write(str(os.getpid()))
        if dist.get_rank() == 0:  # one killer: a second one could find a reparented launcher's new parent
            with open(os.path.join(MARKER, "attempts"), "a") as f:
                f.write(f"{{_HARNESS}}\\n")
            os.kill(_HARNESS, signal.SIGKILL)
    return x.clone()
'''


def deterministic(result: EvalResult) -> dict[str, Any]:
    """What must not depend on where an evaluation ran. Timings, stage times, environment and date may, and
    so may the flags read from the timings (harness.common.flags.FROM_TIMES: on two cores the Ray tests run two
    evaluations at once, and CI saw `timing_inconsistent` on an honest candidate there); so may error
    magnitudes and the messages that quote values: every evaluation draws its inputs with a fresh secret
    salt (harness/common/integrity.py), so two local runs differ there too."""
    failure = result.failure
    return {
        "problem": result.problem, "category": result.category, "origin": result.origin, "shape": result.shape,
        "world_size": result.world_size, "device": result.device, "candidate": result.candidate.model_dump(),
        "verdict": result.verdict, "correct": result.correct, "seed": result.seed,
        "flags": [f for f in result.flags if f not in FROM_TIMES],
        "trials": result.trials, "timed": result.timings is not None, "config": result.config,
        # Not the failing trial: the trials run in an order drawn from each evaluation's secret.
        "failure": None if failure is None else {"verdict": failure.verdict, "rank": failure.rank,
                                                 "phase": failure.phase},
        "fast_eligible": getattr(result, "fast_eligible", True),
    }


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {seconds:.0f} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def all_reduce():
    return get(load_suite(), "all_reduce")


@pytest.fixture(autouse=True, scope="module")
def _no_sandbox():
    """These tests make evaluations lose the process that runs them (a Ray worker killed mid-evaluation,
    a node removed) and find it through marker files their candidates write: machine failures, which a
    sandboxed candidate cannot cause or report. They run with the sandbox's stated fallback; the sandbox
    has tests of its own (test_isolation.py, test_exploits.py). Set before the Ray cluster starts, so its
    workers inherit it."""
    previous = os.environ.get("PKB_SANDBOX")
    os.environ["PKB_SANDBOX"] = "off"
    yield
    if previous is None:
        os.environ.pop("PKB_SANDBOX", None)
    else:
        os.environ["PKB_SANDBOX"] = previous


def request(problem, path: Path, **overrides: Any) -> EvalRequest:
    return EvalRequest.build(problem, path, world_size=2, device="cpu", shape="small", config=CONFIG, **overrides)


# -- local ------------------------------------------------------------------------------------------
class CountingScheduler:
    """A DeviceScheduler of one CPU slot that counts its leases."""

    def __init__(self) -> None:
        self.inner = DeviceScheduler("cpu", 2, cpu_slots=1)
        self.capacity = self.inner.capacity
        self.leases = 0

    @contextmanager
    def lease(self, **kwargs: Any) -> Iterator[Any]:
        with self.inner.lease(**kwargs) as lease:
            self.leases += 1
            yield lease


@pytest.mark.slow
def test_local_executor_is_the_harness_inside_a_scheduler_lease(all_reduce):
    scheduler = CountingScheduler()
    executor = make_executor("local", scheduler=scheduler)
    correct = CANDIDATES / "correct_all_gather_sum.py"
    direct = evaluate(all_reduce, correct, world_size=2, device="cpu", shape="small", config=CONFIG)
    via = executor.evaluate(request(all_reduce, correct))
    assert deterministic(via) == deterministic(direct) and via.verdict == "correct"
    # the lease's seconds times the ranks' devices; the stages overlap (launch runs while the reference is prepared)
    held = via.environment["executor"]["held_s"]
    assert device_seconds(via) == pytest.approx(2 * held) and device_seconds(via) > 0
    assert held >= sum(v for k, v in via.stages.items() if k not in ("launch", "build_in_call")) - 1e-3
    # The same through harness.evaluate's signature, as the tools will call it (the executor places ranks).
    wrong = CANDIDATES / "output_mismatch_rank1.py"
    direct = evaluate(all_reduce, wrong, world_size=2, device="cpu", shape="small", config=CONFIG)
    spent: list[float] = []
    via = as_evaluate(executor, spent)(all_reduce, wrong, world_size=2, device="cpu", shape="small", config=CONFIG,
                                       gpus=[7, 8])
    assert deterministic(via) == deterministic(direct) and via.verdict == "output_mismatch"
    assert spent == [device_seconds(via)]
    assert scheduler.leases == 2
    assert live_children() == []


def test_local_device_calls_run_inside_a_lease(all_reduce, tmp_path):
    scheduler = CountingScheduler()
    seen: dict[str, Any] = {}

    def profile(problem, candidate, *, world_size, gpus="the caller's"):
        seen.update(problem=problem.name, source=candidate.read_text(), world_size=world_size, gpus=gpus,
                    held=len(scheduler.inner.in_use))
        return "profiled"

    candidate = tmp_path / "c.py"
    candidate.write_text("def solution(x): ...\n")
    assert LocalExecutor(scheduler).run_on_devices(2, "cpu", profile, all_reduce, candidate, world_size=2) == "profiled"
    assert seen == {"problem": "all_reduce", "source": "def solution(x): ...\n", "world_size": 2, "gpus": None,
                    "held": 1}  # the lease's GPUs (none on CPU) replace the caller's, while the lease is held
    assert scheduler.leases == 1


def test_on_cuda_the_build_before_the_lease_is_timed_apart_from_the_lease(all_reduce, tmp_path, monkeypatch):
    """The GPU is taken only after the native build; the result says how long each took (no GPU needed: the
    build and the harness are stand-ins that record when they ran)."""
    import agent.executors.local as local
    from harness.compiling.compile import CompileOutcome

    scheduler = DeviceScheduler("cuda", 2, gpus=[0, 1])
    order: list[str] = []

    def build(*args: Any, **kwargs: Any) -> CompileOutcome:
        order.append(f"build, {len(scheduler.in_use)} leases held")
        return CompileOutcome(True, 12.5)

    def judged(problem: Any, path: Path, **kwargs: Any) -> EvalResult:
        order.append(f"harness on GPUs {kwargs['gpus']}")
        return evaluate(all_reduce, CANDIDATES / "correct_all_gather_sum.py", world_size=2, device="cpu",
                        shape="small", config=CONFIG)

    monkeypatch.setattr(local, "compile_candidate", build)
    monkeypatch.setattr(local, "harness_evaluate", judged)
    on_cuda = EvalRequest.build(all_reduce, CANDIDATES / "correct_all_gather_sum.py", world_size=2, device="cuda",
                                shape="small", config=CONFIG)
    result = LocalExecutor(scheduler).evaluate(on_cuda)
    assert order == ["build, 0 leases held", "harness on GPUs [0, 1]"]
    executor = result.environment["executor"]
    assert executor["build_before_lease_s"] == 12.5 and executor["held_s"] > 0
    assert result.verdict == "correct"


def test_an_untimed_evaluation_that_shared_its_gpu_is_judged_again_alone_unless_its_verdict_stands(
        all_reduce, tmp_path, monkeypatch):
    """Three untimed evaluations hold one GPU together. The one that ended in a verdict a neighbour could have
    caused (runtime_error: an out-of-memory, say) is judged again with the GPU to itself, and that verdict
    counts; the correct one and the multicast refusal (a lasting cause, named by the source) stand. A timed
    evaluation never shares."""
    import agent.executors.local as local
    from harness.compiling.compile import CompileOutcome
    from harness.records.results import CandidateInfo, Failure

    heard: list[tuple[str, dict[str, object]]] = []
    # (memory: a host large enough for three CUDA evaluations' budgets at once; this machine may not be)
    scheduler = DeviceScheduler("cuda", 2, gpus=[0], ranks_per_gpu=2, shared_evaluations=3,
                                listener=lambda event, fields: heard.append((event, dict(fields))),
                                memory=MemoryGate(1 << 50))
    all_inside = threading.Barrier(3, timeout=10)
    calls: dict[str, int] = {}
    first_time = {"flaky": ("runtime_error", None), "steady": ("correct", None),
                  "refused": ("infra_error", "emulation")}

    def judged(problem: Any, path: Path, **kwargs: Any) -> EvalResult:
        name = path.read_text().strip()
        calls[name] = calls.get(name, 0) + 1
        verdict, cause = "correct", None
        if calls[name] == 1 and name in first_time:
            all_inside.wait()  # the three first evaluations hold the GPU at the same moment
            verdict, cause = first_time[name]
        failure = None if verdict == "correct" else Failure(verdict=verdict, message="refused or out of memory",
                                                            infra_cause=cause)
        return EvalResult(problem="all_reduce", category="collective", shape="small", world_size=2, device="cuda",
                          candidate=CandidateInfo(path=str(path), sha256="0" * 64), verdict=verdict,
                          correct=verdict == "correct", failure=failure, seed=0, trials=2)

    monkeypatch.setattr(local, "compile_candidate", lambda *a, **k: CompileOutcome(True, 1.0))
    monkeypatch.setattr(local, "harness_evaluate", judged)
    untimed = CONFIG.model_copy(update={"skip_timing": True})

    def request_for(name: str, config: EvalConfig = untimed) -> EvalRequest:
        source = tmp_path / f"{name}.py"
        source.write_text(name + "\n")
        return EvalRequest.build(all_reduce, source, world_size=2, device="cuda", shape="small", config=config)

    executor = LocalExecutor(scheduler)
    assert executor.capacity() == 3
    flaky, steady, refused = executor.evaluate_many([request_for(n) for n in ("flaky", "steady", "refused")])
    assert flaky.verdict == "correct" and calls["flaky"] == 2
    assert flaky.environment["executor"]["judged_again_alone"] == "runtime_error"
    assert flaky.environment["executor"]["shared"] is True
    for standing in (steady, refused):
        assert "judged_again_alone" not in standing.environment["executor"]
        assert standing.environment["executor"]["shared"] is True
    assert steady.verdict == "correct" and refused.verdict == "infra_error"
    assert calls["steady"] == calls["refused"] == 1
    granted = [f["shared"] for e, f in heard if e == "lease_granted"]
    assert granted == [True, True, True, False]  # the second judgement of `flaky` held the GPU alone
    assert [f["label"] for e, f in heard if e == "lease_granted"] == ["all_reduce small"] * 4

    heard.clear()
    timed = executor.evaluate(request_for("timed", CONFIG))
    assert timed.verdict == "correct" and "shared" not in timed.environment["executor"]
    assert [f["shared"] for e, f in heard if e == "lease_granted"] == [False]


@pytest.mark.parametrize(("verdict", "cause", "stands"), [
    ("correct", None, True), ("shape_mismatch", None, True), ("api_error", None, True),
    ("infra_error", "emulation", True), ("infra_error", "environment", True),
    ("output_mismatch", None, False), ("runtime_error", None, False), ("timeout", None, False),
    ("deadlock", None, False), ("compile_error", None, False), ("infra_error", "launch", False),
    ("infra_error", "reference", False), ("infra_error", None, False),
])
def test_which_verdicts_a_neighbour_on_the_gpu_cannot_have_caused(verdict, cause, stands):
    from harness.common import failures

    assert failures.stands_when_shared(verdict, cause) is stands


def test_a_build_that_fails_before_the_lease_holds_no_device(all_reduce, tmp_path, monkeypatch):
    """No lease is taken for a candidate whose build failed, so it is charged no device seconds (the harness's
    compile stage that reports the failure runs without devices)."""
    import agent.executors.local as local
    from harness.compiling.compile import CompileOutcome

    scheduler = DeviceScheduler("cuda", 2, gpus=[0, 1])
    monkeypatch.setattr(local, "compile_candidate", lambda *a, **k: CompileOutcome(False, 3.0, "compile_error", "no"))

    def judged(problem: Any, path: Path, **kwargs: Any) -> EvalResult:
        assert kwargs["gpus"] is None and scheduler.in_use == {}
        time.sleep(0.05)  # the harness's own compile stage, failing again
        return evaluate(all_reduce, CANDIDATES / "compile_error_syntax.py", world_size=2, device="cpu",
                        shape="small", config=CONFIG)

    monkeypatch.setattr(local, "harness_evaluate", judged)
    result = LocalExecutor(scheduler).evaluate(EvalRequest.build(
        all_reduce, CANDIDATES / "compile_error_syntax.py", world_size=2, device="cuda", shape="small", config=CONFIG))
    assert result.verdict == "compile_error"
    assert result.environment["executor"]["held_s"] == 0.0 and device_seconds(result) == 0.0
    assert result.environment["executor"]["build_before_lease_s"] == 3.0


def test_a_build_that_failed_before_the_lease_is_the_verdict_and_is_not_built_again(all_reduce, monkeypatch):
    """Under load a build can fail by its time limit once and succeed the next time: the harness must not build
    again (and, succeeding, start ranks on a GPU no lease gave it). It takes the failure as its compile step's,
    with the limits the harness's own build would have had."""
    import agent.executors.local as local
    import harness.evaluate as harness_module
    from harness.compiling.compile import CompileOutcome
    from harness.evaluate import build_limits

    scheduler = DeviceScheduler("cuda", 2, gpus=[0, 1])
    asked: list[Any] = []
    timed_out = CompileOutcome(False, 180.0, "compile_error", "compilation did not finish within 180 s", native=True)

    def build_ahead(*args: Any, **kwargs: Any) -> CompileOutcome:
        asked.append(kwargs.get("limits"))
        return timed_out

    def built_again(*args: Any, **kwargs: Any) -> CompileOutcome:
        raise AssertionError("the harness built a failed build again")

    monkeypatch.setattr(local, "compile_candidate", build_ahead)
    monkeypatch.setattr(harness_module, "compile_candidate", built_again)

    def judged(problem: Any, path: Path, **kwargs: Any) -> EvalResult:
        assert kwargs["gpus"] is None and scheduler.in_use == {} and kwargs["built"] is timed_out
        return evaluate(all_reduce, CANDIDATES / "correct_all_gather_sum.py", world_size=2, device="cpu",
                        shape="small", config=CONFIG, built=kwargs["built"])

    monkeypatch.setattr(local, "harness_evaluate", judged)
    result = LocalExecutor(scheduler).evaluate(EvalRequest.build(
        all_reduce, CANDIDATES / "correct_all_gather_sum.py", world_size=2, device="cuda", shape="small",
        config=CONFIG))
    assert result.verdict == "compile_error" and failure_of(result).message == timed_out.message
    assert result.stages["compile"] == 180.0 and "launch" not in result.stages  # no rank started
    assert asked == [build_limits(CONFIG, "cuda")]
    assert result.environment["executor"]["held_s"] == 0.0


def test_the_source_travels_by_value_and_the_result_names_the_drivers_file(all_reduce, tmp_path, monkeypatch):
    original = CANDIDATES / "runtime_error_rank1.py"
    absent = str(tmp_path / "elsewhere" / "runtime_error_rank1.py")  # no such file here: only the source travels
    req = EvalRequest(problem_spec=all_reduce.loader_spec, candidate_source=original.read_text(),
                      candidate_name=absent, world_size=2, config=CONFIG.model_dump(),
                      log_dir=str(tmp_path / "logs"))
    made: list[str] = []  # the executor's temporary copies (by name: other runs on the machine make their own)
    real_temporary_directory = tempfile.TemporaryDirectory

    def recording(*args, **kwargs):
        folder = real_temporary_directory(*args, **kwargs)
        made.append(folder.name)
        return folder

    monkeypatch.setattr(tempfile, "TemporaryDirectory", recording)
    result = LocalExecutor().evaluate(req)
    assert result.verdict == "runtime_error" and failure_of(result).rank == 1
    assert result.candidate.path == absent
    assert result.candidate.sha256 == hashlib.sha256(original.read_bytes()).hexdigest()
    assert f'File "{absent}"' in failure_of(result).evidence and "pkb-candidate-" not in failure_of(result).evidence
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    copies = [m for m in made if Path(m).name.startswith("pkb-candidate-")]
    assert copies and not [c for c in copies if os.path.lexists(c)]  # the temporary copy is gone


def test_a_harness_failure_is_an_infra_error_not_an_exception(tmp_path):
    source = "def solution(x): ...\n"
    req = EvalRequest(problem_spec=str(tmp_path / "collective" / "vanished.py"), candidate_source=source,
                      candidate_name=str(tmp_path / "c.py"), world_size=2)
    result = LocalExecutor().evaluate(req)
    assert result.verdict == "infra_error" and not result.correct
    assert result.problem == "vanished" and failure_of(result).phase == "executor"
    assert "vanished.py" in failure_of(result).message
    assert result.candidate.sha256 == hashlib.sha256(b"def solution(x): ...\n").hexdigest()


def test_requests_are_deterministic_json_and_keep_any_bytes(all_reduce, tmp_path):
    path = tmp_path / "latin1.py"
    path.write_bytes(b"# caf\xe9 (not UTF-8)\ndef solution(x):\n    return x.clone()\n")
    a = request(all_reduce, path, log_dir=tmp_path)
    b = request(all_reduce, path, log_dir=tmp_path)
    assert a.to_json() == b.to_json()
    assert EvalRequest.from_json(a.to_json()) == a
    assert EvalRequest.from_json(a.to_json()).source_bytes == path.read_bytes()
    assert a.eval_config() == CONFIG


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_flags_build_the_executor_or_say_what_is_wrong(monkeypatch):
    parser = argparse.ArgumentParser()
    add_executor_arguments(parser)
    scheduler = DeviceScheduler("cpu", 2, cpu_slots=1)
    local = executor_from_args(parser.parse_args([]), device="cpu", world_size=2, scheduler=scheduler)
    assert isinstance(local, LocalExecutor) and local.scheduler is scheduler
    with pytest.raises(CliError, match="--ray-address applies to --executor ray only"):
        executor_from_args(parser.parse_args(["--ray-address", "10.0.0.1:6379"]), device="cpu", world_size=2)
    with pytest.raises(CliError, match="--ray-retries must be at least 0"):
        executor_from_args(parser.parse_args(["--executor", "ray", "--ray-retries", "-1"]), device="cpu",
                           world_size=2)
    with pytest.raises(CliError, match="cannot reach the Ray cluster at 127.0.0.1:"):
        executor_from_args(parser.parse_args(["--executor", "ray", "--ray-address", f"127.0.0.1:{closed_port()}"]),
                           device="cpu", world_size=2)
    with pytest.raises(CliError, match="expected HOST:PORT"):
        executor_from_args(parser.parse_args(["--executor", "ray", "--ray-address", "head-node"]), device="cpu",
                           world_size=2)
    with pytest.raises(SystemExit):
        parser.parse_args(["--executor", "slurm"])
    with pytest.raises(ExecutorError, match="unknown executor 'slurm'"):
        make_executor("slurm")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(CliError, match=r"pip install 'pkb-agent\[ray\]'"):
        executor_from_args(parser.parse_args(["--executor", "ray"]), device="cpu", world_size=2)


REAPED_WORKER = '''
import subprocess, sys, time
from pathlib import Path
from agent.executors.reaper import reap_on_death

scratch, pool = Path(sys.argv[1]), Path(sys.argv[2])
with reap_on_death(scratch):
    # A rank: a session leader whose command line names its rendezvous file, as harness.launch.pool starts them.
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "--init-file",
                             str(pool / "rendezvous")], start_new_session=True)
    (scratch / "rank.pid").write_text(str(rank.pid))
    time.sleep(1.5)  # the watcher looks every 0.5 s
    (scratch / "ready").write_text("")
    time.sleep(600)
'''


def test_a_dead_workers_rank_groups_and_folders_are_cleaned_up_by_the_reaper(tmp_path):
    scratch, pool = tmp_path / "pkb-ray-task", tmp_path / "pkb-pool-ranks"
    scratch.mkdir()
    pool.mkdir()
    worker = subprocess.Popen([sys.executable, "-c", REAPED_WORKER, str(scratch), str(pool)],
                              cwd=str(CANDIDATES.parent.parent), start_new_session=True)
    try:
        wait_for(lambda: (scratch / "ready").exists(), 120, "the stand-in worker starting its rank")
        rank = int((scratch / "rank.pid").read_text())
        assert pid_alive(rank)
        os.kill(worker.pid, signal.SIGKILL)  # as the OOM killer or a lost node would
        worker.wait()
        wait_for(lambda: not pid_alive(rank), 30, "the orphaned rank being killed")
        wait_for(lambda: not scratch.exists() and not pool.exists(), 30, "the dead evaluation's folders going")
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def test_the_reaper_leaves_a_finished_evaluation_alone(tmp_path):
    with reap_on_death(tmp_path) as watcher:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        time.sleep(1.2)  # seen by the watcher
    try:
        assert watcher is not None and watcher.returncode == 0
        assert child.poll() is None and tmp_path.is_dir()  # the block ended normally: nothing was touched
    finally:
        child.kill()
        child.wait()


# -- ray --------------------------------------------------------------------------------------------
@contextmanager
def loopback_ray() -> Iterator[None]:
    """Ray on loopback only, its files in a private folder, no token written to ~/.ray; all undone after."""
    scratch = tempfile.mkdtemp(prefix="pkbray")
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray's switch for "loopback only" (read when imported)
           "RAY_AUTH_MODE": "disabled",  # a loopback test cluster needs no token
           "RAY_TMPDIR": scratch}  # sessions, sockets and the current-cluster file stay out of /tmp/ray
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.gpu
@needs_ray
def test_ray_on_gpus_gives_the_local_verdict(all_reduce):
    """GPU machines: a one-node Ray instance started here gives the task 2 real GPUs (num_gpus=2)."""
    req = EvalRequest.build(all_reduce, CANDIDATES / "correct_all_gather_sum.py", world_size=2, device="cuda",
                            shape="small", config=EvalConfig(trials=3))
    with loopback_ray(), RayExecutor(None, device="cuda") as executor:
        assert executor.owns_connection and executor.capacity(2, "cuda") >= 1
        remote = executor.evaluate(req)
    local = LocalExecutor(DeviceScheduler("cuda", 2)).evaluate(req)
    assert deterministic(remote) == deterministic(local)
    assert remote.verdict == "correct" and remote.timings is not None
    assert timings_of(remote).candidate.clock == "cuda_events"


@pytest.fixture(scope="module")
def cluster():
    """A head (no resources: nothing runs there) and two nodes of 2 logical GPUs, all on 127.0.0.1."""
    with loopback_ray():
        running = None
        try:
            from ray.cluster_utils import Cluster

            running = Cluster(initialize_head=True, connect=False,
                              head_node_args={"num_cpus": 0, "include_dashboard": False})
            for _ in range(2):
                running.add_node(num_cpus=2, num_gpus=2)
            yield running
        finally:
            if running is not None:
                running.shutdown()
            wait_for(lambda: live_children() == [], 30, "every Ray process exiting")


@pytest.fixture(scope="module")
def ray_executor(cluster):
    # Logical GPUs on CPU nodes: the tasks ask for num_gpus=W exactly as they do on a GPU cluster.
    executor = RayExecutor(cluster.address, cpu_resource="GPU", max_retries=2)
    try:
        yield executor
    finally:
        executor.close()


@needs_ray
def test_ray_checks_its_nodes_and_knows_its_capacity(ray_executor, cluster):
    assert len(ray_executor.nodes) == 2  # the head declares no GPUs: nothing is sent there
    assert {n["code"] for n in ray_executor.nodes} == {ray_executor.code}
    assert ray_executor.capacity(2, "cpu") == 2 and ray_executor.capacity(4, "cpu") == 0
    assert ray_executor.task_options(2, "cpu") == {"max_retries": 2, "retry_exceptions": True, "num_cpus": 0,
                                                   "num_gpus": 2}


# One candidate per verdict (the rest of tests/candidates repeat verdicts and cost a minute on two cores).
ONE_PER_VERDICT = ("api_error_no_solution.py", "compile_error_syntax.py", "correct_all_gather_sum.py",
                   "deadlock_rank1.py", "output_mismatch_rank1.py", "runtime_error_rank1.py", "shape_mismatch.py")


@needs_ray
@pytest.mark.slow
def test_ray_gives_the_same_results_as_local(ray_executor, all_reduce, tmp_path):
    names = list(ONE_PER_VERDICT)
    requests = [request(all_reduce, CANDIDATES / n, log_dir=tmp_path / "ray" / n) for n in names]
    on_ray = evaluate_all(ray_executor, requests)
    here = evaluate_all(LocalExecutor(), [request(all_reduce, CANDIDATES / n) for n in names])
    for name, remote, local in zip(names, on_ray, here):
        assert deterministic(remote) == deterministic(local), name
    assert {r.verdict for r in on_ray} == EXPECTED_VERDICTS
    assert len({r.environment["executor"]["node_id"] for r in on_ray}) == 2  # both nodes took evaluations
    # The rank logs came back to the driver's folder.
    assert sorted(p.name for p in (tmp_path / "ray" / "correct_all_gather_sum.py").iterdir()) == \
        ["rank0.log", "rank1.log"]


@needs_ray
def test_ray_device_calls_carry_problem_and_candidate_to_the_node(ray_executor, all_reduce):
    """profile and roofline run harness functions on W devices: here harness.evaluate itself, as such a call."""
    candidate = CANDIDATES / "shape_mismatch.py"
    result = ray_executor.run_on_devices(2, "cpu", evaluate, all_reduce, candidate, world_size=2, device="cpu",
                                         shape="small", config=CONFIG)
    assert isinstance(result, EvalResult) and result.verdict == "shape_mismatch"
    assert result.candidate.sha256 == hashlib.sha256(candidate.read_bytes()).hexdigest()
    assert result.candidate.path != str(candidate)  # it ran on a copy, written on the node
    with pytest.raises(MalformedProblem, match="vanished.py"):  # fn's own exception comes back as it is
        ray_executor.run_on_devices(2, "cpu", load_problem, "/nowhere/collective/vanished.py")
    with pytest.raises(KeyError) as raised:  # exactly that exception: not Ray's wrapper of it
        ray_executor.run_on_devices(2, "cpu", operator.getitem, {"all_reduce": 1}, "no_such_problem")
    assert type(raised.value) is KeyError


@needs_ray
def test_a_tasks_thread_count_is_the_drivers_not_rays(ray_executor, monkeypatch):
    """Ray sets OMP_NUM_THREADS in a task to its CPU count (W for a CPU evaluation): with more than one thread
    torch's import starts its pool and no rank pool could fork its ranks from one import. The task takes the
    driver's value, or none where the driver has none (the harness's default then: one per CPU rank)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert ray_executor.run_on_devices(2, "cpu", os.getenv, "OMP_NUM_THREADS") is None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert ray_executor.run_on_devices(2, "cpu", os.getenv, "OMP_NUM_THREADS") == "3"


def _stalled(marker: Path) -> tuple[int, list[int], list[Path]]:
    """(the Ray worker running the stalled evaluation, its rank pids, its folders), once both ranks stall."""
    wait_for(lambda: len(list(marker.glob("rank*.pid"))) == 2, 180, "both ranks of the evaluation starting")
    notes = [p.read_text().split(" ", 3) for p in sorted(marker.glob("rank*.pid"))]
    assert len({(parent, pool, folder) for _, parent, pool, folder in notes}) == 1
    return int(notes[0][1]), [int(note[0]) for note in notes], [Path(notes[0][2]), Path(notes[0][3])]


@needs_ray
@pytest.mark.slow
def test_a_killed_worker_is_retried_and_the_batch_completes(ray_executor, all_reduce, tmp_path):
    marker = tmp_path / "marker"
    marker.mkdir()
    stall = tmp_path / "stall_then_sum.py"
    stall.write_text(STALL.format(marker=str(marker)))
    requests = [request(all_reduce, stall)] + [request(all_reduce, CANDIDATES / "correct_all_gather_sum.py")] * 3
    refs = [ray_executor.submit(r) for r in requests]
    worker, ranks, folders = _stalled(marker)
    (marker / "release").touch()  # the retry runs through
    os.kill(worker, signal.SIGKILL)
    results = [ray_executor.collect(r, ref) for r, ref in zip(requests, refs)]
    assert [r.verdict for r in results] == ["correct"] * 4
    assert results[0].environment["executor"]["worker_pid"] != worker  # it ran again, in another worker
    wait_for(lambda: not any(pid_alive(p) for p in ranks), 30, "the killed worker's ranks being reaped")
    wait_for(lambda: not any(f.exists() for f in folders), 30, "the killed worker's folders being removed")


@needs_ray
def test_retries_that_run_out_give_an_infra_error(cluster, all_reduce, tmp_path):
    marker = tmp_path / "marker"
    marker.mkdir()
    killer = tmp_path / "kills_its_evaluator.py"
    killer.write_text(KILL_PARENT.format(marker=str(marker)))
    executor = RayExecutor(cluster.address, cpu_resource="GPU", max_retries=1, check_nodes=False)
    result = executor.evaluate(request(all_reduce, killer))
    executor.close()
    assert result.verdict == "infra_error" and not result.correct
    assert failure_of(result).phase == "executor" and "failed 2 time(s)" in failure_of(result).message
    assert result.candidate.path == str(killer)
    workers = (marker / "attempts").read_text().split()
    assert len(workers) == len(set(workers)) == 2  # the first run and one retry, each in its own Ray worker
    ranks = [int(p.read_text()) for p in marker.glob("rank*.*")]
    wait_for(lambda: not any(pid_alive(p) for p in ranks), 30, "the dead workers' ranks being reaped")


# -- whole runs on Ray --------------------------------------------------------------------------------
WRONG = (CANDIDATES / "output_mismatch_rank1.py").read_text()
RUN_SCRIPT = [["tool", "check", {"source": WRONG}], ["tool", "check", {"source": CORRECT}],
              ["tool", "submit", {"source": CORRECT}]]
# What sample.json says that must not depend on where the evaluations ran (times and dates may).
SAMPLE_FIELDS = ("problem", "condition", "sample", "status", "stop_reason", "verdict", "correct", "speedup", "flags",
                 "fast_eligible", "turns", "tool_calls", "candidates", "final", "scoring_seed", "scoring_attempts")


def pkb_run(runs: Path, run_id: str, *extra: str) -> int:
    script = runs.parent / "script.json"
    script.write_text(json.dumps(RUN_SCRIPT))
    return cli_run.main(["--model", f"scripted:{script}", "--condition", "agent:check", "--problems", "all_reduce",
                         "all_gather", "--trials", "2", "--no-timing", "--concurrency", "2", "--run-id", run_id,
                         "--runs-dir", str(runs), *extra])


def run_outcome(root: Path) -> dict[str, Any]:
    """Per sample: its sample.json fields above, the final scoring's deterministic fields, and each tool call's
    verdict on its candidate."""
    out = {}
    for folder in sorted((root / "samples").glob("*/*/*")):
        record = json.loads((folder / "sample.json").read_text())
        result = EvalResult.model_validate_json((folder / "result.json").read_text())
        notes = sorted((folder / "candidates").glob("*.json"))
        tools = [json.loads(p.read_text())["data"].get("verdict") for p in notes]
        scored = deterministic(result)
        assert scored["candidate"].pop("path") == str(folder / "final.py")  # in its own run's folder
        out[folder.relative_to(root).as_posix()] = {**{k: record[k] for k in SAMPLE_FIELDS}, "result": scored,
                                                    "tools": tools}
    return out


def executors_used(root: Path) -> list[str]:
    return [e["executor"] for e in map(json.loads, (root / "events.jsonl").read_text().splitlines())
            if e["event"] == "run_started"]


@needs_ray
@pytest.mark.slow
def test_a_scripted_run_gives_the_same_results_on_ray_as_local_and_resumes_across_executors(cluster, tmp_path,
                                                                                               capsys):
    runs = tmp_path / "runs"
    assert pkb_run(runs, "here") == 0
    assert pkb_run(runs, "there", "--executor", "ray", "--ray-address", cluster.address) == 0
    assert "evaluations go to the Ray cluster (2 node(s), room for 2 at once)" in capsys.readouterr().err
    here, there = run_outcome(runs / "here"), run_outcome(runs / "there")
    assert there == here
    # check, check, submit (which evaluates nothing itself): all_gather, then all_reduce
    assert [s["tools"] for s in here.values()] == [["shape_mismatch", "shape_mismatch", None],
                                                   ["output_mismatch", "correct", None]]
    assert [s["verdict"] for s in here.values()] == ["shape_mismatch", "correct"]
    for sample in (runs / "there" / "samples").glob("*/*/*"):  # the rank logs came back to the run directory
        assert sorted(p.name for p in (sample / "logs").iterdir()) == ["rank0.log", "rank1.log"]
        assert json.loads((sample / "result.json").read_text())["environment"]["executor"]["name"] == "ray"
    assert executors_used(runs / "there") == ["ray"]

    # Resume across executors: the local run, with one sample undone, continues on Ray in the same folder.
    redo = runs / "here" / "samples" / "all_reduce" / "agent:check" / "0"
    (redo / "sample.json").unlink()
    kept = runs / "here" / "samples" / "all_gather" / "agent:check" / "0" / "sample.json"
    stamp = kept.stat().st_mtime_ns
    assert pkb_run(runs, "here", "--resume", "--executor", "ray", "--ray-address", cluster.address) == 0
    assert run_outcome(runs / "here") == here
    assert kept.stat().st_mtime_ns == stamp  # finished: not redone
    assert json.loads((redo / "result.json").read_text())["environment"]["executor"]["name"] == "ray"
    assert executors_used(runs / "here") == ["local", "ray"]


@needs_ray
def test_a_killed_worker_mid_run_is_retried_and_the_run_completes(ray_executor, all_reduce, tmp_path):
    """The run's final scoring stalls on the cluster; its Ray worker is killed: the evaluation runs again and the
    sample is scored correct (not an infra_error, no second scoring attempt)."""
    marker = tmp_path / "marker"
    marker.mkdir()
    config = RunConfig(model="scripted:test", conditions=["zero-shot"], samples=1, problems=["all_reduce"], trials=2,
                       skip_timing=True, model_attempts=1)
    run_dir = RunDir(tmp_path / "run")
    create_run(run_dir, config, None)
    reply = scripted([("text", fenced(STALL.format(marker=str(marker))))])
    runner = Runner(run_dir, config, [all_reduce], model_factory=lambda: reply, executor=ray_executor,
                    eval_config=eval_config().model_copy(update={"skip_timing": True}))
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(summary=runner.run()))
    thread.start()
    try:
        worker, ranks, folders = _stalled(marker)
        (marker / "release").touch()
        os.kill(worker, signal.SIGKILL)
    finally:
        (marker / "release").touch()
        thread.join(timeout=300)
    assert not thread.is_alive()
    summary = outcome["summary"]
    assert summary.complete and summary.infra_errors == 0 and not summary.errors
    record = summary.records[0]
    assert record["verdict"] == "correct" and record["scoring_attempts"] == 1
    result = json.loads((run_dir.path / "samples" / "all_reduce" / "zero-shot" / "0" / "result.json").read_text())
    assert result["environment"]["executor"]["worker_pid"] != worker  # it ran again, in another worker
    assert executors_used(run_dir.path) == ["ray"]
    wait_for(lambda: not any(pid_alive(p) for p in ranks), 30, "the killed worker's ranks being reaped")
    wait_for(lambda: not any(f.exists() for f in folders), 30, "the killed worker's folders being removed")


@needs_ray
def test_a_lost_node_is_retried_on_another(ray_executor, cluster, all_reduce, tmp_path):
    marker = tmp_path / "marker"
    marker.mkdir()
    stall = tmp_path / "stall_then_sum.py"
    stall.write_text(STALL.format(marker=str(marker)))
    req = request(all_reduce, stall)
    ref = ray_executor.submit(req)
    worker, ranks, folders = _stalled(marker)
    raylet = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])  # the worker's parent
    node = next(n for n in cluster.worker_nodes if n.all_processes["raylet"][0].process.pid == raylet)
    (marker / "release").touch()
    cluster.remove_node(node, allow_graceful=False)  # the node is gone: raylet, object store, workers
    result = ray_executor.collect(req, ref)
    assert result.verdict == "correct"
    assert result.environment["executor"]["node_id"] != node.node_id
    wait_for(lambda: not any(pid_alive(p) for p in ranks), 30, "the lost node's ranks being killed")
    # A lost machine takes its files with it. This node lives on this machine, and removing it kills every
    # process under its raylet at once, the watcher included: its folders are the test's to remove.
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
