"""The folder of one search (docs/search.md), and its header file.

    runs/<run_id>/
      search.json                   what was asked: config, versions, prompt hashes, environment, manifest
      archive.sqlite                every candidate, decision, stop and rescore (agent.search.archive)
      events.jsonl                  structlog JSON event log
      live.html                     the live view: refreshes itself, readable while the search runs
      rescored.json                 `pkb rescore RUN`: each problem's reported kernel re-measured again
      candidates/<problem>/<slot>.py   every candidate file the model wrote (also kept in the archive)
      logs/<slot>/                  rank logs of each evaluation, with --keep-logs
      episodes/<slot>/              an agent proposer's episode: its candidates, their tool results, transcript.json

search.json is written once, atomically, when the search is created; the archive is the only thing a
running search changes (besides the event log, the live page and the candidate files, which it can
always write again from the archive).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import prompts
from agent import manifest
from agent.rundir import RunLayout, read_json, write_json_atomic, write_text_atomic
from agent.search.config import SEARCH_SCHEMA, SearchConfig
from agent.versions import versions
from harness.problems.problem import Problem
from harness.records.environment import environment


class SearchError(ValueError):
    """A search that cannot start or go on as asked; one line."""


@dataclass(frozen=True)
class SearchDir:
    """A search's folder: its own files, and those every run folder has (events.jsonl, rescored.json), named by
    agent.rundir.RunLayout."""

    path: Path

    @property
    def run(self) -> RunLayout:
        return RunLayout(self.path)

    @property
    def header(self) -> Path:
        return self.path / "search.json"

    @property
    def archive(self) -> Path:
        return self.path / "archive.sqlite"

    @property
    def events(self) -> Path:
        return self.run.events

    @property
    def live_html(self) -> Path:
        return self.path / "live.html"

    def candidate(self, problem: str, slot: int) -> Path:
        return self.path / "candidates" / problem / f"{slot:05d}.py"

    def written(self, problem: str, slot: int, source: str) -> Path:
        """The candidate's file, written again (from the archive's `source`) where it is missing or differs."""
        path = self.candidate(problem, slot)
        if not path.is_file() or path.read_text() != source:
            write_text_atomic(path, source)
        return path

    @property
    def rescored(self) -> Path:
        """`pkb rescore RUN`'s re-measurement of each problem's reported kernel (agent.search.rescore)."""
        return self.run.rescored

    def logs(self, slot: int) -> Path:
        return self.path / "logs" / f"{slot:05d}"

    @property
    def episodes(self) -> Path:
        """An agent proposer's episodes (agent.search.episode): episodes/<slot>/."""
        return self.path / "episodes"

    def relative(self, path: Path) -> str:
        return path.relative_to(self.path).as_posix()


def is_search_dir(path: Path) -> bool:
    return (path / "search.json").is_file()


def header(run_id: str, config: SearchConfig, *, problems: Sequence[Problem] = (),
           executor: str | None = None) -> dict[str, Any]:
    dumped = config.header_config()
    hashes = prompts.hashes()
    env = environment()
    return {"schema": SEARCH_SCHEMA, "run_id": run_id, "config": dumped, "versions": versions(),
            "prompt_hashes": hashes, "environment": env,
            "manifest": manifest.build(dumped, problem_hashes=manifest.problem_hashes(problems), prompt_hashes=hashes,
                                       environment=env, executor=executor)}


def create(directory: SearchDir, config: SearchConfig, *, problems: Sequence[Problem] = (),
           executor: str | None = None) -> dict[str, Any]:
    """search.json for a new search; `problems` and `executor` go into its manifest (agent.manifest)."""
    if directory.header.exists():
        raise SearchError(f"search {directory.path} already exists; add --resume to continue it, or pick another "
                          "--run-id")
    directory.path.mkdir(parents=True, exist_ok=True)
    data = header(directory.path.name, config, problems=problems, executor=executor)
    write_json_atomic(directory.header, data)
    return data


def load_config(directory: SearchDir) -> SearchConfig:
    data = read_json(directory.header)
    if data is None:
        raise SearchError(f"no search to resume at {directory.path} (search.json is missing)")
    if not isinstance(data, dict) or data.get("schema") != SEARCH_SCHEMA or not isinstance(data.get("config"), dict):
        raise SearchError(f"{directory.header} is not a {SEARCH_SCHEMA} header")
    try:
        return SearchConfig.model_validate(data["config"])
    except ValueError as err:
        raise SearchError(f"{directory.header}: its config cannot be read ({str(err).splitlines()[0]})") from None
