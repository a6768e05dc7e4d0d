"""What every model-facing tool shares: the sample's context, the outcome record, candidate files.

A tool takes the model's candidate source (or nothing), saves it as the sample's next candidate file,
runs the harness (which starts its own killable processes), and returns a ToolOutcome: a short text for
the model, bounded by `answer_tokens` (tools/render.py), and structured data for the transcript and the
candidate's .json file. GPU seconds are the wall time of the harness work on device "cuda" times the
number of ranks (zero on CPU), so budgets charge what the GPUs were held for. tools.dispatch.run_tool runs
one call; tools.specs says what each tool takes.

The model's arguments are hostile input like a candidate's files: `argument_refusal` bounds their size
and nesting before anything is saved or parsed (one line naming the limit goes back to the model), and the
whole-file fence around a source is found in one linear pass (a backtracking pattern took minutes on a
400 KB source with an unclosed fence).

A tool's harness work ends by `ToolContext.deadline` (the sample's wall budget): `within_deadline` bounds the
whole of it, queueing for build slots, memory and devices included, with harness.cancel's deadline; going
over stops it the way Ctrl-C does (its processes killed, its folders removed) and `out_of_wall` is the
answer: the model reads that the wall budget ran out, and the sample stops with max_wall.
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
from typing import Any, Protocol

from harness import cancel
from harness.common.hostile_files import replace_file
from harness.config import EvalConfig
from harness.emulation import layout
from harness.problems.problem import Problem
from harness.records.redaction import redact_text
from tools import render

CANDIDATES_DIR = "candidates"
# What a tool call's arguments may hold (argument_refusal): a string argument (the source, a shell command,
# a topic) at most MAX_SOURCE_BYTES, all of them together a little more, containers nested at most
# MAX_ARGUMENT_DEPTH deep (every tool takes a flat object: deeper is never a real call).
MAX_SOURCE_BYTES = 1 << 20
MAX_ARGUMENTS_BYTES = MAX_SOURCE_BYTES + (64 << 10)
MAX_ARGUMENT_DEPTH = 4
FINAL_FILE = "final.py"
_CANDIDATE = re.compile(r"^(\d{3,})\.py$")


class ToolInputError(ValueError):
    """The model called a tool with unusable arguments; the message goes back to the model."""


class RunSettings(Protocol):
    """What the tools read of the run's settings. agent.run_config.RunConfig is one: the agent hands its own over
    (a view, nothing copied); a tool called outside a run gets a ToolSettings."""

    @property
    def world_size(self) -> int: ...

    @property
    def device(self) -> str: ...  # "cpu" | "cuda"

    @property
    def shape(self) -> str: ...

    @property
    def answer_tokens(self) -> int: ...  # the budget of a tool's answer to the model (tools/render.py)


@dataclass(frozen=True)
class ToolSettings:
    """RunSettings of a tool called outside a run (tests, benchmarks)."""

    world_size: int
    device: str
    shape: str
    answer_tokens: int = 600


@dataclass
class ToolContext:
    """One sample's fixed facts (problem, the run's settings, evaluation settings) and its folder."""

    problem: Problem
    settings: RunSettings  # W, device, shape, answer budget: read through the properties below
    config: EvalConfig
    workdir: Path  # the sample folder: candidates/NNN.py (+ .json), final.py
    gpus: list[int] | None = None
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
    # time.monotonic() by which the tool's harness work must have ended (the sample's wall budget); None: no limit.
    deadline: float | None = None

    def __post_init__(self) -> None:
        # Every path a tool hands to the harness is absolute: the harness's helpers run in processes of
        # their own (other working directories), and a relative runs folder must mean the same there.
        self.workdir = Path(self.workdir).resolve()

    @property
    def world_size(self) -> int:
        return self.settings.world_size

    @property
    def device(self) -> str:
        return self.settings.device

    @property
    def shape(self) -> str:
        return self.settings.shape

    @property
    def answer_tokens(self) -> int:
        return self.settings.answer_tokens

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
        """GPU-seconds of `wall_s` with the ranks up (harness.emulation.layout.device_seconds); none on CPU."""
        if self.device != "cuda":
            return 0.0
        return layout.device_seconds(wall_s, self.world_size, self.config.ranks_per_gpu)


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

def argument_refusal(name: str, args: Any) -> str | None:
    """The one line that refuses a tool call's arguments (size or nesting over the limits above), or None.
    Walked without recursion, and left at the first limit passed: a hostile object costs no more than the
    limit."""
    if not isinstance(args, dict):
        return f"{name}: the arguments must be one JSON object, got {type(args).__name__}"
    total = 0
    stack: list[tuple[Any, int, str]] = [(args, 1, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_ARGUMENT_DEPTH:
                return (f"{name}: the arguments are nested more than {MAX_ARGUMENT_DEPTH} deep (at `{where}`); "
                        "send a flat JSON object")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                total += len(str(key)) + 1
                stack.append((item, depth + 1, where or str(key)))
        elif isinstance(value, str):
            size = len(value) if len(value) > MAX_SOURCE_BYTES else len(value.encode("utf-8", "surrogatepass"))
            if size > MAX_SOURCE_BYTES:
                return (f"{name}: `{where}` is {size:,} characters; the limit is {MAX_SOURCE_BYTES:,} bytes "
                        f"({MAX_SOURCE_BYTES >> 20} MiB): send a smaller file")
            total += size
        else:
            total += 1
        if total > MAX_ARGUMENTS_BYTES:
            return (f"{name}: the arguments hold over {MAX_ARGUMENTS_BYTES:,} bytes in all; the limit is "
                    f"{MAX_ARGUMENTS_BYTES:,}: send less")
    return None


def strip_fence(text: str) -> str | None:
    """The body of a markdown fence around the whole of `text`, else None; one pass, no backtracking.

    The rule the earlier pattern `^\\s*(`{3,}|~{3,})[^\\n]*\\n(.*?)\\n\\s*\\1\\s*$` (DOTALL) stated: the
    first non-blank characters open a fence (three or more backticks or tildes) whose line ends with a
    newline; the last non-blank characters close it, with the same character, at least three and at most
    as many as opened it, preceded by a newline after the opening line; the body lies between the opening
    line's newline and the first newline of the blank run before the closing fence."""
    n = len(text)
    i = 0
    while i < n and text[i].isspace():
        i += 1
    if i == n or text[i] not in "`~":
        return None
    mark = text[i]
    j = i
    while j < n and text[j] == mark:
        j += 1
    opened = j - i
    newline = text.find("\n", j)
    if opened < 3 or newline < 0:
        return None
    end = n - 1
    while end > newline and text[end].isspace():
        end -= 1
    start = end
    while start > newline and text[start] == mark:
        start -= 1
    if not 3 <= end - start <= opened:
        return None
    blank = start
    while blank > newline and text[blank].isspace():
        blank -= 1
    body_end = text.find("\n", max(blank + 1, newline + 1), start + 1)
    return None if body_end < 0 else text[newline + 1:body_end]



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
    body = strip_fence(source.strip("\n"))
    if body is not None:
        source = body
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


class OutOfWall(Exception):
    """The tool's harness work was stopped at ToolContext.deadline; `seconds` it ran."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"stopped after {seconds:.1f} s: the wall budget ran out")
        self.seconds = seconds


@contextmanager
def within_deadline(ctx: ToolContext) -> Iterator[None]:
    """The block's harness work, ended at ctx.deadline (harness.cancel.deadline: its processes killed, its
    folders removed, as after Ctrl-C); going over raises OutOfWall. A Ctrl-C stays Cancelled."""
    started = time.perf_counter()
    try:
        with cancel.deadline(ctx.deadline):
            yield
    except cancel.DeadlinePassed as stop:
        raise OutOfWall(time.perf_counter() - started) from stop


def out_of_wall(name: str, ctx: ToolContext, candidate: Path | None, stop: OutOfWall, *,
                holds_devices: bool = True) -> ToolOutcome:
    """The answer of a tool whose harness work the wall budget stopped (within_deadline). `holds_devices`:
    the work held the ranks' devices while it ran (GPU seconds charged as for a finished evaluation)."""
    text = (f"{name}: stopped after {stop.seconds:.1f} s: the sample's wall budget ran out. The evaluation was "
            "cancelled (nothing of it is left running) and has no verdict; the sample ends here and its last "
            "candidate is scored.")
    data = {"tool": name, "verdict": None, "stopped": "max_wall", "seconds": round(stop.seconds, 4)}
    gpu_s = ctx.gpu_seconds(stop.seconds) if holds_devices else 0.0
    return ToolOutcome(name, bounded(ctx, [text]), data, gpu_s, candidate)


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
