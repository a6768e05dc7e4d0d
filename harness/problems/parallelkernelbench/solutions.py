"""ParallelKernelBench solution sets: which reference of a checkout each file of a set solves, and why we think so.

A solution set is a folder of `<id>_<name>_<backend>.py` files. Sets recorded against one commit of
ParallelKernelBench do not always follow the numbering of another: the first public commit's sets number
files from 34 up one ahead of the references, and a few names changed (renames.json, beside this file). So the
number alone never decides. Each file is matched, in this order:

1. `matched`: its `<id>_<name>` is a reference's stem, or its `<name>` is exactly one reference's name under
   another id (renumbered); a name under another id must also have the reference's signature.
2. `matched by rename`: its stem is a known old name (renames.json) of a reference, with its signature.
3. `matched by signature`: no name fits, and exactly one reference no other file of the set claimed has a
   `solution` with the same parameter names (where several do, the one with the file's own id, if any).
4. otherwise `unmatched: <reason>`.

Signatures are read from the source with `ast`, never by importing the file: a candidate is hostile code
and this runs in the harness's own process. Every file of the folder gets a Match, so nothing is dropped
without a word. Standard library only (besides harness.problems.problem's Problem type and the checkout's names).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.common.hostile_files import HostileFile, read_given
from harness.problems.parallelkernelbench.checkout import CheckoutError, list_problems, problem_id
from harness.problems.problem import Problem

MATCHED = "matched"
BY_RENAME = "matched by rename"
BY_SIGNATURE = "matched by signature"
UNMATCHED = "unmatched"

RENAMES_FILE = Path(__file__).with_name("renames.json")
BACKENDS = ("cuda", "triton", "parallelkittens")
SOLUTION_RE = re.compile(r"^(\d+)_([A-Za-z0-9_]+)_(cuda|triton|parallelkittens)\.py$")
# solutions_<backend>_<precision>_<hardware>_<provider>_<model>; the hardware may carry a GPU count
# (the recorded sets say h100_8).
SOLUTION_SET_RE = re.compile(r"^solutions_(cuda|triton|parallelkittens)_([^_]+)_([^_]+?(?:_\d+)?)_([^_]+)_(.+)$")
REFERENCE_STEM_RE = re.compile(r"^(\d+)_([A-Za-z0-9_]+)$")


class NoSolutions(CheckoutError):
    """A folder that holds no solution file."""


@dataclass(frozen=True)
class Signature:
    """The positional parameters of a `solution` (names in order) and whether it takes *args."""

    params: tuple[str, ...]
    varargs: bool = False

    def __str__(self) -> str:
        return f"solution({', '.join([*self.params, *(['*args'] if self.varargs else [])])})"


@dataclass(frozen=True)
class Match:
    """How one file of a solution set was paired with a reference (or why it was not)."""

    file: str  # the file's name inside the set
    status: str  # MATCHED, BY_RENAME, BY_SIGNATURE or UNMATCHED
    problem: str | None  # the reference's stem (the Problem's name), None when unmatched
    reason: str  # how it was matched, or why not; one line
    signature: str  # "same", "differs: ...", or "unknown: ..." (compared with the reference it names)

    @property
    def matched(self) -> bool:
        return self.problem is not None

    def line(self) -> str:
        """One line for a person: `file -> problem (how)` or `file: unmatched: reason`."""
        if self.problem is None:
            return f"{self.file}: {UNMATCHED}: {self.reason}"
        return f"{self.file} -> {self.problem} ({self.status}: {self.reason})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def solution_signature(path: Path) -> Signature | str:
    """The signature of the top-level `def solution` of a file, read with ast; a reason string when
    there is none to read (syntax error, empty file, `solution` not a plain function)."""
    try:  # a plain file of its folder, opened without blocking, bounded (never a FIFO or a link out)
        text = read_given(path, inside=path.parent).decode(errors="replace")
    except HostileFile as err:
        return f"refused: {err}"
    if not text.strip():
        return "the file is empty"
    try:
        tree = ast.parse(text)
    except SyntaxError as err:
        return f"syntax error at line {err.lineno}"
    found: Signature | str = "defines no top-level solution()"
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "solution":
            args = node.args
            found = Signature(tuple(a.arg for a in [*args.posonlyargs, *args.args]), args.vararg is not None)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and t.id == "solution"
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            found = "solution is assigned, not defined with def"
    return found


def compare_signatures(candidate: Signature | str, reference: Signature | str) -> str:
    """'same', 'differs: ...' or 'unknown: ...' (one line)."""
    if isinstance(reference, str):
        return f"unknown: the reference's {reference}"
    if isinstance(candidate, str):
        return f"unknown: {candidate}"
    if candidate == reference:
        return "same"
    if len(candidate.params) == len(reference.params) and candidate.varargs == reference.varargs:
        return f"differs: {candidate} has the parameter count of {reference} but other names"
    return f"differs: {candidate}, the reference has {reference}"


@lru_cache(maxsize=4)
def _renames(path: Path = RENAMES_FILE) -> dict[str, str]:
    data = json.loads(path.read_text())
    return {entry["old"]: entry["new"] for entry in data["renames"]}


def known_renames() -> dict[str, str]:
    """Old solution stem -> reference stem, from renames.json."""
    return dict(_renames())


@dataclass
class _Ref:
    problem: Problem
    pid: int
    words: str
    signature: Signature | str


def _refs(problems: Sequence[Problem]) -> list[_Ref]:
    refs = []
    for p in problems:
        m = REFERENCE_STEM_RE.match(p.name)
        if m is None or p.origin != "pkb":
            continue
        refs.append(_Ref(p, int(m.group(1)), m.group(2), solution_signature(p.path)))
    return refs


def _set_files(directory: Path) -> list[Path]:
    """Every file of the set a person might think is a solution (hidden files and caches left out)."""
    return sorted(p for p in directory.iterdir()
                  if p.is_file() and not p.name.startswith((".", "_")) and p.suffix not in (".pyc", ".pyo"))


def match_files(problems: Sequence[Problem], directory: str | Path) -> list[Match]:
    """One Match per file of `directory`, in file-name order, against the references in `problems`."""
    root = Path(directory)
    refs = _refs(problems)
    by_stem = {r.problem.name: r for r in refs}
    by_words: dict[str, list[_Ref]] = {}
    for r in refs:
        by_words.setdefault(r.words, []).append(r)
    renames = _renames()

    decided: dict[str, Match] = {}
    pending: dict[str, tuple[int, str, Signature | str, str]] = {}  # file -> (id, words, signature, why not by name)
    for path in _set_files(root):
        m = SOLUTION_RE.match(path.name)
        if path.suffix != ".py":
            decided[path.name] = Match(path.name, UNMATCHED, None, "not a Python file", "unknown: not a solution")
            continue
        if m is None:
            decided[path.name] = Match(path.name, UNMATCHED, None,
                                       "its name is not <id>_<name>_<backend>.py (backend cuda, triton or "
                                       "parallelkittens)", "unknown: not read")
            continue
        pid, words = int(m.group(1)), m.group(2)
        stem = f"{pid}_{words}"
        sig = solution_signature(path)
        found, why_not = _by_name(path.name, stem, pid, words, sig, by_stem, by_words, renames)
        if found is not None:
            decided[path.name] = found
        else:
            pending[path.name] = (pid, words, sig, why_not)

    claimed = {m.problem for m in decided.values() if m.problem is not None}
    for name, (pid, words, sig, why_not) in sorted(pending.items()):
        unclaimed = [r for r in refs if r.problem.name not in claimed]
        match = decided[name] = _by_signature(name, pid, words, sig, why_not, unclaimed)
        if match.problem is not None:
            claimed.add(match.problem)
    return [decided[k] for k in sorted(decided, key=_natural)]


def _natural(name: str) -> list[Any]:
    """'2_x' before '12_x': digit runs compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _by_name(file: str, stem: str, pid: int, words: str, sig: Signature | str, by_stem: dict[str, _Ref],
             by_words: dict[str, list[_Ref]], renames: dict[str, str]) -> tuple[Match | None, str]:
    """A match by stem, rename or renumbered name; else None and why not (one clause)."""
    exact = by_stem.get(stem)
    if exact is not None:  # the stem is the reference's own: the name decides, a differing signature is noted
        return Match(file, MATCHED, exact.problem.name, "same stem as the reference",
                     compare_signatures(sig, exact.signature)), ""
    notes = []
    new = renames.get(stem)
    if new is not None:
        target = by_stem.get(new)
        if target is None:
            m = REFERENCE_STEM_RE.match(new)
            alike = by_words.get(m.group(2), []) if m else []
            target = alike[0] if len(alike) == 1 else None
        if target is None:
            notes.append(f"its known new name {new} is not in this checkout")
        else:
            verdict = compare_signatures(sig, target.signature)
            if not verdict.startswith("differs"):
                return Match(file, BY_RENAME, target.problem.name, f"{stem} was renamed {new} (renames.json)",
                             verdict), ""
            notes.append(f"renamed {new}, but {verdict.removeprefix('differs: ')}")
    named = by_words.get(words, [])
    fitting = [r for r in named if not compare_signatures(sig, r.signature).startswith("differs")]
    if len(fitting) == 1:
        r = fitting[0]
        return Match(file, MATCHED, r.problem.name, f"same name, renumbered (file id {pid}, reference id {r.pid})",
                     compare_signatures(sig, r.signature)), ""
    if len(fitting) > 1:
        notes.append(f"its name fits {len(fitting)} references ({', '.join(r.problem.name for r in fitting)})")
    for r in named:
        if r not in fitting:
            notes.append(f"its name is that of {r.problem.name}, but {compare_signatures(sig, r.signature)}")
    if not named and new is None:
        notes.append(f"no reference is named {words} and no rename of {stem} is known")
    return None, "; ".join(notes)


def _by_signature(file: str, pid: int, words: str, sig: Signature | str, why_not: str,
                  unclaimed: list[_Ref]) -> Match:
    if isinstance(sig, str):
        return Match(file, UNMATCHED, None, f"{why_not}; and its signature cannot be read ({sig})", f"unknown: {sig}")
    same = [r for r in unclaimed if r.signature == sig]
    if len(same) > 1:
        same_id = [r for r in same if r.pid == pid]
        if len(same_id) == 1:
            r = same_id[0]
            return Match(file, BY_SIGNATURE, r.problem.name,
                         f"{why_not}; {sig} fits {len(same)} unclaimed references, one with the file's id", "same")
        return Match(file, UNMATCHED, None,
                     f"{why_not}; {sig} fits {len(same)} unclaimed references "
                     f"({', '.join(r.problem.name for r in same)}): ambiguous", "unknown: ambiguous")
    if len(same) == 1:
        r = same[0]
        return Match(file, BY_SIGNATURE, r.problem.name,
                     f"{why_not}; the only unclaimed reference with {sig}", "same")
    return Match(file, UNMATCHED, None, f"{why_not}; and no unclaimed reference takes {sig}", "unknown: no reference")


def match_solution_set(checkout: str | Path | Sequence[Problem], directory: str | Path) -> list[Match]:
    """Match every file of a solution set against a checkout's references (a path, or its problems)."""
    if isinstance(checkout, (str, Path)):
        problems: Sequence[Problem] = list_problems(checkout)
    else:
        problems = checkout
    return match_files(problems, directory)


def tally(matches: Sequence[Match]) -> dict[str, int]:
    """How many files of a set were matched each way."""
    counts = {MATCHED: 0, BY_RENAME: 0, BY_SIGNATURE: 0, UNMATCHED: 0}
    for m in matches:
        counts[m.status] += 1
    return counts


# -- solution files by name alone ------------------------------------------------------------------
def solutions_for(directory: str | Path) -> dict[int, list[Path]]:
    """Solution files <id>_<name>_<backend>.py of a directory, by problem id (sorted paths)."""
    d = Path(directory)
    if not d.is_dir():
        raise NoSolutions(f"{d}: no such solutions directory")
    found: dict[int, list[Path]] = {}
    for path in sorted(d.iterdir()):
        m = SOLUTION_RE.match(path.name)
        if m and path.is_file():
            found.setdefault(int(m.group(1)), []).append(path)
    if not found:
        raise NoSolutions(f"{d} holds no PKB solution file (<id>_<name>_<backend>.py with backend "
                          f"{', '.join(BACKENDS)})")
    return found


def solutions_of(problem: Problem, found: dict[int, list[Path]]) -> list[Path]:
    """The files of `found` (from solutions_for) named <id>_<name>_<backend>.py with the reference's own
    stem. The id alone never pairs a file with a problem (recorded sets use older numberings); to pair a
    whole set by name, known renames and signature, with a reason for every file, use
    match_solution_set."""
    pid = problem_id(problem)
    if pid is None:
        return []
    return [p for p in found.get(pid, []) if SOLUTION_RE.match(p.name) and p.name.rsplit("_", 1)[0] == problem.name]


def solution_set_info(directory: str | Path) -> dict[str, str] | None:
    """Backend, precision, hardware, provider and model from a set named solutions_<b>_<p>_<h>_<prov>_<model>."""
    m = SOLUTION_SET_RE.match(Path(directory).name)
    if m is None:
        return None
    return dict(zip(("backend", "precision", "hardware", "provider", "model"), m.groups()))
