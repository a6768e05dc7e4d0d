"""The correctness trials: their schedule, and the judgement of every call from the data ranks hand over.
Judge side: it runs in the harness process, which never imports candidate code.

Schedule: T ordinary trials, stress trials (one rank late: stress trial i delays rank i % W) and the
precision probe, in an order drawn from the evaluation's secret, so no call index marks the trial that
counts. Every call carries a small random delay on every rank, so a stress call looks like any other
from inside a rank.

A call is judged rank by rank against the reference pool's files: structure, shape, dtype and values
within tolerance (harness.common.compare); the output copy taken at return against its later value
(work left running); the inputs after the call against the pristine inputs (bit for bit under this
suite's rule; under PKB's rule, where the reference itself modifies its inputs, against the reference's
inputs after its call, within tolerance); the previous call's output changing during this one. Any
exception while judging is the candidate's failure, never the harness's.

The verdict over all trials: the first failing ordinary trial (in call order) if any; else a failing
stress trial (flag `race`: right in step, wrong with one rank late); else a failing probe (flag
`reduced_precision`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.common import failures, hostile_files, integrity
from harness.common.compare import compare_outputs, matches
from harness.common.integrity import IntegrityConfig
from harness.rank import transport

STRICT = "strict"  # inputs must come back bit-identical
PKB_RULE = "pkb"  # the reference modifies its inputs: they are compared after the call, as PKB leaves them
RULES = {
    STRICT: "inputs must come back bit-identical (this suite's rule)",
    PKB_RULE: "the PKB reference modifies its inputs in place; a candidate's inputs are compared after the "
              "call with the reference's, within tolerance, as PKB leaves them (PKB's rule)",
}


@dataclass(frozen=True)
class Trial:
    id: int  # the input draw: 0..T-1 ordinary, STRESS_TRIAL_BASE + i stress, PROBE_TRIAL the probe
    kind: str  # "normal", "stress" or "probe"
    late_rank: int = -1

    @property
    def label(self) -> str:
        return f"trial {self.id}" + ("" if self.kind == "normal" else f" ({self.kind})")


def schedule(trials: int, checks: IntegrityConfig, world_size: int, rng: random.Random) -> list[Trial]:
    order = [Trial(t, "normal") for t in range(trials)]
    order += [Trial(integrity.STRESS_TRIAL_BASE + i, "stress", i % world_size) for i in range(checks.stress_trials)]
    if checks.precision_probe:
        order.append(Trial(integrity.PROBE_TRIAL, "probe"))
    rng.shuffle(order)
    return order


def delays(trial: Trial, checks: IntegrityConfig, world_size: int, rng: random.Random) -> list[float]:
    """Seconds each rank waits before this call: jitter everywhere, the full delay on a stress trial's
    late rank."""
    out = [rng.uniform(0.0, checks.jitter_s) for _ in range(world_size)]
    if trial.kind == "stress":
        out[trial.late_rank] += checks.stress_delay_s
    return out


@dataclass
class CallResult:
    trial: Trial
    call: int  # position in the call order
    failure: dict[str, Any] | None = None
    flags: set[str] = field(default_factory=set)
    worst_abs: float = 0.0
    worst_rel: float = 0.0


def _failure(verdict: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"verdict": verdict, "message": message[:1500], **extra}


MIN_OUTPUT_LIMIT = 16 << 20  # bytes of an output file the judge reads whatever the expected output's size


def output_limit(expected_bytes: int, world_size: int) -> int:
    """The most bytes the judge reads of a candidate's output file whose reference output file holds
    `expected_bytes`: room for a wrong layout (a whole gathered output on every rank) and its header, never
    a file the candidate inflated (a sparse file of terabytes costs it nothing to make)."""
    return max(MIN_OUTPUT_LIMIT, 2 * max(1, world_size) * expected_bytes + (1 << 20))


def reference_file(path: Path) -> Any:
    """A file the reference pool wrote into the evaluation's private folder (trusted; still read as data)."""
    return transport.read_tree(path, 1 << 40)


class Judge:
    """Judges one evaluation's check calls, call by call; keeps what the next call's judgement needs.
    `files`: the candidate's scratch, held open; every file of a rank is read through it."""

    def __init__(self, atol: float, rtol: float, device: str, ref_dir: Path, files: hostile_files.Folder,
                 world_size: int) -> None:
        self.atol, self.rtol = atol, rtol
        self.device = device
        self.ref_dir = ref_dir
        self.files = files
        self.world_size = world_size
        self.previous: dict[int, tuple[Any, bool, int]] = {}  # rank -> (expected of the previous call, it
        # failed, the byte limit of its output)
        self.rules: set[str] = set()

    def expected(self, stem: str, rank: int) -> tuple[Any, int]:
        """The reference's output of trial `stem` on `rank`, and the byte limit of the candidate's."""
        path = self.ref_dir / f"exp-{stem}-r{rank}.bin"
        return reference_file(path), output_limit(path.stat().st_size, self.world_size)

    def judge_call(self, result: CallResult, replies: list[dict[str, Any]], paths: dict[int, dict[str, str]],
                   ref: dict[int, dict[str, Any]]) -> None:
        """Fill `result` from every rank's reply and files. `ref[rank]`: the reference pool's record of this
        trial on that rank (fingerprint of the pristine inputs, whether the reference modified them)."""
        for reply in sorted(replies, key=lambda r: r["rank"]):
            rank = reply["rank"]
            try:
                self._judge_rank(result, rank, reply, paths[rank], ref[rank])
            except transport.OutputTooLarge as err:  # an honest wrong layout can be this big: not tampering
                self._fail(result, _failure(failures.SHAPE_MISMATCH, f"rank {rank}, {result.trial.label}: its output "
                                            f"is larger than the expected output could be: {err}", rank=rank))
            except Exception as exc:  # whatever the output is, failing to judge it is its failure
                result.flags.add(integrity.TAMPERING)
                self._fail(result, _failure(failures.RUNTIME_ERROR, f"rank {rank}, {result.trial.label}: its output "
                                            f"could not be judged: {type(exc).__name__}: {exc}", rank=rank))

    def _fail(self, result: CallResult, failure: dict[str, Any], *flags: str) -> None:
        result.flags.update(flags)
        if result.failure is None:
            result.failure = {**failure, "trial": result.trial.id, "call": result.call}

    def _judge_rank(self, result: CallResult, rank: int, reply: dict[str, Any], paths: dict[str, str],
                    ref: dict[str, Any]) -> None:
        where = f"rank {rank}, {result.trial.label}"
        expected, limit = self.expected(str(result.trial.id), rank)
        self._look_back(result, rank, reply, paths)
        previous = self.previous.get(rank)
        failed = True
        lazy_flag = integrity.UNSYNCHRONIZED_WORK if self.device == "cuda" else integrity.LAZY_OUTPUT
        unsupported = reply.get("unsupported")
        if unsupported:
            if "not a plain torch.Tensor" in str(unsupported):
                self._fail(result, _failure(failures.OUTPUT_MISMATCH, f"{where}: {unsupported}", rank=rank),
                           integrity.LAZY_OUTPUT)
            else:
                self._fail(result, _failure(failures.SHAPE_MISMATCH, f"{where}: the output cannot be compared: "
                                            f"{unsupported}", rank=rank))
            self.previous[rank] = (expected, True, limit)
            return
        got = self._read(paths["output"], limit)
        if reply.get("changed_after_return"):
            later = self._read(paths["output"] + ".later", limit)
            right_later = matches(expected, later, self.atol, self.rtol)
            later_note = "; only the later value is right" if right_later else ""
            self._fail(result, _failure(failures.OUTPUT_MISMATCH, f"{where}: the output changed after the call "
                                        f"returned (work left running{later_note})", rank=rank), lazy_flag)
        elif not self._inputs_ok(result, rank, reply, paths, ref, where):
            pass
        else:
            verdict = compare_outputs(expected, got, self.atol, self.rtol)
            if verdict["ok"]:
                failed = False
                result.worst_abs = max(result.worst_abs, verdict.get("max_abs_err", 0.0))
                result.worst_rel = max(result.worst_rel, verdict.get("max_rel_err", 0.0))
            else:
                flags = []
                message = f"{where}: {verdict['message']}"
                if previous is not None and matches(previous[0], got, self.atol, self.rtol):
                    flags.append(integrity.STALE_OUTPUT)
                    message += " (the output equals the previous call's answer: stale result)"
                self._fail(result, _failure(verdict["verdict"], message, rank=rank,
                                            max_abs_err=verdict.get("max_abs_err"),
                                            max_rel_err=verdict.get("max_rel_err")), *flags)
        self.previous[rank] = (expected, failed, limit)

    def _read(self, path: str, limit: int) -> Any:
        try:
            return transport.read_tree(Path(path), limit, self.files)
        except transport.OutputTooLarge:
            raise
        except transport.TransportError as err:
            raise ValueError(str(err)) from None

    def _inputs_ok(self, result: CallResult, rank: int, reply: dict[str, Any], paths: dict[str, str],
                   ref: dict[str, Any], where: str) -> bool:
        if ref.get("mutated"):
            self.rules.add(PKB_RULE)
            after = self.ref_dir / f"after-{result.trial.id}-r{rank}.bin"
            mine = reference_file(after)
            theirs = self._read(paths["inputs_after"], output_limit(after.stat().st_size, 1))
            verdict = compare_outputs(mine, theirs, self.atol, self.rtol)
            if not verdict["ok"]:
                self._fail(result, _failure(verdict["verdict"], f"{where}: its inputs after the call differ from "
                                            f"the reference's (which modifies them): {verdict['message']}", rank=rank))
                return False
            return True
        self.rules.add(STRICT)
        if reply.get("input_fingerprint") != ref.get("fingerprint"):
            self._fail(result, _failure(failures.OUTPUT_MISMATCH, f"rank {rank} modified its inputs in "
                                        f"{result.trial.label}", rank=rank), integrity.MUTATES_INPUTS)
            return False
        return True

    def _look_back(self, result: CallResult, rank: int, reply: dict[str, Any], paths: dict[str, str]) -> None:
        """The previous call's output changed during this call: filled in late if it had failed and is now
        right (lazy), else a buffer reused across calls (informational)."""
        if not reply.get("previous_changed"):
            return
        previous = self.previous.get(rank)
        late_path = paths["previous_output"]
        if previous is not None and previous[1] and self.files.exists(late_path):
            now = self._read(late_path, previous[2])
            if matches(previous[0], now, self.atol, self.rtol):
                result.flags.add(integrity.LAZY_OUTPUT)
                result.flags.add("lazy:previous_call_filled_in_later")
                return
        result.flags.add(integrity.OUTPUT_REUSED)


def decide(results: list[CallResult], probe_notes: dict[int, str | None]) -> tuple[dict[str, Any] | None, set[str],
                                                                                   dict[str, str]]:
    """The verdict over every call: (failure or None, flags, notes)."""
    flags: set[str] = set()
    notes: dict[str, str] = {}
    for r in results:
        flags |= r.flags
    normal = [r for r in results if r.trial.kind == "normal" and r.failure]
    if normal:
        first = min(normal, key=lambda r: r.call)
        return first.failure, flags, notes
    stress = [r for r in results if r.trial.kind == "stress" and r.failure]
    if stress:
        first = min(stress, key=lambda r: r.call)
        assert first.failure is not None
        if first.failure["verdict"] in (failures.OUTPUT_MISMATCH, failures.SHAPE_MISMATCH):
            flags.add(integrity.RACE)
            first.failure["message"] += " (right when the ranks run in step, wrong with one rank late: a race)"
        return first.failure, flags, notes
    probe = [r for r in results if r.trial.kind == "probe" and r.failure]
    if probe:
        first = probe[0]
        note = next((n for n in probe_notes.values() if n), None)
        if note is not None:
            notes["precision_probe"] = f"skipped: {note}"
            flags -= first.flags
            return None, flags, notes
        assert first.failure is not None
        if first.failure["verdict"] == failures.OUTPUT_MISMATCH:
            flags.add(integrity.REDUCED_PRECISION)
            first.failure["message"] += (" (right on random inputs, wrong on inputs whose low bits matter: reduced "
                                         "precision)")
        return first.failure, flags, notes
    return None, flags, notes


def worst_errors(results: list[CallResult]) -> tuple[float, float]:
    return max((r.worst_abs for r in results), default=0.0), max((r.worst_rel for r in results), default=0.0)

