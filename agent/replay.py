"""`replay:DIR`: score existing solution files instead of asking a model.

Two layouts are read:
- ours: DIR/<problem>.py, or DIR/<problem>/<anything>.py for several solutions of one problem (a problem
  may have both; files sort by path);
- PKB's: DIR/<id>_<name>_<backend>.py, for problems loaded from a PKB checkout (`--source pkb:PATH`),
  matched through harness.pkb_compat.

Each file of a problem is one sample, in path order. A `.py` file or folder in DIR that names no problem
of the source is refused (a typo would otherwise score as a missing solution). A selected problem with no
file at all gets one `no_code` sample, as PKB counts a missing solution; with no --problems selection,
only the problems the directory solves are run.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.problem import Problem

OURS = "pkb-agent"
PKB = "pkb"


class ReplayError(ValueError):
    """A replay directory that cannot be used; the message is one line."""


@dataclass(frozen=True)
class ReplaySet:
    directory: Path
    layout: str  # OURS or PKB
    files: dict[str, list[Path]]  # problem name -> its solution files, in sample order

    def solutions(self, problem: str) -> list[Path]:
        return self.files.get(problem, [])

    @property
    def problems(self) -> list[str]:
        return [name for name, paths in self.files.items() if paths]


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


def _our_layout(root: Path, problems: Sequence[Problem]) -> ReplaySet:
    names = {p.name for p in problems}
    files: dict[str, list[Path]] = {}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((".", "_")):
            continue  # hidden files, __pycache__, helpers such as _common.py
        if entry.is_file() and entry.suffix == ".py":
            name, found = entry.stem, [entry]
        elif entry.is_dir():
            name, found = entry.name, sorted(p for p in entry.rglob("*.py") if not p.name.startswith((".", "_")))
            if not found:
                continue  # a folder of notes or data, not solutions
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
    from harness import pkb_compat  # only PKB sources need the adapter

    try:
        found = pkb_compat.solutions_for(root)
    except pkb_compat.PkbError as err:
        raise ReplayError(str(err)) from None
    files = {p.name: pkb_compat.solutions_of(p, found) for p in problems}
    files = {name: paths for name, paths in files.items() if paths}
    if not files:
        ids = ", ".join(str(i) for i in sorted(found))
        raise ReplayError(f"replay directory {root}: its PKB solutions (problem ids {ids}) match no problem "
                          "of the checkout")
    return ReplaySet(root, PKB, files)
