"""One evaluation by value (EvalRequest), and what both executors do with one: the candidate as a file, the
result as if the driver's own file was evaluated, an infra_error result, the device seconds it held."""

from __future__ import annotations

import hashlib
import inspect
import json
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.common import failures
from harness.config import EvalConfig, TimingConfig
from harness.emulation import layout
from harness.problems.problem import Problem
from harness.problems.registry import load_problem_spec
from harness.records.results import CandidateInfo, EvalResult, Failure

# Driver-side bound on one evaluation's Ray task errors kept in an infra_error's evidence.
MAX_EVIDENCE_CHARS = 4000


@dataclass(frozen=True)
class EvalRequest:
    """One evaluation, by value: everything a node needs, as plain JSON-able data."""

    problem_spec: str  # Problem.loader_spec; a node loads it with harness.problems.registry.load_problem_spec
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
        return cls(problem_spec=problem.loader_spec, candidate_source=decode(path.read_bytes()),
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


def decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


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



def with_gpus(fn: Callable[..., Any], kwargs: dict[str, Any], gpus: list[int] | None) -> dict[str, Any]:
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
        device=request.device,
        candidate=CandidateInfo(path=request.candidate_name, sha256=hashlib.sha256(request.source_bytes).hexdigest()),
        verdict=failures.INFRA_ERROR, correct=False,
        failure=Failure(verdict=failures.INFRA_ERROR, message=message, phase=phase, infra_cause="executor",
                        evidence=evidence[-MAX_EVIDENCE_CHARS:]),
        seed=config.seed, trials=config.trials, environment={"executor": executor or {}},
        config=config.model_dump(),
    )


# Stages of harness.evaluate that run inside others: `launch` (the candidate's ranks starting) while the reference
# is prepared (what the reference left of it is `launch_wait`), `build_in_call` inside `check`.
OVERLAPPING_STAGES = frozenset({"launch", "build_in_call"})


def held_seconds(result: EvalResult) -> float:
    """Seconds the evaluation held its devices: what its executor measured (environment.executor.held_s: the
    lease, the Ray task), else the sum of the harness's stages that do not run inside one another."""
    executor = result.environment.get("executor")
    held = executor.get("held_s") if isinstance(executor, dict) else None
    if isinstance(held, (int, float)) and not isinstance(held, bool):
        return float(held)
    return sum(v for k, v in result.stages.items() if k not in OVERLAPPING_STAGES)


def device_seconds(result: EvalResult) -> float:
    """Seconds the evaluation held its devices, times the GPUs held (the figure a DeviceScheduler lease gives:
    compile included, queueing excluded; ranks sharing a GPU count it once), whichever executor ran it."""
    return layout.device_seconds(held_seconds(result), result.world_size,
                                 int(result.config.get("ranks_per_gpu") or 1))
