"""The paths of a run directory (RunLayout, docs/run-layout.md) and the atomic, redacted writes every file of it
goes through.

A file is written to a temporary name in its own folder, flushed to disk, then renamed over the target
(harness.common.atomic_write, the project's one atomic writer): a reader (or a resumed run) sees the old file
or the new one, never half of one, whatever moment the writer is killed at. The file gets the mode an
ordinary write would give it (0666 less the umask). The run's schema names are defined here, where runs are written;
agent.report.run_reader reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.common.atomic_write import remove_leftovers, replace_atomically, write_out
from harness.records.redaction import redact_bytes

RUN_SCHEMA = "pkb-run/1"
SAMPLE_SCHEMA = "pkb-sample/1"
RUNNING = "running"
FINISHED = "finished"
ATTEMPTS_DIR = "attempts"  # a sample's earlier judgements, one folder each (docs/run-layout.md)
SAMPLE_FILE = "sample.json"
RESCORED_FILE = "rescored.json"


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Every record, transcript and report of a run goes through here: redacted (harness.records.redaction: no value
    of the harness's secret environment variables is written), then written atomically
    (harness.common.atomic_write, with the mode an ordinary write gives: 0666 less the umask)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, redact_bytes(data))


def write_out_text(path: Path, text: str) -> None:
    """A report or record written where a user's `--out` points: redacted, then by the rule of
    harness.common.atomic_write.write_out (a regular or new file replaced atomically, the null device, stdout or a
    read pipe written through, anything else refused with an OSError that says why)."""
    write_out(path, redact_bytes(text.encode()))


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path) -> Any | None:
    """The JSON in `path`, or None when the file is missing (atomic writes leave no partial file)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class SampleLayout:
    """samples/<problem>/<condition>/<k>/ and the files in it."""

    path: Path

    @property
    def sample_json(self) -> Path:
        return self.path / SAMPLE_FILE

    @property
    def result_json(self) -> Path:
        return self.path / "result.json"

    @property
    def transcript_json(self) -> Path:
        return self.path / "transcript.json"

    @property
    def final_py(self) -> Path:
        return self.path / "final.py"

    @property
    def candidates(self) -> Path:
        return self.path / "candidates"

    @property
    def logs(self) -> Path:
        """Rank logs of the final scoring."""
        return self.path / "logs"

    def remove_leftovers(self) -> list[Path]:
        """The temporaries an earlier attempt at this sample left when killed between a write and its rename (a
        `pkb run` stopped with SIGKILL), removed before the sample runs again."""
        return remove_leftovers(self.path) if self.path.is_dir() else []

    @property
    def rescored_json(self) -> Path:
        """`pkb rescore RUN`: every distinct candidate scored by the final scorer (agent.rescore)."""
        return self.path / RESCORED_FILE

    @property
    def attempts(self) -> Path:
        """Earlier judgements of the sample, attempts/<n>/ each (agent.runner.Runner.rejudge)."""
        return self.path / ATTEMPTS_DIR

    def candidate(self, index: int) -> Path:
        return self.candidates / f"{index:03d}.py"

    def candidate_files(self) -> list[Path]:
        """candidates/NNN.py in name order (a tool's record NNN.json beside each); other files there are not
        candidates."""
        if not self.candidates.is_dir():
            return []
        return sorted(p for p in self.candidates.glob("*.py") if p.stem.isdigit())

    def relative(self, path: Path) -> str:
        # Both resolved: the tools hand back absolute paths whatever folder the run was given as.
        return Path(path).resolve().relative_to(self.path.resolve()).as_posix()

    def record(self) -> dict[str, Any] | None:
        data = read_json(self.sample_json)
        return data if isinstance(data, dict) else None

    def is_finished(self) -> bool:
        record = self.record()
        return record is not None and record.get("status") == FINISHED


@dataclass(frozen=True)
class RunLayout:
    """runs/<run_id>/: the paths of a run folder (docs/run-layout.md), the one place they are spelled. A search's and
    a sweep's folders (agent.search.layout, agent.sweep.layout) name their own files and take the shared ones
    (events.jsonl, rescored.json) from here."""

    path: Path

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def events(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints.sqlite"

    @property
    def replay_matches(self) -> Path:
        """A PKB replay's accounting: how each file of the solution set was paired with a problem, or why not."""
        return self.path / "replay_matches.json"

    @property
    def samples(self) -> Path:
        return self.path / "samples"

    @property
    def rescored(self) -> Path:
        """`pkb rescore RUN` of a search: its re-measurement (agent.search.rescore); a sample run's rescore writes
        SampleLayout.rescored_json in each sample."""
        return self.path / RESCORED_FILE

    def sample(self, problem: str, condition: str, k: int) -> SampleLayout:
        return SampleLayout(self.samples / problem / condition / str(k))

    def sample_dirs(self) -> list[SampleLayout]:
        """Every samples/<problem>/<condition>/<k>/ folder that holds a sample.json, in path order."""
        if not self.samples.is_dir():
            return []
        return [SampleLayout(p.parent) for p in sorted(self.samples.glob(f"*/*/*/{SAMPLE_FILE}"))]


def is_run_dir(path: Path) -> bool:
    """A `pkb run` folder: it has its run.json."""
    return RunLayout(path).run_json.is_file()


# The names the runner and its callers have always used.
RunDir = RunLayout
SampleDir = SampleLayout
