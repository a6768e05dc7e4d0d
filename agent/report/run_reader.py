"""Reading a run directory (docs/run-layout.md) into typed records. Parent side only (pydantic).

A directory that is not a run, or a run written by another schema version, is refused with
RunFormatError: one line naming the directory and what is missing or different.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.rundir import RUN_SCHEMA, SAMPLE_SCHEMA, RunLayout, SampleLayout


class RunFormatError(ValueError):
    """Not a run directory, or one this version cannot read. The message is one line."""


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Usage(_Open):
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


class SampleRecord(_Open):
    """sample.json: one sample's outcome."""

    schema_id: str = Field(SAMPLE_SCHEMA, alias="schema")
    problem: str
    category: str = "other"
    condition: str
    sample: int
    model: str = ""
    status: str
    stop_reason: str | None = None
    verdict: str = "no_code"
    correct: bool = False
    speedup: float | None = None
    flags: list[str] = Field(default_factory=list)
    roofline_fraction: float | None = None
    usage: Usage = Field(default_factory=Usage)
    turns: int = 0
    tool_calls: dict[str, int] = Field(default_factory=dict)
    wall_s: float = 0.0
    gpu_s: float = 0.0
    started_at: str | None = None
    finished_at: str | None = None

    def metrics_view(self) -> dict[str, Any]:
        """The plain mapping agent.report.metrics reads (sample.json's own keys)."""
        return self.model_dump(by_alias=True)


class ToolCall(_Open):
    id: str = ""
    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class Message(_Open):
    """One transcript entry."""

    role: str
    content: Any = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    candidate: str | None = None
    usage: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        """The content as text (providers may store a list of content blocks)."""
        if isinstance(self.content, str):
            return self.content
        if isinstance(self.content, list):
            parts = [b.get("text", "") if isinstance(b, dict) else str(b) for b in self.content]
            return "\n".join(p for p in parts if p)
        return "" if self.content is None else json.dumps(self.content, indent=1, default=str)


class Candidate(BaseModel):
    """candidates/NNN.py with its tool result candidates/NNN.json (when present)."""

    index: int
    path: str  # relative to the sample directory, as transcripts name it
    code: str
    info: dict[str, Any] = Field(default_factory=dict)

    @property
    def verdict(self) -> str | None:
        v = self.info.get("verdict")
        return None if v is None else str(v)


class Sample(BaseModel):
    """Everything under samples/<problem>/<condition>/<k>/."""

    record: SampleRecord
    directory: str
    transcript: list[Message] = Field(default_factory=list)
    candidates: list[Candidate] = Field(default_factory=list)
    final_code: str | None = None
    result: dict[str, Any] | None = None  # result.json (harness.records.results.EvalResult) as stored


class Run(BaseModel):
    """run.json plus its samples."""

    path: str
    schema_id: str
    run_id: str
    created_at: str = ""
    config: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, Any] = Field(default_factory=dict)
    prompt_hashes: dict[str, Any] = Field(default_factory=dict)
    topology: dict[str, Any] | None = None
    environment: dict[str, Any] = Field(default_factory=dict)
    manifest: dict[str, Any] = Field(default_factory=dict)  # agent.manifest (empty: a run from before manifests)
    samples: list[Sample] = Field(default_factory=list)

    @property
    def conditions(self) -> list[str]:
        """Conditions in the order the config lists them, then any others the samples have."""
        listed = [str(c) for c in self.config.get("conditions", [])]
        seen = {s.record.condition for s in self.samples}
        return [c for c in listed if c in seen] + sorted(seen - set(listed))

    @property
    def samples_per_problem(self) -> int | None:
        value = self.config.get("samples")
        return int(value) if isinstance(value, int) and value > 0 else None

    def records(self) -> list[dict[str, Any]]:
        return [s.record.metrics_view() for s in self.samples]

    def header(self) -> dict[str, Any]:
        """The parts of run.json a comparison reads (agent.manifest.comparable)."""
        return {"config": self.config, "manifest": self.manifest, "prompt_hashes": self.prompt_hashes,
                "versions": self.versions}


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise RunFormatError(f"{path}: {what} is not valid JSON ({err.msg} at line {err.lineno})") from None
    except OSError as err:
        raise RunFormatError(f"{path}: cannot read {what} ({err.strerror})") from None


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def read_run_header(path: str | Path) -> dict[str, Any]:
    """run.json of the run at `path`, after checking that it is a run of this schema version."""
    root = Path(path)
    if not root.exists():
        raise RunFormatError(f"{root}: no such directory")
    if not root.is_dir():
        raise RunFormatError(f"{root} is not a run directory (it is a file)")
    run_json = RunLayout(root).run_json
    if not run_json.is_file():
        raise RunFormatError(f"{root} is not a run directory: run.json is missing")
    header = _read_json(run_json, "run.json")
    if not isinstance(header, dict):
        raise RunFormatError(f"{run_json}: expected a JSON object")
    schema = header.get("schema")
    if schema != RUN_SCHEMA:
        raise RunFormatError(f"{root}: run.json has schema {schema!r}; this version of pkb-agent reads {RUN_SCHEMA!r}")
    return header


def read_sample(directory: Path, *, transcripts: bool = True) -> Sample:
    files = SampleLayout(directory)
    raw = _read_json(files.sample_json, files.sample_json.name)
    if not isinstance(raw, dict):
        raise RunFormatError(f"{files.sample_json}: expected a JSON object")
    if raw.get("schema", SAMPLE_SCHEMA) != SAMPLE_SCHEMA:
        raise RunFormatError(f"{files.sample_json}: schema {raw.get('schema')!r}; this version reads "
                             f"{SAMPLE_SCHEMA!r}")
    try:
        record = SampleRecord.model_validate(raw)
    except ValidationError as err:
        raise RunFormatError(f"{files.sample_json}: {_one_line(err)}") from None
    sample = Sample(record=record, directory=str(directory))
    if files.result_json.is_file():
        result = _read_json(files.result_json, files.result_json.name)
        sample.result = result if isinstance(result, dict) else None
    if files.final_py.is_file():
        sample.final_code = files.final_py.read_text(errors="replace")
    if not transcripts:
        return sample
    if files.transcript_json.is_file():
        raw_t = _read_json(files.transcript_json, files.transcript_json.name)
        if not isinstance(raw_t, list):
            raise RunFormatError(f"{files.transcript_json}: expected a list of messages")
        try:
            sample.transcript = [Message.model_validate(m) for m in raw_t]
        except ValidationError as err:
            raise RunFormatError(f"{files.transcript_json}: {_one_line(err)}") from None
    for code_path in files.candidate_files():
        info_path = code_path.with_suffix(".json")
        info = _read_json(info_path, info_path.name) if info_path.is_file() else {}
        sample.candidates.append(Candidate(
            index=int(code_path.stem), path=f"{files.candidates.name}/{code_path.name}",
            code=code_path.read_text(errors="replace"), info=info if isinstance(info, dict) else {},
        ))
    return sample


def read_run(path: str | Path, *, transcripts: bool = True) -> Run:
    """The whole run: run.json and every sample (transcripts and candidates unless told not to)."""
    root = Path(path)
    header = read_run_header(root)
    config = header.get("config")
    if not isinstance(config, dict):
        raise RunFormatError(f"{root / 'run.json'}: 'config' is missing or not an object")
    try:
        run = Run(
            path=str(root.resolve()), schema_id=header["schema"], run_id=str(header.get("run_id") or root.name),
            created_at=str(header.get("created_at") or ""), config=config,
            versions=header.get("versions") or {}, prompt_hashes=header.get("prompt_hashes") or {},
            topology=header.get("topology"), environment=header.get("environment") or {},
            manifest=header.get("manifest") or {},
        )
    except ValidationError as err:
        raise RunFormatError(f"{root / 'run.json'}: {_one_line(err)}") from None
    run.samples = sorted((read_sample(d.path, transcripts=transcripts) for d in RunLayout(root).sample_dirs()),
                         key=lambda s: (s.record.problem, s.record.condition, s.record.sample))
    return run
