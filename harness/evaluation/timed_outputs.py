"""The judged calls of the timing phase, after it: each kept output against the reference's for the same
inputs (a sample of its elements, the full tolerance), each call's inputs said intact, and the verdict of the
wrong ones. Every file here is the rank's: read as hostile, removed through the held scratch folder."""

from __future__ import annotations

from pathlib import Path

from harness.common import failures, hostile_files, integrity
from harness.common.compare import compare_outputs
from harness.evaluation.context import Context
from harness.evaluation.record import Record
from harness.evaluation.stop import Stop, candidate_files, inputs_changed
from harness.judge import trials
from harness.judge.reference import TimingSets
from harness.judge.timing import Kept, sampled
from harness.rank import transport
from harness.records.results import Failure

Wrong = tuple[Kept, int, str]  # a judged call, the rank whose output was wrong, why


class TimedJudge:
    """Judges the kept outputs of one timing phase and counts them (the record and the verdict say how many)."""

    def __init__(self, ctx: Context, files: hostile_files.Folder, sets: TimingSets, refill: bool) -> None:
        self.ctx, self.files, self.sets, self.refill = ctx, files, sets, refill
        self.judged = 0  # judged calls of the timing phase so far

    def judge(self, kept: Kept) -> list[Wrong]:
        """A judged call: its output, per rank (why it is wrong), and its inputs after the call (the rank
        compares them with the draw they were copied from): changed inputs end the evaluation at once."""
        it = kept.iteration
        stem = f"t{it.trial}" if self.refill else (f"fresh{kept.set_index}" if it.request == "fresh"
                                                    else f"set{kept.set_index}")
        self.judged += 1
        wrong: list[Wrong] = []
        for rank, path in sorted(kept.paths.items()):
            why = self._why_wrong(path, self.ctx.ref_dir / f"exp-{stem}-r{rank}.bin")
            if why is not None:
                wrong.append((kept, rank, why))
            self.remove(path)
        if self.refill and not self.sets.mutated:
            for rank in sorted(kept.paths):
                if not kept.intact.get(rank):  # a rank that does not say they are intact has changed them
                    raise inputs_changed(rank, f"the inputs of a judged {it.kind} call changed during the call")
        return wrong

    def verdict(self, record: Record, wrong: list[Wrong]) -> Stop:
        """The failure of wrong judged calls (the caller raises it): `timed_output_wrong`; where only precision
        probes were wrong (right on random inputs, wrong where the low bits matter), `reduced_precision` too."""
        plain = [w for w in wrong if w[0].iteration.kind != "probe"]
        kept, rank, why = (plain or wrong)[0]
        calls = len({id(w[0]) for w in wrong})
        record.flags.append(integrity.TIMED_OUTPUT_WRONG)
        note = ""
        if not plain:
            record.flags.append(integrity.REDUCED_PRECISION)
            note = (" (only precision probes among the timed calls were wrong: right on random inputs, wrong on "
                    "inputs whose low bits matter: reduced precision when timed)")
        return Stop(Failure(verdict=failures.OUTPUT_MISMATCH, phase="timing", rank=rank,
                            message=f"{calls} of {self.judged} judged calls of the timing phase were wrong "
                                    f"although the check passed; first: rank {rank}, a {kept.iteration.kind} call: "
                                    f"{why}{note}"))

    def _why_wrong(self, path: Path, expected_path: Path) -> str | None:
        """Why one kept timed output is wrong, or None."""
        files = self.files
        issue = path.with_suffix(".issue")
        try:
            if files.exists(issue):
                return f"not comparable: {files.read_text(issue, 4096)[:200]}"
            expected = trials.reference_file(expected_path)
            got = transport.read_tree(path, trials.output_limit(expected_path.stat().st_size, self.ctx.world_size),
                                      files)
            expected, got = sampled(expected, got, self.ctx.checks.timed_check_elements, self.ctx.rng)
            verdict = compare_outputs(expected, got, self.ctx.problem.atol, self.ctx.problem.rtol)
        except (transport.TransportError, hostile_files.HostileFile) as err:
            return f"its output could not be read back: {err}"
        except Exception as exc:  # whatever the output is, failing to judge it is its failure
            return f"its output could not be judged: {type(exc).__name__}: {exc}"
        return None if verdict["ok"] else str(verdict["message"])

    def remove(self, path: Path) -> None:
        """A kept output and its note, gone from the scratch (through the held folder: no link followed)."""
        with candidate_files("timing"):
            for name in (path, path.with_suffix(".issue")):
                self.files.unlink(name)  # nothing there is fine
