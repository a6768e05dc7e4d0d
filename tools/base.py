"""What every model-facing tool shares: the sample's context, the outcome record, candidate files.

A tool takes the model's candidate source (or nothing), saves it as the sample's next candidate file,
runs the harness (which starts its own killable processes), and returns a ToolOutcome: a short text for
the model, bounded by `answer_tokens` (tools/render.py), and structured data for the transcript and the
candidate's .json file. GPU seconds are the wall time of the harness work on device "cuda" times the
number of ranks (zero on CPU), so budgets charge what the GPUs were held for. tools.dispatch.run_tool runs
one call; tools.specs says what each tool takes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.common.hostile_files import replace_file
from harness.config import EvalConfig
from harness.problems.problem import Problem
from harness.records.redaction import redact_text
from tools import render

CANDIDATES_DIR = "candidates"
FINAL_FILE = "final.py"
_CANDIDATE = re.compile(r"^(\d{3,})\.py$")


class ToolInputError(ValueError):
    """The model called a tool with unusable arguments; the message goes back to the model."""


@dataclass
class ToolContext:
    """One sample's fixed facts (problem, shape, W, device, evaluation settings) and its folder."""

    problem: Problem
    world_size: int
    device: str  # "cpu" | "cuda"
    shape: str
    config: EvalConfig
    workdir: Path  # the sample folder: candidates/NNN.py (+ .json), final.py
    gpus: list[int] | None = None
    answer_tokens: int = 600
    # Where device work runs when not on this process's `gpus` (the agent's executor: a Ray cluster). `evaluate`
    # has harness.evaluate.evaluate's signature; `on_devices(W, device, fn, *args, **kwargs)` runs a harness
    # function that needs W devices and returns its answer. None: here.
    evaluate: Callable[..., Any] | None = None
    on_devices: Callable[..., Any] | None = None
    counter: int = 0  # the next candidate number (never reuses a number already on disk)
    # The bash condition (tools/bash.py): the file its harness commands and the final scoring take from the
    # scratch folder, the time limit of one command, and host folders its sandbox must not see (the run's).
    shell_solution: str = "solution.py"
    shell_timeout_s: float = 120.0  # PKB's agent allows 900 s (its eval command runs a whole benchmark)
    shell_hide: tuple[Path, ...] = ()
    artifacts_dir: Path | None = None  # where tools keep raw artifacts (the Nsight reports); None: nowhere

    def __post_init__(self) -> None:
        # Every path a tool hands to the harness is absolute: the harness's helpers run in processes of
        # their own (other working directories), and a relative runs folder must mean the same there.
        self.workdir = Path(self.workdir).resolve()

    @property
    def candidates_dir(self) -> Path:
        return Path(self.workdir) / CANDIDATES_DIR

    def next_candidate_path(self) -> Path:
        """candidates/NNN.py with NNN one more than every candidate so far, on disk or in this context.

        Looking at the disk keeps numbering increasing when a sample resumes with a fresh context."""
        folder = self.candidates_dir
        folder.mkdir(parents=True, exist_ok=True)
        on_disk = [int(m.group(1)) for p in folder.iterdir() if (m := _CANDIDATE.match(p.name))]
        n = max([self.counter, *(i + 1 for i in on_disk)])
        self.counter = n + 1
        return folder / f"{n:03d}.py"

    def gpu_seconds(self, wall_s: float) -> float:
        return wall_s * self.world_size if self.device == "cuda" else 0.0


@dataclass
class ToolOutcome:
    name: str
    text: str  # what the model sees, within ctx.answer_tokens
    data: dict[str, Any] = field(default_factory=dict)  # structured: verdict, EvalResult dump, stages, ...
    gpu_seconds: float = 0.0
    candidate: Path | None = None
    ends_sample: bool = False

    def record(self) -> dict[str, Any]:
        """A JSON-ready view (for the transcript, the candidate's .json and LangChain artifacts)."""
        return {"tool": self.name, "text": self.text, "data": self.data, "gpu_seconds": self.gpu_seconds,
                "candidate": str(self.candidate) if self.candidate else None, "ends_sample": self.ends_sample}


# -- helpers the tools share ---------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})[^\n]*\n(.*?)\n\s*\1\s*$", re.DOTALL)


def source_arg(args: dict[str, Any], required: bool = True) -> str | None:
    """The candidate source from a tool call. A whole-file markdown fence around it is removed (models do
    that); anything else is taken as is."""
    source = args.get("source")
    if source is None or (isinstance(source, str) and not source.strip()):
        if required:
            raise ToolInputError("this tool needs `source`: the complete candidate file (Python, defining "
                                 "solution(...)), not a diff or a description")
        return None
    if not isinstance(source, str):
        raise ToolInputError(f"`source` must be a string holding the whole file, got {type(source).__name__}")
    fenced = _FENCE.match(source.strip("\n"))
    if fenced:
        source = fenced.group(2)
    return source if source.endswith("\n") else source + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Candidate files and their records, redacted (harness.records.redaction), written atomically."""
    replace_file(path, redact_text(text).encode())


def save_candidate(ctx: ToolContext, source: str) -> Path:
    path = ctx.next_candidate_path()
    write_atomic(path, source)
    return path


def save_record(outcome: ToolOutcome, ctx: ToolContext) -> None:
    """candidates/NNN.json beside the candidate: the tool's structured result for it."""
    if outcome.candidate is None:
        return
    source = outcome.candidate.read_bytes()
    record = {"tool": outcome.name, "candidate": f"{CANDIDATES_DIR}/{outcome.candidate.name}",
              "sha256": hashlib.sha256(source).hexdigest(),
              "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
              "problem": ctx.problem.name, "shape": ctx.shape, "world_size": ctx.world_size, "device": ctx.device,
              "gpu_seconds": outcome.gpu_seconds, "ends_sample": outcome.ends_sample, "text": outcome.text,
              "data": outcome.data}
    write_atomic(outcome.candidate.with_suffix(".json"), json.dumps(record, indent=1, default=str))


@contextmanager
def stopwatch() -> Iterator[dict[str, float]]:
    box = {"seconds": 0.0}
    started = time.perf_counter()
    try:
        yield box
    finally:
        box["seconds"] = time.perf_counter() - started


def as_data(value: Any) -> Any:
    """A JSON-ready form of a harness result: pydantic models dumped, dataclasses as dicts, else repr."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json.loads(json.dumps(dataclasses.asdict(value), default=str))
    if isinstance(value, (dict, list, str, int, float, bool)) or value is None:
        return json.loads(json.dumps(value, default=str))
    return {"repr": repr(value)[:4000]}


def bounded(ctx: ToolContext, blocks: Sequence[render.Block | str]) -> str:
    return render.fit(blocks, ctx.answer_tokens)
