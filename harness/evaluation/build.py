"""The compile stage's outcome in the record: its seconds, what the build left or stopped, its failure as
the verdict; on success the static scan of the source."""

from __future__ import annotations

from typing import Any

from harness.common import failures
from harness.compiling.compile import CompileOutcome
from harness.emulation import rewrite_record
from harness.evaluation.context import Context
from harness.evaluation.record import Record
from harness.judge.static_scan import static_scan
from harness.records.results import Failure


def take_build(ctx: Context, record: Record, outcome: CompileOutcome) -> bool:
    """Whether the candidate built; where it did not, the compiler's failure is the verdict."""
    record.stages["compile"] = outcome.seconds
    if outcome.cleanup:
        record.evidence["stopped_build"] = outcome.cleanup
    if outcome.built_again_alone:
        record.evidence["built_again_alone"] = outcome.built_again_alone
    if outcome.builds:
        record.evidence["builds"] = outcome.builds
    if not outcome.ok:
        record.failure = Failure(verdict=outcome.verdict, message=outcome.message,
                                 evidence=outcome.evidence, phase="compile")
        if outcome.native and outcome.verdict == failures.COMPILE_ERROR:  # no build folder was kept
            note_rewrites(record, rewrite_record.of_source(ctx.text))
        return False
    static = static_scan(ctx.text)
    if static:
        record.evidence["static"] = static
        record.flags.extend(f["flag"] for f in static)
    return True


def note_rewrites(record: Record, found: dict[str, Any] | None) -> None:
    """Builds whose CUDA source was rewritten for multimem (harness.emulation.rewrite_record)."""
    if found is not None:
        record.evidence.setdefault("emulation", {})["multimem_rewritten"] = found
