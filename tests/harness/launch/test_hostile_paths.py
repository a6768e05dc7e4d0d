"""Every path the trusted side reads or writes in a candidate's scratch, with a symbolic link, a FIFO and a
2 GiB sparse file planted there at the worst moment: nothing outside the scratch changes, the evaluation
ends within its limits, and the candidate is charged wherever the plant reached the harness.

The paths are not listed by hand. An honest evaluation runs first with two recorders: the hook of
harness.common.hostile_files (every access through a held-open scratch) and a Python audit hook (every open,
mkdir, remove, rename and copy by an absolute path in this process), which must see no access to a
scratch that bypassed harness.common.hostile_files. The hook's record, its indices folded into patterns
(`calls/c{i}-r{r}-out.bin`), is the list. Then one evaluation per (path, plant): the same hook plants the
object at the path just before the harness touches it, as a candidate racing the harness would at best.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from harness.common import hostile_files
from harness.config import EvalConfig, Limits, TimingConfig
from harness.evaluate import EXCHANGE_DIRS, evaluate
from harness.launch.pool import SCRATCH_DIRS
from harness.problems.registry import get, load_suite
from harness.records.results import EvalResult
from tests.conftest import CANDIDATES, TESTS, failure_of, live_children

HONEST = CANDIDATES / "correct_all_gather_sum.py"
EXPLOITS = TESTS / "exploits"
# Candidates whose replies lead the judge down its other reading paths: an output that changed after the
# call returned (its later value is read), the previous call's output filled in during the next one.
REACH = [HONEST, EXPLOITS / "lazy_thread.py", EXPLOITS / "lazy_next_call.py"]
SCRATCH = re.compile(r"/pkb-pool-[^/]+/scratch(/.*)?$")
FOLDS = [(re.compile(r"c\d+-r\d+"), "c{i}-r{r}"), (re.compile(r"kept-\d+-r\d+"), "kept-{n}-r{r}"),
         (re.compile(r"(set|fresh)\d+-r\d+"), r"\1{i}-r{r}")]
PLANTS = ("symlink", "fifo", "sparse")
# The scratch's folders the pool makes before it starts a rank (harness.launch.pool, harness.evaluate): no candidate
# code exists yet to plant anything in their place; later make_dir calls find the harness's own folder.
MADE_AT_LAUNCH = {*SCRATCH_DIRS, *EXCHANGE_DIRS}
LIMITS = Limits(check_s=60, time_s=90, load_s=60, start_s=60, grace_s=2)
EVAL_LIMIT_S = 600.0  # the whole evaluation, limits above and the reference's work included, with room
_audit: dict[str, Any] = {"on": False, "bypass": [], "installed": False}


def _config(skip_timing: bool = False) -> EvalConfig:
    return EvalConfig(trials=2, timing=TimingConfig(warmup=1, iters=4, host_iters=1), limits=LIMITS,
                      skip_timing=skip_timing)


def pattern(rel: str) -> str:
    for regex, replacement in FOLDS:
        rel = regex.sub(replacement, rel)
    return rel


def _audited(event: str, args: tuple[Any, ...]) -> None:
    """Accesses by absolute path under a scratch that did not go through harness.common.hostile_files."""
    if not _audit["on"] or event not in ("open", "os.mkdir", "os.remove", "os.rename", "shutil.copyfile",
                                         "os.truncate", "os.symlink", "os.link", "os.chmod"):
        return
    for arg in args:
        if isinstance(arg, (str, bytes, os.PathLike)):
            text = os.fsdecode(arg)
            match = SCRATCH.search(text) if text.startswith("/") else None
            # The pool makes its scratch (and tmp/, cache/ in it) and opens it before any rank exists.
            if match and (match.group(1) or "") not in ("", "/tmp", "/cache"):
                _audit["bypass"].append((event, text))



def _bounded(fn: Any, seconds: float = EVAL_LIMIT_S) -> Any:
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(value=fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the evaluation did not end within {seconds:.0f} s"
    return box["value"]


@pytest.fixture(scope="module")
def touched() -> dict[tuple[str, str], Path]:
    """{(operation, pattern): the candidate whose evaluation made that access} over REACH's evaluations."""
    seen: dict[tuple[str, str], Path] = {}
    suite = load_suite()
    if not _audit["installed"]:  # an audit hook stays for the life of the process: installed once, when needed
        sys.addaudithook(_audited)
        _audit["installed"] = True
    for candidate in REACH:
        def note(op: str, folder: Path, rel: str, candidate: Path = candidate) -> None:
            if SCRATCH.search(str(folder)):
                seen.setdefault((op, pattern(rel)), candidate)

        _audit.update(on=True, bypass=[])
        hostile_files.observer = note
        try:
            result = evaluate(get(suite, "all_reduce"), candidate, world_size=2, device="cpu", shape="small",
                              config=_config())
        finally:
            hostile_files.observer = None
            _audit["on"] = False
        assert result.verdict != "infra_error", result.failure
        assert result.correct == (candidate == HONEST), result.failure
        assert _audit["bypass"] == [], \
            f"accesses to a scratch that bypass harness.common.hostile_files: {_audit['bypass']}"
    return seen


@pytest.mark.slow
def test_every_kind_of_access_is_enumerated(touched):
    """The record holds the harness's reads, writes, folders and removals (a guard on the enumeration)."""
    ops = {op for op, _ in touched}
    assert {"read", "write", "mkdir", "unlink", "stat"} <= ops, touched
    assert ("write", "calls/c{i}-r{r}-in.pt") in touched and ("read", "calls/c{i}-r{r}-out.bin") in touched
    # Timed calls draw their inputs in the ranks (harness.rank.refill): the harness writes no input set for a
    # problem whose ranks can draw them, so sets/ is only made; a judged timed call's output is read.
    assert ("read", "kept/kept-{n}-r{r}.bin") in touched and ("mkdir", "sets") in touched
    assert ("read", "calls/c{i}-r{r}-out.bin.later") in touched and ("read", "calls/c{i}-r{r}-prev.bin") in touched


def _plant(kind: str, path: Path, outside: Path) -> None:
    if path.is_symlink() or path.exists():
        if path.is_dir() and not path.is_symlink():
            return  # a real folder of the harness's already: nothing to plant in its place
        path.unlink()
    if kind == "symlink":
        os.symlink(outside / "victim" if path.suffix == "" else outside / "victim" / "victim.txt", path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        with open(path, "wb") as f:
            f.truncate(2 << 30)


def _outside_state(outside: Path) -> list[tuple[str, int, bytes]]:
    return sorted((str(p.relative_to(outside)), p.stat().st_mtime_ns, p.read_bytes()) for p in outside.rglob("*")
                  if p.is_file())


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("kind", PLANTS)
def test_plants_at_every_path_are_refused(kind, touched, tmp_path):
    """Each (operation, path) of the enumeration with this plant: one evaluation each, checked separately.
    Paths under calls/ are touched in the check only, so those evaluations skip timing."""
    outside = tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / "victim.txt").write_text("untouched\n")
    before = _outside_state(outside)
    suite = load_suite()
    failures: list[str] = []
    for (op, pat), candidate in sorted(touched.items()):
        if op == "mkdir" and pat in MADE_AT_LAUNCH:
            continue  # made when the pool starts, before any rank exists: nothing can be there before them
        planted: list[str] = []

        def plant(o: str, folder: Path, r: str, *, op: str = op, pat: str = pat, planted: list[str] = planted) -> None:
            if o == op and pattern(r) == pat and SCRATCH.search(str(folder)):
                _plant(kind, folder / r, outside)
                planted.append(r)

        hostile_files.observer = plant
        try:
            result: EvalResult = _bounded(lambda c=candidate, p=pat: evaluate(
                get(suite, "all_reduce"), c, world_size=2, device="cpu", shape="small",
                config=_config(skip_timing=p.startswith("calls/"))))
        finally:
            hostile_files.observer = None
        label = f"{kind} at {op} {pat}"
        if not planted:
            failures.append(f"{label}: never reached")
            continue
        if _outside_state(outside) != before:
            failures.append(f"{label}: a file outside the scratch changed")
        if result.verdict == "infra_error":
            failures.append(f"{label}: infra_error ({failure_of(result).message if result.failure else ''})")
        # Removing a name never touches what it names: a plant there is harmless. Anywhere else the
        # harness met the planted object, and that is the candidate's failure.
        if op != "unlink" and result.correct:
            failures.append(f"{label}: judged correct")
        print(f"{label}: {result.verdict} ({failure_of(result).message[:120] if result.failure else ''})", flush=True)
        assert live_children() == [], f"{label}: a process was left behind"
    assert failures == [], "\n".join(failures)
