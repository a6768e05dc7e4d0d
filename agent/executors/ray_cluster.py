"""RayExecutor: evaluations as Ray tasks on a cluster, and what such a task runs on its node."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.executors import ExecutorError
from agent.executors.reaper import reap_on_death
from agent.executors.request import (
    EvalRequest,
    decode,
    infra_result,
    problem_for,
    with_candidate_name,
    with_gpus,
)
from agent.rundir import write_text_atomic
from harness import cancel
from harness.common.paths import REPO_ROOT
from harness.common.safe_env import SAFE_ENV
from harness.evaluate import evaluate as harness_evaluate
from harness.problems.problem import Problem
from harness.records.results import EvalResult

# Rank logs are capped by the pool (200 kB each); this bounds what one task sends back in all.
MAX_LOG_BYTES = 1_000_000
CANCEL_POLL_S = 0.5  # how often a wait for a task looks whether the driver was interrupted (Ctrl-C)
# After Ctrl-C, how long a task gets to end once interrupted (Ray raises KeyboardInterrupt in it: the harness
# kills its rank pools and removes its folders), before it is cancelled with force (Ray kills the worker).
CANCEL_GRACE_S = 5.0


@dataclass(frozen=True)
class _ProblemRef:
    """A Problem argument of a device call, sent by loader spec (a Problem holds its module: not picklable)."""

    spec: str


@dataclass(frozen=True)
class _FileRef:
    """A file argument of a device call (the candidate), sent by content and written again where it runs."""

    name: str
    source: str


def _pack(value: Any) -> Any:
    if isinstance(value, Problem):
        return _ProblemRef(value.loader_spec)
    if isinstance(value, Path) and value.is_file():
        return _FileRef(str(value.resolve()), decode(value.read_bytes()))
    return value


def _unpack(value: Any, folder: Path, driver_root: str) -> Any:
    if isinstance(value, _ProblemRef):
        return problem_for(localize_spec(value.spec, driver_root))
    if isinstance(value, _FileRef):
        path = folder / (Path(value.name).name or "candidate.py")
        path.write_bytes(value.source.encode("utf-8", "surrogateescape"))
        return path
    return value



def code_hash() -> str:
    """A hash of the harness and the problem suite as installed here now: two nodes that agree on it score
    alike. Not cached: the rank processes read the files as they are when they start."""
    digest = hashlib.sha256()
    for folder in ("harness", "problems"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            digest.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]



# -- ray: what runs on a node -----------------------------------------------------------------------
def localize_spec(spec: str, driver_root: str) -> str:
    """A suite problem's path on the driver as the same file of this node's install."""
    if spec.startswith("pkb:"):
        return spec  # a PKB checkout: the same path on every node (docs/ray.md)
    try:
        relative = Path(spec).relative_to(driver_root)
    except ValueError:
        return spec
    return str(REPO_ROOT / relative)


def node_info() -> dict[str, Any]:
    import ray

    context = ray.get_runtime_context()
    return {"name": "ray", "node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "worker_pid": os.getpid()}


def _assigned_gpus(world_size: int) -> list[int] | None:
    """The physical GPUs Ray gave this task, for harness.evaluate's `gpus`."""
    import ray

    ids = [str(i) for i in ray.get_gpu_ids()]
    if len(ids) != world_size:
        raise RuntimeError(f"Ray assigned {len(ids)} GPUs ({', '.join(ids) or 'none'}) for {world_size} ranks")
    if all(i.isdigit() for i in ids):
        return [int(i) for i in ids]
    return None  # UUIDs: CUDA_VISIBLE_DEVICES, which Ray set for this worker, already names exactly these


def threads_as_on_the_driver(value: str | None) -> None:
    """OMP_NUM_THREADS in this task as the driver has it (unset: the harness's own default, one thread per CPU
    rank). Ray sets it in a task to the task's CPU count where the node leaves it unset: W for a CPU evaluation
    of W ranks, so each of the W ranks ran W threads on the W CPUs the task holds; and with more than one
    thread torch's import starts its pool, so neither pool could fork its ranks from one import
    (harness.rank.launcher) and an evaluation paid six torch imports instead of one."""
    if value is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = value


def report_node() -> dict[str, Any]:
    """What the driver checks before using a node: it runs pkb-agent, and the same harness and problems."""
    import torch

    return {**node_info(), "code": code_hash(), "python": sys.version.split()[0], "torch": torch.__version__}


def evaluate_on_node(payload: dict[str, Any]) -> dict[str, Any]:
    """The body of one Ray task: {"request", "code", "root", "threads"} in, {"result": EvalResult JSON, "logs"} out.

    An exception here is the infrastructure's (the harness reports the candidate's failures in its result),
    so Ray retries it like a worker crash.
    """
    os.environ.update(SAFE_ENV)  # NVLink multicast stays off in the task's own process too
    threads_as_on_the_driver(payload["threads"])
    request = EvalRequest(**payload["request"])
    here = node_info()
    code = code_hash()
    if payload["code"] != code:
        result = infra_result(request, f"node {here['node_ip']} runs other harness or problem code (fingerprint "
                                       f"{code}, the driver's {payload['code']}): install the same pkb-agent on "
                                       "every node", executor=here)
        return {"result": result.model_dump_json(), "logs": {}}
    spec = localize_spec(request.problem_spec, payload["root"])
    gpus = _assigned_gpus(request.world_size) if request.device == "cuda" else None
    problem = problem_for(spec)
    folder = Path(tempfile.mkdtemp(prefix="pkb-ray-")).resolve()
    with reap_on_death(folder):
        try:
            path = folder / (Path(request.candidate_name).name or "candidate.py")
            path.write_bytes(request.source_bytes)
            logs = folder / "logs"
            held = time.perf_counter()
            result = harness_evaluate(problem, path, world_size=request.world_size, device=request.device,
                                      shape=request.shape, config=request.eval_config(), log_dir=logs, gpus=gpus)
            held = time.perf_counter() - held  # the task holds its GPUs this long (the stages overlap)
            result = with_candidate_name(result, path, request.candidate_name)
            result = result.model_copy(update={"environment": {**result.environment,
                                                               "executor": {**here, "held_s": round(held, 6)}}})
            texts: dict[str, str] = {}
            budget = MAX_LOG_BYTES
            for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
                data = log.read_bytes()[-budget:] if budget > 0 else b""
                budget -= len(data)
                texts[log.name] = data.decode(errors="replace")
        finally:  # inside the watch: a worker stopped once the watcher stands down has nothing left behind
            shutil.rmtree(folder, ignore_errors=True)
    return {"result": result.model_dump_json(), "logs": texts}


def call_on_node(payload: dict[str, Any]) -> Any:
    """The body of a device call's Ray task: fn(*args, **kwargs) on this node's W GPUs, Problems and files
    unpacked here; its return value goes back as it is (pickled by Ray)."""
    os.environ.update(SAFE_ENV)
    threads_as_on_the_driver(payload["threads"])
    code = code_hash()
    if payload["code"] != code:
        raise ExecutorError(f"node {node_info()['node_ip']} runs other harness or problem code "
                            f"({code}, the driver's {payload['code']})")
    fn = payload["fn"]
    gpus = _assigned_gpus(payload["world_size"]) if payload["device"] == "cuda" else None
    folder = Path(tempfile.mkdtemp(prefix="pkb-ray-")).resolve()
    with reap_on_death(folder):
        try:
            args = [_unpack(a, folder, payload["root"]) for a in payload["args"]]
            kwargs = {k: _unpack(v, folder, payload["root"]) for k, v in payload["kwargs"].items()}
            return fn(*args, **with_gpus(fn, kwargs, gpus))
        finally:
            shutil.rmtree(folder, ignore_errors=True)


# -- ray: the driver side ---------------------------------------------------------------------------
def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ExecutorError("--executor ray needs Ray: pip install 'pkb-agent[ray]'") from None
    return ray


def check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """Fail fast on a cluster address nothing listens at: ray.init would retry for minutes."""
    if not address or address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ExecutorError(f"--ray-address {address!r}: expected HOST:PORT (what `ray start --head` printed)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ExecutorError(f"cannot reach the Ray cluster at {address}: {err.strerror or err}") from None


class RayExecutor:
    """Evaluations as Ray tasks on a cluster. `address`: the cluster's (`ray start --head` prints it; "auto"
    finds one started on this machine; None: RAY_ADDRESS, or a cluster started here, else a new one-node
    instance of this machine's devices).

    Each task asks for W units of a resource on one node: GPUs on CUDA; on CPU runs `cpu_resource` (CPU by
    default; tests and the benchmark declare logical GPUs per node and pass "GPU"). `max_retries`: how often
    Ray runs a task again after its worker or node died or it raised; after that the result is infra_error.
    `task_timeout_s` bounds one evaluation, queueing included (None: the harness's own phase limits only).
    `device`, when known, limits the start-up check to the nodes that can take that device's evaluations.
    """

    name = "ray"

    def __init__(self, address: str | None = None, *, cpu_resource: str = "CPU", max_retries: int = 3,
                 task_timeout_s: float | None = None, runtime_env: dict[str, Any] | None = None,
                 check_nodes: bool = True, probe_timeout_s: float = 300.0, device: str | None = None) -> None:
        if max_retries < 0:
            raise ExecutorError(f"max_retries must be at least 0, got {max_retries}")
        ray = import_ray()
        self._ray = ray
        self.cpu_resource = cpu_resource
        self.device = device
        self.max_retries = max_retries
        self.task_timeout_s = task_timeout_s
        self.owns_connection = False
        if not ray.is_initialized():
            check_reachable(address)
            try:
                ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, namespace="pkb-agent")
            except Exception as exc:  # ConnectionError, ValueError for a malformed address, ...
                raise ExecutorError(f"cannot connect to the Ray cluster at {address or 'a new local instance'}: "
                                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
            self.owns_connection = True
        self._task = ray.remote(evaluate_on_node)
        self._call = ray.remote(call_on_node)
        self._report = ray.remote(report_node)
        self.code = code_hash()
        self.nodes: list[dict[str, Any]] = []
        if check_nodes:
            try:
                self.nodes = self.check_nodes(probe_timeout_s)
            except BaseException:
                self.close()
                raise

    # -- resources ----------------------------------------------------------------------------------
    def resource(self, device: str) -> str:
        return "GPU" if device == "cuda" else self.cpu_resource

    def task_options(self, world_size: int, device: str) -> dict[str, Any]:
        """The Ray options of one evaluation's task (the benchmark's synthetic tasks use them too)."""
        options: dict[str, Any] = {"max_retries": self.max_retries, "retry_exceptions": True, "num_cpus": 0}
        resource = self.resource(device)
        if resource == "GPU":
            options["num_gpus"] = world_size
        elif resource == "CPU":
            options["num_cpus"] = world_size
        else:
            options["resources"] = {resource: world_size}
        return options

    def capacity(self, world_size: int, device: str = "cuda") -> int:
        """Evaluations of W ranks the live nodes can hold at once."""
        resource = self.resource(device)
        return sum(int(n["Resources"].get(resource, 0) // world_size)
                   for n in self._ray.nodes() if n.get("Alive"))

    def check_nodes(self, timeout_s: float = 300.0) -> list[dict[str, Any]]:
        """Ask every live node that can take evaluations what it runs; refuse nodes out of step."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        resources = {self.resource(self.device)} if self.device else {"GPU", self.cpu_resource}
        nodes = [n for n in ray.nodes() if n.get("Alive") and any(n["Resources"].get(r, 0) >= 1 for r in resources)]
        if not nodes:
            raise ExecutorError(f"the Ray cluster has no live node with {' or '.join(sorted(resources))} "
                                "(`ray start ... --num-gpus N` declares GPUs)")
        refs = [self._report.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            n["NodeID"], soft=False)).remote() for n in nodes]
        try:
            reports = ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            for ref in refs:
                ray.cancel(ref, force=True)
            raise ExecutorError(f"Ray nodes did not answer within {timeout_s:.0f} s") from None
        except ray.exceptions.RayError as err:
            raise ExecutorError("a Ray node cannot run pkb-agent (is it installed there?): "
                                f"{_first_line(err)}") from None
        stale = [r for r in reports if r["code"] != self.code]
        if stale:
            where = ", ".join(f"{r['node_ip']} ({r['code']})" for r in stale)
            raise ExecutorError(f"Ray nodes run other harness or problem code than this driver ({self.code}): "
                                f"{where}; install the same pkb-agent on every node")
        return reports

    # -- evaluations --------------------------------------------------------------------------------
    def submit(self, request: EvalRequest) -> Any:
        """Start one evaluation; `collect` waits for it."""
        payload = {"request": asdict(request), "code": self.code, "root": str(REPO_ROOT),
                   "threads": os.environ.get("OMP_NUM_THREADS")}
        return self._task.options(**self.task_options(request.world_size, request.device)).remote(payload)

    def _wait(self, ref: Any) -> bool:
        """Wait for a task as ray.get(ref, timeout=task_timeout_s) would, looking every CANCEL_POLL_S whether
        the driver was interrupted: True once it finished, False when the timeout passed. After Ctrl-C
        (harness.cancel) the task is cancelled: Ray raises KeyboardInterrupt in it, so the harness kills its
        rank pools and removes its folders; one still running CANCEL_GRACE_S later is cancelled with force (Ray
        kills its worker, and the reaper beside the evaluation ends the rank groups it leaves). Then Cancelled
        is raised."""
        ray = self._ray
        deadline = None if self.task_timeout_s is None else time.monotonic() + self.task_timeout_s
        while True:
            if cancel.requested():
                ray.cancel(ref, force=False)
                ended, _ = ray.wait([ref], timeout=CANCEL_GRACE_S)
                if not ended:
                    ray.cancel(ref, force=True)
                cancel.check()
            step = CANCEL_POLL_S if deadline is None else min(CANCEL_POLL_S, deadline - time.monotonic())
            if step <= 0:
                return False
            ready, _ = ray.wait([ref], timeout=step)
            if ready:
                return True

    def collect(self, request: EvalRequest, ref: Any) -> EvalResult:
        """The result of a submitted evaluation; the rank logs go to request.log_dir."""
        ray = self._ray
        try:
            if not self._wait(ref):
                ray.cancel(ref, force=True)
                return infra_result(request, f"the evaluation's Ray task did not finish within "
                                             f"{self.task_timeout_s:.0f} s", executor={"name": self.name})
            reply = ray.get(ref)
        except ray.exceptions.RayError as err:  # worker or node died, task raised: after max_retries
            return infra_result(request, f"the evaluation's Ray task failed {self.max_retries + 1} time(s); last: "
                                         f"{type(err).__name__}: {_first_line(err)}",
                                evidence=str(err), executor={"name": self.name})
        result = EvalResult.model_validate_json(reply["result"])
        if request.log_dir and reply.get("logs"):
            folder = Path(request.log_dir)
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in reply["logs"].items():
                write_text_atomic(folder / Path(name).name, text)  # redacted, like every record
        return result

    def evaluate(self, request: EvalRequest) -> EvalResult:
        return self.collect(request, self.submit(request))

    def run_on_devices(self, world_size: int, device: str, fn: Callable[..., Any], /, *args: Any,
                       **kwargs: Any) -> Any:
        """fn(*args, **kwargs) as a Ray task holding W GPUs of one node, as an evaluation would (`fn` a function
        of an installed module: the node imports it; Problems and existing files among the arguments travel
        by spec and content; `gpus=` is the task's GPUs where fn takes it). After the retries, an
        ExecutorError."""
        ray = self._ray
        payload = {"fn": fn, "args": [_pack(a) for a in args], "kwargs": {k: _pack(v) for k, v in kwargs.items()},
                   "world_size": world_size, "device": device, "code": self.code, "root": str(REPO_ROOT),
                   "threads": os.environ.get("OMP_NUM_THREADS")}
        # Only lost workers and nodes are retried: an exception of fn is its answer, and goes to the caller.
        options = {**self.task_options(world_size, device), "retry_exceptions": False}
        ref = self._call.options(**options).remote(payload)
        try:
            if not self._wait(ref):
                ray.cancel(ref, force=True)
                raise ExecutorError(f"{getattr(fn, '__name__', fn)} did not finish on the Ray cluster within "
                                    f"{self.task_timeout_s:.0f} s")
            return ray.get(ref)
        except ray.exceptions.RayTaskError as err:  # fn itself raised: the caller gets that very exception
            # err.cause is fn's exception as the node raised it (Ray swaps in a RayError when it does not pickle).
            # as_instanceof_cause() would give a RayTaskError subclass whose str() is Ray's whole report, so a
            # KeyError('x') would no longer read as one.
            cause = err.cause
            if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
                raise cause from None
            raise ExecutorError(f"{getattr(fn, '__name__', fn)} failed on the Ray cluster: "
                                f"{_first_line(err)}") from None
        except ray.exceptions.RayError as err:
            raise ExecutorError(f"{getattr(fn, '__name__', fn)} failed on the Ray cluster {self.max_retries + 1} "
                                f"time(s); last: {type(err).__name__}: {_first_line(err)}") from None

    def evaluate_many(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        """All submitted at once (Ray queues what the cluster cannot hold yet); results in request order."""
        refs = [self.submit(r) for r in requests]
        try:
            return [self.collect(r, ref) for r, ref in zip(requests, refs)]
        except cancel.Cancelled:  # Ctrl-C: the queued ones never start either
            for ref in refs:
                self._ray.cancel(ref, force=True)
            raise

    def close(self) -> None:
        if self.owns_connection and self._ray.is_initialized():
            self._ray.shutdown()
        self.owns_connection = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[0].strip()[:300] if lines else type(err).__name__
