"""Where evaluations run: on this node (`local`) or as tasks on a Ray cluster (`ray`), behind one interface.

The runner describes an evaluation as an EvalRequest and gets an EvalResult back. A request carries the
candidate's source, not a path, so a remote node needs no shared filesystem; it names the problem by its
loader spec, which every node resolves against its own install of pkb-agent. Agent loops and model calls
stay in the driver: only the harness runs where the devices are, so no GPU is held while a model thinks.

- LocalExecutor: harness.evaluate on this node, inside a lease of the runner's DeviceScheduler.
- RayExecutor: one Ray task per evaluation, asking for W GPUs (Ray never splits one task's resources over
  nodes, so the W GPUs are on one node: one NVLink island). The task writes the source to a temporary
  file, runs the harness there and returns the EvalResult as JSON plus the rank logs; the driver writes
  the logs into the run directory. A worker or node that dies mid-evaluation makes Ray run the task
  again (max_retries; on another node when the node is gone); when the retries run out the evaluation
  comes back as verdict `infra_error`, which is never charged to the model.

Both executors give the same verdict, failing rank, trial and phase, and flags for the same request (the
tests show it); timings, stage durations and the environment record say where and how fast it ran.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness import failures
from harness.compile import compile_candidate
from harness.config import EvalConfig, TimingConfig
from harness.emulation import layout
from harness.evaluate import evaluate as harness_evaluate
from harness.pool import REPO_ROOT, SAFE_ENV
from harness.problem import Problem
from harness.registry import load_problem_spec
from harness.results import CandidateInfo, EvalResult, Failure

EXECUTORS = ("local", "ray")
# Rank logs are capped by the pool (200 kB each); this bounds what one task sends back in all.
MAX_LOG_BYTES = 1_000_000
# Driver-side bound on one evaluation's Ray task errors kept in an infra_error's evidence.
MAX_EVIDENCE_CHARS = 4000


class ExecutorError(RuntimeError):
    """An executor that cannot be built or reached (Ray missing, cluster unreachable, nodes out of step)."""


# -- the request ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EvalRequest:
    """One evaluation, by value: everything a node needs, as plain JSON-able data."""

    problem_spec: str  # Problem.loader_spec; a node loads it with harness.registry.load_problem_spec
    candidate_source: str  # the candidate file's content (bytes that are not UTF-8 survive: surrogateescape)
    candidate_name: str  # the driver's path of the file: what the result records as candidate.path
    world_size: int
    device: str = "cpu"
    shape: str = "small"
    config: dict[str, Any] = field(default_factory=dict)  # EvalConfig.model_dump(); empty: the device's default
    log_dir: str | None = None  # a driver-side folder for the rank logs (the run's sample folder)

    @classmethod
    def build(cls, problem: Problem, candidate_path: str | Path, *, world_size: int, device: str = "cpu",
              shape: str = "small", config: EvalConfig | None = None, log_dir: str | Path | None = None,
              ) -> EvalRequest:
        """The request for what harness.evaluate(problem, candidate_path, ...) would do."""
        path = Path(candidate_path).resolve()
        config = config or EvalConfig(timing=TimingConfig.for_device(device))
        return cls(problem_spec=problem.loader_spec, candidate_source=_decode(path.read_bytes()),
                   candidate_name=str(path), world_size=world_size, device=device, shape=shape,
                   config=config.model_dump(mode="json"), log_dir=str(log_dir) if log_dir is not None else None)

    @property
    def source_bytes(self) -> bytes:
        return self.candidate_source.encode("utf-8", "surrogateescape")

    def eval_config(self) -> EvalConfig:
        if not self.config:
            return EvalConfig(timing=TimingConfig.for_device(self.device))
        return EvalConfig.model_validate(self.config)

    def to_json(self) -> str:
        """Deterministic JSON (sorted keys): equal requests give equal text."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EvalRequest:
        return cls(**json.loads(text))


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


# -- the interface ----------------------------------------------------------------------------------
class Executor(Protocol):
    """What the runner needs: one evaluation; a harness function on W devices (a profile, a trace); how many
    evaluations fit at once; and to let go of the devices or the cluster at the end."""

    name: str

    def evaluate(self, request: EvalRequest) -> EvalResult: ...

    def run_on_devices(self, world_size: int, device: str, fn: Callable[..., Any], /, *args: Any,
                       **kwargs: Any) -> Any:
        ...

    def capacity(self, world_size: int, device: str) -> int: ...

    def close(self) -> None: ...


class Scheduler(Protocol):
    """What LocalExecutor needs of agent.scheduler.DeviceScheduler."""

    def lease(self) -> Any: ...


# -- shared by both executors -----------------------------------------------------------------------
_problems: dict[str, Problem] = {}
_problems_lock = threading.Lock()


def problem_for(spec: str) -> Problem:
    """The problem a loader spec names, loaded once per process."""
    with _problems_lock:
        if spec not in _problems:
            _problems[spec] = load_problem_spec(spec)
        return _problems[spec]


@contextmanager
def candidate_file(request: EvalRequest) -> Iterator[Path]:
    """The candidate as a file: the driver's own file when it is here with this content, else a temporary copy
    with the same base name (so messages that name the file read the same)."""
    own = Path(request.candidate_name)
    try:
        if own.is_file() and own.read_bytes() == request.source_bytes:
            yield own.resolve()
            return
    except OSError:
        pass
    with tempfile.TemporaryDirectory(prefix="pkb-candidate-") as tmp:
        path = Path(tmp).resolve() / (own.name or "candidate.py")
        path.write_bytes(request.source_bytes)
        yield path


def with_candidate_name(result: EvalResult, evaluated: Path, name: str) -> EvalResult:
    """The result as if the driver's file had been evaluated: its path in the record and in the messages."""
    if str(evaluated) == name:
        return result
    update: dict[str, Any] = {"candidate": CandidateInfo(path=name, sha256=result.candidate.sha256)}
    if result.failure is not None:
        update["failure"] = result.failure.model_copy(update={
            "message": result.failure.message.replace(str(evaluated), name),
            "evidence": result.failure.evidence.replace(str(evaluated), name),
        })
    return result.model_copy(update=update)


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
        return _FileRef(str(value.resolve()), _decode(value.read_bytes()))
    return value


def _unpack(value: Any, folder: Path, driver_root: str) -> Any:
    if isinstance(value, _ProblemRef):
        return problem_for(localize_spec(value.spec, driver_root))
    if isinstance(value, _FileRef):
        path = folder / (Path(value.name).name or "candidate.py")
        path.write_bytes(value.source.encode("utf-8", "surrogateescape"))
        return path
    return value


def _with_gpus(fn: Callable[..., Any], kwargs: dict[str, Any], gpus: list[int] | None) -> dict[str, Any]:
    """`gpus=` for functions that take it (the harness's device functions do): the executor's choice."""
    try:
        takes = "gpus" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    return {**kwargs, "gpus": gpus} if takes else kwargs


def infra_result(request: EvalRequest, message: str, *, evidence: str = "", phase: str = "executor",
                 executor: dict[str, Any] | None = None) -> EvalResult:
    """An evaluation the infrastructure could not finish: verdict infra_error, never the model's fault."""
    config = request.eval_config()
    try:
        problem = problem_for(request.problem_spec)
        name, category, origin = problem.name, problem.category, problem.origin
    except Exception:  # the spec itself may be what failed
        name, category, origin = Path(request.problem_spec.split("::")[-1]).stem, "unknown", "pkb-agent"
    return EvalResult(
        problem=name, category=category, origin=origin, shape=request.shape, world_size=request.world_size,
        device=request.device,  # type: ignore[arg-type]
        candidate=CandidateInfo(path=request.candidate_name, sha256=hashlib.sha256(request.source_bytes).hexdigest()),
        verdict=failures.INFRA_ERROR, correct=False,  # type: ignore[arg-type]
        failure=Failure(verdict=failures.INFRA_ERROR, message=message, phase=phase,  # type: ignore[arg-type]
                        evidence=evidence[-MAX_EVIDENCE_CHARS:]),
        seed=config.seed, trials=config.trials, environment={"executor": executor or {}},
        config=config.model_dump(),
    )


def device_seconds(result: EvalResult) -> float:
    """Seconds the evaluation held its devices, times the GPUs held (the figure a DeviceScheduler lease gives:
    compile included, queueing excluded; ranks sharing a GPU count it once), whichever executor ran it."""
    held = layout.gpus_needed(result.world_size, int(result.config.get("ranks_per_gpu") or 1))
    return held * sum(result.stages.values())


def code_fingerprint() -> str:
    """A hash of the harness and the problem suite as installed here now: two nodes that agree on it score
    alike. Not cached: the rank processes read the files as they are when they start."""
    digest = hashlib.sha256()
    for folder in ("harness", "problems"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            digest.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# -- local ------------------------------------------------------------------------------------------
class LocalExecutor:
    """The harness on this node's devices. With a scheduler, every evaluation runs inside one of its leases
    (W GPUs on CUDA, a rank slot on CPU), native code built before the lease is taken; without one,
    evaluations run where harness.evaluate puts them."""

    name = "local"

    def __init__(self, scheduler: Scheduler | None = None) -> None:
        self.scheduler = scheduler

    @contextmanager
    def _devices(self) -> Iterator[list[int] | None]:
        if self.scheduler is None:
            yield None
            return
        with self.scheduler.lease() as lease:
            yield getattr(lease, "gpus", lease)  # a Lease, or a scheduler that yields the GPU list itself

    def evaluate(self, request: EvalRequest) -> EvalResult:
        try:
            problem = problem_for(request.problem_spec)
            config = request.eval_config()
            log_dir = Path(request.log_dir) if request.log_dir else None
            with candidate_file(request) as path:
                # A GPU never waits on a compiler: native code is built (into the cache the harness's own
                # compile step reads) before the lease; a build that fails needs no device at all, since
                # the harness then stops at its compile step before any rank starts.
                built = True
                if request.device == "cuda" and self.scheduler is not None:
                    built = compile_candidate(path, config.limits.compile_s, request.device,
                                               problem=problem.loader_spec).ok
                with self._devices() if built else nullcontext(None) as gpus:
                    result = harness_evaluate(problem, path, world_size=request.world_size, device=request.device,
                                              shape=request.shape, config=config, log_dir=log_dir, gpus=gpus)
            return with_candidate_name(result, path, request.candidate_name)
        except Exception as exc:  # the harness's own failure: reported, not raised into the agent loop
            return infra_result(request, f"the harness failed: {type(exc).__name__}: {exc}",
                                evidence=traceback.format_exc(), executor={"name": self.name})

    def run_on_devices(self, world_size: int, device: str, fn: Callable[..., Any], /, *args: Any,
                       **kwargs: Any) -> Any:
        """fn(*args, **kwargs) inside a lease (a harness function that needs W devices: a profile, a trace),
        with `gpus=` the lease's GPUs where fn takes it."""
        with self._devices() as gpus:
            return fn(*args, **_with_gpus(fn, kwargs, gpus))

    def evaluate_many(self, requests: Sequence[EvalRequest]) -> list[EvalResult]:
        """In request order; as many at once as the scheduler has leases (one without a scheduler)."""
        with ThreadPoolExecutor(max_workers=self.capacity(), thread_name_prefix="pkb-eval") as pool:
            return list(pool.map(self.evaluate, requests))

    def capacity(self, world_size: int | None = None, device: str | None = None) -> int:
        """Evaluations that run at once: the scheduler's leases (its W and device are fixed)."""
        return max(1, int(getattr(self.scheduler, "capacity", 1) or 1))

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the reaper: no rank process outlives a Ray worker that died ------------------------------------
# Ray kills a dead worker's own process group, but the harness starts every rank in a session of its own
# (so that it can kill a rank with everything the candidate spawned): those would survive a worker killed
# mid-evaluation, holding their GPUs. This watcher, in its own session too, notes the worker's children
# that lead a session; when its stdin closes without the word "done" (the worker is gone), it kills those
# groups, as the harness would have, and removes the folders the dead evaluation left: the ones it was
# given and each rank group's rendezvous folder (harness.pool's pkb-pool-*). Standard library only; Linux
# /proc (elsewhere it does nothing).
_REAPER = r"""
import os, select, shutil, signal, sys
parent, me, folders = int(sys.argv[1]), os.getpid(), sys.argv[2:]
groups = {}  # pid of a session-leading child -> its pool folder, if any

def children():
    found = set()
    try:
        tids = os.listdir(f"/proc/{parent}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{parent}/task/{tid}/children") as f:
                found.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return found

def leads_session(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[3]) == pid
    except (OSError, ValueError, IndexError):
        return False

def pool_folder(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    if "--init-file" in args[:-1]:
        folder = os.path.dirname(args[args.index("--init-file") + 1])
        if os.path.basename(folder).startswith("pkb-pool-"):
            return folder
    return None

while True:
    ready, _, _ = select.select([sys.stdin], [], [], 0.5)
    if ready:
        if sys.stdin.buffer.read(4) == b"done":
            break
        for pgid, folder in groups.items():
            if leads_session(pgid):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except OSError:
                    pass
            if folder:
                folders.append(folder)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        break
    groups = {p: groups[p] if p in groups else pool_folder(p)
              for p in children() if p != me and leads_session(p)}
"""


@contextmanager
def reap_on_death(*folders: Path) -> Iterator[subprocess.Popen[bytes] | None]:
    """While the block runs, a watcher kills this process's session-leading children if this process dies,
    and removes `folders` and their rendezvous folders."""
    if not Path("/proc/self/task").is_dir():
        yield None
        return
    watcher = subprocess.Popen([sys.executable, "-c", _REAPER, str(os.getpid()), *map(str, folders)],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        yield watcher
    finally:
        try:
            assert watcher.stdin is not None
            watcher.stdin.write(b"done")
            watcher.stdin.close()
        except OSError:
            pass
        try:
            watcher.wait(timeout=10)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()


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


def report_node() -> dict[str, Any]:
    """What the driver checks before using a node: it runs pkb-agent, and the same harness and problems."""
    import torch

    return {**node_info(), "code": code_fingerprint(), "python": sys.version.split()[0], "torch": torch.__version__}


def evaluate_on_node(payload: dict[str, Any]) -> dict[str, Any]:
    """The body of one Ray task: {"request", "code", "root"} in, {"result": EvalResult JSON, "logs"} out.

    An exception here is the infrastructure's (the harness reports the candidate's failures in its result),
    so Ray retries it like a worker crash.
    """
    os.environ.update(SAFE_ENV)  # NVLink multicast stays off in the task's own process too
    request = EvalRequest(**payload["request"])
    here = node_info()
    code = code_fingerprint()
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
            result = harness_evaluate(problem, path, world_size=request.world_size, device=request.device,
                                      shape=request.shape, config=request.eval_config(), log_dir=logs, gpus=gpus)
            result = with_candidate_name(result, path, request.candidate_name)
            result = result.model_copy(update={"environment": {**result.environment, "executor": here}})
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
    code = code_fingerprint()
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
            return fn(*args, **_with_gpus(fn, kwargs, gpus))
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
        self.code = code_fingerprint()
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
        payload = {"request": asdict(request), "code": self.code, "root": str(REPO_ROOT)}
        return self._task.options(**self.task_options(request.world_size, request.device)).remote(payload)

    def collect(self, request: EvalRequest, ref: Any) -> EvalResult:
        """The result of a submitted evaluation; the rank logs go to request.log_dir."""
        ray = self._ray
        try:
            reply = ray.get(ref, timeout=self.task_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            return infra_result(request, f"the evaluation's Ray task did not finish within {self.task_timeout_s:.0f} s",
                                executor={"name": self.name})
        except ray.exceptions.RayError as err:  # worker or node died, task raised: after max_retries
            return infra_result(request, f"the evaluation's Ray task failed {self.max_retries + 1} time(s); last: "
                                         f"{type(err).__name__}: {_first_line(err)}",
                                evidence=str(err), executor={"name": self.name})
        result = EvalResult.model_validate_json(reply["result"])
        if request.log_dir and reply.get("logs"):
            folder = Path(request.log_dir)
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in reply["logs"].items():
                (folder / Path(name).name).write_text(text)
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
                   "world_size": world_size, "device": device, "code": self.code, "root": str(REPO_ROOT)}
        # Only lost workers and nodes are retried: an exception of fn is its answer, and goes to the caller.
        options = {**self.task_options(world_size, device), "retry_exceptions": False}
        ref = self._call.options(**options).remote(payload)
        try:
            return ray.get(ref, timeout=self.task_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise ExecutorError(f"{getattr(fn, '__name__', fn)} did not finish on the Ray cluster within "
                                f"{self.task_timeout_s:.0f} s") from None
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
        return [self.collect(r, ref) for r, ref in zip(requests, refs)]

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


# -- construction -----------------------------------------------------------------------------------
def make_executor(name: str = "local", ray_address: str | None = None, *, scheduler: Scheduler | None = None,
                  **ray_options: Any) -> LocalExecutor | RayExecutor:
    """`local` (this node, through `scheduler`) or `ray` (the cluster at `ray_address`)."""
    if name == "local":
        if ray_address is not None:
            raise ExecutorError("--ray-address applies to --executor ray only")
        return LocalExecutor(scheduler)
    if name == "ray":
        return RayExecutor(ray_address, **ray_options)
    raise ExecutorError(f"unknown executor {name!r}; expected one of {', '.join(EXECUTORS)}")


def evaluate_all(executor: Executor, requests: Sequence[EvalRequest]) -> list[EvalResult]:
    """Every request, in order, as concurrently as the executor allows."""
    many: Callable[[Sequence[EvalRequest]], list[EvalResult]] | None = getattr(executor, "evaluate_many", None)
    return many(requests) if many is not None else [executor.evaluate(r) for r in requests]


def as_evaluate(executor: Executor, spent: list[float] | None = None) -> Callable[..., EvalResult]:
    """A function with harness.evaluate.evaluate's signature that evaluates through `executor`, for code below
    the agent layer (tools/) that must not import it. `gpus` is the executor's to choose and is ignored.
    Each evaluation's device_seconds is appended to `spent`."""

    def evaluate(problem: Problem, candidate_path: Path, *, world_size: int, device: str = "cpu",
                 shape: str = "small", config: EvalConfig | None = None, log_dir: Path | None = None,
                 gpus: list[int] | None = None) -> EvalResult:
        result = executor.evaluate(EvalRequest.build(problem, candidate_path, world_size=world_size, device=device,
                                                     shape=shape, config=config, log_dir=log_dir))
        if spent is not None:
            spent.append(device_seconds(result))
        return result

    return evaluate


def as_device_call(executor: Executor, spent: list[float] | None = None) -> Callable[..., Any]:
    """executor.run_on_devices, appending wall seconds times W of each call to `spent` (queueing included:
    a device call reports no stages)."""

    def call(world_size: int, device: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return executor.run_on_devices(world_size, device, fn, *args, **kwargs)
        finally:
            if spent is not None:
                spent.append((time.perf_counter() - started) * world_size)

    return call


# -- the command line -------------------------------------------------------------------------------
def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    """`--executor local|ray`, `--ray-address ADDR`, `--ray-retries N` (for `pkb run`)."""
    parser.add_argument("--executor", choices=EXECUTORS, default="local",
                        help="where evaluations run: this node (local, default) or a Ray cluster (ray)")
    parser.add_argument("--ray-address", default=None,
                        help="the Ray cluster's address (what `ray start --head` printed, or 'auto'); default: "
                             "RAY_ADDRESS, else a cluster started on this machine, else a new one-node instance")
    parser.add_argument("--ray-retries", type=int, default=3,
                        help="times an evaluation whose Ray worker or node died is run again (default 3)")


def executor_from_args(args: argparse.Namespace, *, device: str, world_size: int,
                       scheduler: Scheduler | None = None) -> LocalExecutor | RayExecutor:
    """The executor the options ask for, for a run of W ranks on `device`; bad options, an unreachable
    cluster and a cluster with no node of W devices are one-line CliErrors."""
    from agent.cli_common import CliError

    name = getattr(args, "executor", "local") or "local"
    address = getattr(args, "ray_address", None)
    retries = getattr(args, "ray_retries", 3)
    if retries is None or retries < 0:
        raise CliError(f"--ray-retries must be at least 0, got {retries}")
    try:
        if name != "ray":
            return make_executor(name, address, scheduler=scheduler)
        check_reachable(address)  # before Ray is even imported
        executor = make_executor("ray", address, max_retries=retries, device=device)
    except ExecutorError as err:
        raise CliError(str(err)) from None
    if executor.capacity(world_size, device) < 1:
        executor.close()
        unit = "GPUs" if device == "cuda" else f"{executor.resource(device)} units"
        raise CliError(f"no live node of the Ray cluster has {world_size} {unit} for one evaluation "
                       f"(a task's devices all come from one node)")
    return executor
