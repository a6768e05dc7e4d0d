"""A sweep's run cells as the runs `pkb report` compares: one per model, every condition and seed pooled.

Each model's cells (one condition and one seed each) become one run whose arms are the conditions, each
pooling its seeds: a problem's samples of seed s are numbered after those of the seeds before it, so pass@k
is over samples x seeds per problem, and the report's k defaults to that. The pooled run's id is the model's
label; its config and manifest are its cells' (which must agree on everything but the condition and the
seed: a sweep resumed on other code, say, is refused unless forced), with `seed` the list of the seeds.
Search cells are not pooled (each has its own report: `pkb report runs/<sweep>/cells/<id>`). The pooled run
asks for every seed and condition the sweep's matrix names for the model, started or not: a cell not run yet
leaves its problems not judged (the report calls the arm incomplete), never a smaller denominator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import manifest
from agent.report.run_reader import Run, RunFormatError, read_run
from agent.rundir import is_run_dir
from agent.sweep.layout import SweepDir, SweepLayoutError, is_sweep_dir


class SweepReportError(ValueError):
    """A sweep that cannot be reported as asked; one line."""


def is_sweep(path: Path) -> bool:
    return is_sweep_dir(path)


def _agree(label: str, runs: list[Run], force: bool) -> None:
    views = []
    for run in runs:
        view = manifest.comparable(run.header())
        view.pop("seed", None)
        views.append(view)
    _, differ = manifest.common(views)
    if differ and not force:
        raise SweepReportError(f"the cells of model {label} differ in {', '.join(differ[:6])} (besides condition and "
                               "seed): were they run on other code or settings? add --force to pool them anyway")


def pool(label: str, runs: list[Run], path: Path, *, force: bool = False, planned: Planned | None = None) -> Run:
    """One run of `runs` (the cells of one model), samples renumbered by seed (see the module doc). `planned`:
    the seeds and conditions the sweep asks of this model, so that a cell not started yet counts as asked (the
    report then calls the arm incomplete) instead of shrinking the denominator."""
    _agree(label, runs, force)
    seeds = sorted({int(r.config.get("seed") or 0) for r in runs} | set(planned.seeds if planned else ()))
    per_seed = max((r.samples_per_problem or 1) for r in runs)
    conditions: list[str] = list(planned.conditions) if planned else []
    samples = []
    for run in runs:
        conditions += [c for c in run.config.get("conditions", []) if c not in conditions]
        offset = seeds.index(int(run.config.get("seed") or 0)) * per_seed
        for s in run.samples:
            samples.append(s.model_copy(update={"record": s.record.model_copy(update={"sample": s.record.sample
                                                                                     + offset})}))
    first = runs[0]
    config: dict[str, Any] = {**first.config, "conditions": conditions, "samples": per_seed * len(seeds),
                              "seed": seeds}
    return Run(path=str(path / label), schema_id=first.schema_id, run_id=label, created_at=first.created_at,
               config=config, versions=first.versions, prompt_hashes=first.prompt_hashes, topology=first.topology,
               environment=first.environment, manifest=first.manifest,
               samples=sorted(samples, key=lambda s: (s.record.problem, s.record.condition, s.record.sample)))


@dataclass(frozen=True)
class Planned:
    """What the sweep's matrix (sweep.json) asks of one model's run cells."""

    seeds: tuple[int, ...]
    conditions: tuple[str, ...]


def planned_cells(path: Path) -> dict[str, Planned]:
    """Per model label, the seeds and conditions of its run cells in sweep.json, started or not."""
    seeds: dict[str, list[int]] = {}
    conditions: dict[str, list[str]] = {}
    for cell in SweepDir(path).read_header()["cells"]:
        if not isinstance(cell, dict) or cell.get("kind") != "run":
            continue
        model = str(cell.get("model"))
        seeds.setdefault(model, []).append(int(cell.get("seed") or 0))
        conditions.setdefault(model, []).append(str(cell.get("condition")))
    return {m: Planned(tuple(sorted(set(seeds[m]))), tuple(dict.fromkeys(conditions[m]))) for m in seeds}


def cell_runs(path: Path) -> dict[str, list[Run]]:
    """The run cells of the sweep at `path` that have started, by model label, in the sweep's order."""
    directory = SweepDir(path)
    try:
        header = directory.read_header()
    except SweepLayoutError as err:
        raise SweepReportError(str(err)) from None
    out: dict[str, list[Run]] = {}
    for cell in header["cells"]:
        if not isinstance(cell, dict) or cell.get("kind") != "run":
            continue
        folder = directory.cell(str(cell.get("id")))
        if not is_run_dir(folder):
            continue
        try:
            out.setdefault(str(cell.get("model")), []).append(read_run(folder))
        except RunFormatError as err:
            raise SweepReportError(str(err)) from None
    return out


def pooled_runs(path: Path, *, force: bool = False) -> list[Run]:
    """One pooled run per model of the sweep (module doc); refuses a sweep with no started run cell."""
    by_model = cell_runs(path)
    planned = planned_cells(path)
    runs = [run for label, cells in by_model.items() if cells
            for run in [pool(label, cells, path, force=force, planned=planned.get(label))] if run.samples]
    if not runs:
        searches = [c for c in SweepDir(path).read_header()["cells"] if isinstance(c, dict)
                    and c.get("kind") == "search"]
        if searches:
            raise SweepReportError(f"sweep {path} has no run cell with samples; its searches have a report each: "
                                   f"pkb report {path / 'cells' / str(searches[0].get('id'))} (and the others)")
        raise SweepReportError(f"sweep {path} has no run cell with samples yet (run it: pkb sweep "
                               f"{path / 'sweep.toml'})")
    return runs
