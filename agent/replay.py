"""`replay:DIR`: score existing solution files instead of asking a model.

Two layouts are read:
- ours: DIR/<problem>.py, or DIR/<problem>/<anything>.py for several solutions of one problem (a problem
  may have both; files sort by path);
- PKB's: DIR/<id>_<name>_<backend>.py, for problems loaded from a PKB checkout (`--source pkb:PATH`),
  matched by name first (harness.problems.parallelkernelbench.solutions: stem, known renames, renumbered names, then
  signature;
  never by the number alone). Every file of the folder is accounted for in `ReplaySet.matches`, matched
  or not, with the reason; `pkb run` prints the unmatched ones and saves them all in the run folder.

Each file of a problem is one sample, in path order. Every `.py` file is checked before the run
starts: a FIFO, a device or a link out of DIR is refused with its name (as a candidate's artifact is). A
`.py` file or folder in DIR that names no problem of the source is refused (a typo would otherwise score as
a missing solution). A selected problem with no
file at all gets one `no_code` sample, as PKB counts a missing solution; with no --problems selection,
only the problems the directory solves are run.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.common import hostile_files
from harness.problems.parallelkernelbench import checkout, solutions
from harness.problems.parallelkernelbench.solutions import Match, tally
from harness.problems.problem import Problem

OURS = "pkb-agent"
PKB = "pkb"


class ReplayError(ValueError):
    """A replay directory that cannot be used; the message is one line."""


@dataclass(frozen=True)
class ReplaySet:
    directory: Path
    layout: str  # OURS or PKB
    files: dict[str, list[Path]]  # problem name -> its solution files, in sample order
    matches: tuple[Match, ...] = field(default=())  # PKB layout: how each file of the folder was paired

    def solutions(self, problem: str) -> list[Path]:
        return self.files.get(problem, [])

    @property
    def problems(self) -> list[str]:
        return [name for name, paths in self.files.items() if paths]

    @property
    def unmatched(self) -> list[Match]:
        return [m for m in self.matches if not m.matched]

    def matches_record(self) -> dict[str, object]:
        """What replay_matches.json holds (docs/run-layout.md)."""
        return {"directory": str(self.directory), "layout": self.layout, "counts": tally(self.matches),
                "files": [m.as_dict() for m in self.matches]}


def load_replay(directory: str | Path, problems: Sequence[Problem]) -> ReplaySet:
    """The solution files of `directory` for `problems` (every problem of the source, for name checks)."""
    root = Path(directory).expanduser()
    if not root.exists():
        raise ReplayError(f"replay directory {root} does not exist")
    if not root.is_dir():
        raise ReplayError(f"replay:{root} must be a directory of solution files, not a file")
    if problems and all(p.origin == PKB for p in problems):
        return _pkb_layout(root, problems)
    return _our_layout(root, problems)


def _plain_solution(root: Path, path: Path) -> Path:
    """`path`, once it is known to be a regular file of the folder (not a FIFO, device or link out of it)
    within the size a source may have: the run reads it later, and a FIFO there once made `pkb run` wait
    forever."""
    try:
        hostile_files.check_given(path, inside=root)
    except hostile_files.HostileFile as err:
        raise ReplayError(f"replay directory {root}: {err}") from None
    return path


def _solutions_below(root: Path, folder: Path) -> list[Path]:
    """The .py files under `folder` (not hidden), each checked; links to folders are not followed."""
    if not os.path.realpath(folder).startswith(os.path.realpath(root).rstrip(os.sep) + os.sep):
        raise ReplayError(f"replay directory {root}: {folder.name} is a link out of the folder: refused")
    found: list[Path] = []
    for parent, dirs, names in os.walk(folder):
        dirs.sort()
        found.extend(Path(parent) / n for n in names if n.endswith(".py") and not n.startswith((".", "_")))
    return sorted(_plain_solution(root, p) for p in found)


def _our_layout(root: Path, problems: Sequence[Problem]) -> ReplaySet:
    names = {p.name for p in problems}
    files: dict[str, list[Path]] = {}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((".", "_")):
            continue  # hidden files, __pycache__, helpers such as _common.py
        if entry.is_dir():
            name, found = entry.name, _solutions_below(root, entry)
            if not found:
                continue  # a folder of notes or data, not solutions
        elif entry.suffix == ".py":
            name, found = entry.stem, [_plain_solution(root, entry)]
        else:
            continue
        if name not in names:
            close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ReplayError(f"replay directory {root}: {entry.name} names no problem{hint} "
                              "(expected <problem>.py or <problem>/<file>.py)")
        files.setdefault(name, []).extend(found)
    if not files:
        raise ReplayError(f"replay directory {root} holds no solution file (expected <problem>.py or "
                          "<problem>/<file>.py, e.g. all_reduce.py)")
    return ReplaySet(root, OURS, {k: sorted(v) for k, v in files.items()})


def _pkb_layout(root: Path, problems: Sequence[Problem]) -> ReplaySet:
    for entry in sorted(root.iterdir()):
        if entry.suffix == ".py" and not entry.name.startswith((".", "_")) and not entry.is_dir():
            _plain_solution(root, entry)
    try:
        solutions.solutions_for(root)  # says clearly when the folder holds no PKB solution file at all
    except checkout.CheckoutError as err:
        raise ReplayError(str(err)) from None
    matches = solutions.match_files(problems, root)
    files: dict[str, list[Path]] = {}
    for m in matches:
        if m.problem is not None:
            files.setdefault(m.problem, []).append(root / m.file)
    if not files:
        reasons = "; ".join(m.line() for m in matches[:3])
        raise ReplayError(f"replay directory {root}: none of its {len(matches)} files matches a problem of the "
                          f"checkout ({reasons})")
    order = {p.name: i for i, p in enumerate(problems)}
    files = {name: sorted(files[name]) for name in sorted(files, key=lambda n: order.get(n, len(order)))}
    return ReplaySet(root, PKB, files, tuple(matches))
