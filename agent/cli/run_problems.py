"""Which problems `pkb run` runs, read from its request (agent.cli.run_config.RunRequest): those --problems
selects in the source (a resumed run's own, which --problems given again must select), else those a replayed
directory solves, else all; those without the run's world size are left out, and every one must have its shape."""

from __future__ import annotations

from dataclasses import dataclass

from agent.cli.common import CliError
from agent.cli.run_config import RESUME_MISMATCH, RunRequest
from agent.cli.source import check_shape, resolve_source, select_in
from agent.replay import ReplayError, ReplaySet, load_replay
from harness.problems.problem import Problem


@dataclass(frozen=True)
class Selection:
    problems: list[Problem]
    skipped: list[str]  # selected problems without the run's world size
    replay: ReplaySet | None  # the replayed directory's files, paired with problems


def select_problems(request: RunRequest) -> Selection:
    """The problems to run, the names of selected ones left out (no such world size), and the replay set."""
    config, selection = request.config, request.selection
    source = resolve_source(config.source, config.precision)
    chosen = select_in(source, selection or config.problems) if (selection or config.problems) else None
    if config.problems and chosen is not None and [p.name for p in chosen] != config.problems:  # --problems again
        raise CliError(RESUME_MISMATCH.format(run=request.run_dir.path.name, key="problems", stored=config.problems,
                                              value=[p.name for p in chosen], option="--problems"))
    replay = None
    if request.replay_dir is not None:
        try:
            replay = load_replay(request.replay_dir, source)
        except ReplayError as err:
            raise CliError(str(err)) from None
    if chosen is None:  # all the source's problems, or a replay's: those its files solve
        chosen = [p for p in source if p.name in set(replay.problems)] if replay is not None else list(source)
    usable = [p for p in chosen if p.supports(config.world_size)]
    if not usable:
        raise CliError(f"no selected problem supports world size {config.world_size}")
    for p in usable:
        check_shape(p, config.shape)
    return Selection(usable, [p.name for p in chosen if p not in usable], replay)
