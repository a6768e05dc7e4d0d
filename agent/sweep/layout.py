"""The folder of one sweep, and what it records besides its cells.

    runs/<name>/
      sweep.json        the matrix: schema pkb-sweep/1, the file's path and sha256, the cells (id, kind, model,
                        condition or proposer, seed), the problems; rewritten each time the sweep runs, so it
                        lists the cells of the file as last run (a cell the file no longer names keeps its
                        folder, and leaves the report)
      sweep.toml        the sweep file as last run
      state.json        cells done: {"done": {cell id: {"finished_at", "samples", "correct" | "outcome"}}}
      cells/<id>/       each cell: a `pkb run` run (docs/run-layout.md, agent.rundir.RunLayout) or a `pkb search`
                        (docs/search.md, agent.search.layout.SearchDir)

Every file is written atomically (agent.rundir). A cell is entered in state.json once it has ended complete
(every sample finished; a search stopped by its budgets or stop rules); a sweep run again skips those and
resumes the others where their own files say they are.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent.rundir import read_json, write_json_atomic, write_text_atomic
from agent.sweep.spec import SWEEP_SCHEMA, Cell, Sweep


class SweepLayoutError(ValueError):
    """A sweep folder that is not one, or one of another schema; one line."""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class SweepDir:
    path: Path

    @property
    def header(self) -> Path:
        return self.path / "sweep.json"

    @property
    def copy(self) -> Path:
        return self.path / "sweep.toml"

    @property
    def state(self) -> Path:
        return self.path / "state.json"

    @property
    def cells(self) -> Path:
        return self.path / "cells"

    def cell(self, cell_id: str) -> Path:
        return self.cells / cell_id

    def read_header(self) -> dict[str, Any]:
        data = read_json(self.header)
        if not isinstance(data, dict) or data.get("schema") != SWEEP_SCHEMA or not isinstance(data.get("cells"), list):
            raise SweepLayoutError(f"{self.header} is not a {SWEEP_SCHEMA} sweep header")
        return data

    def done(self) -> dict[str, dict[str, Any]]:
        data = read_json(self.state)
        done = data.get("done") if isinstance(data, dict) else None
        return dict(done) if isinstance(done, dict) else {}

    def mark_done(self, cell: Cell, **facts: Any) -> None:
        done = self.done()
        done[cell.id] = {"finished_at": now(), **facts}
        write_json_atomic(self.state, {"done": done})


def is_sweep_dir(path: Path) -> bool:
    return (path / "sweep.json").is_file()


def write_header(directory: SweepDir, sweep: Sweep, problems: list[str]) -> list[str]:
    """sweep.json and sweep.toml for this sweep file; returns the cells the folder did not have before."""
    before: list[str] = []
    created = now()
    if directory.header.exists():
        old = directory.read_header()
        before = [str(c.get("id")) for c in old["cells"] if isinstance(c, dict)]
        created = str(old.get("created_at") or created)
    cells = sweep.cells()
    known = set(before)
    write_json_atomic(directory.header, {
        "schema": SWEEP_SCHEMA, "name": sweep.name, "file": str(sweep.path),
        "file_sha256": hashlib.sha256(sweep.text.encode()).hexdigest(), "created_at": created, "updated_at": now(),
        "models": sweep.labels, "conditions": [c.name for c in sweep.conditions],
        "proposers": [c.name for c in sweep.proposers], "seeds": sweep.spec.seeds, "samples": sweep.spec.samples,
        "problems": problems, "cells": [asdict(c) for c in cells],
    })
    write_text_atomic(directory.copy, sweep.text)
    return [c.id for c in cells if c.id not in known]
