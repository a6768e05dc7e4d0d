"""The processes and folders of one evaluation: the reference's clean pool and the candidate's sandboxed
pool, started side by side, and everything ended whatever fails on the way."""

from __future__ import annotations

import time
from pathlib import Path

from harness.common import hostile_files
from harness.compiling.compile import keep_lazy_builds, private_copy, visible_for
from harness.emulation import rewrite_record
from harness.evaluation.build import note_rewrites
from harness.evaluation.context import Context
from harness.evaluation.record import Record
from harness.judge.reference import ReferenceRun
from harness.launch.pool import RankPool
from harness.launch.sandbox.budget import evaluation_limits
from harness.launch.sandbox.private import remove_private

# The scratch folders the harness and the ranks exchange files through: calls (a call's inputs and the
# ranks' outputs), sets (timing inputs: only the harness writes there), kept (timed outputs to judge).
EXCHANGE_DIRS = {"calls": True, "sets": False, "kept": True}


class Pools:
    """What the evaluation started, as far as it got: the reference run, the candidate's pool, the private
    copy of the extension folder (held open before the ranks can write it)."""

    def __init__(self) -> None:
        self.reference: ReferenceRun | None = None
        self.candidate: RankPool | None = None
        self.ext_files: hostile_files.Folder | None = None
        self.ext_entry: Path | None = None

    def start(self, ctx: Context, record: Record, ext_entry: Path | None) -> tuple[ReferenceRun, RankPool]:
        """Both pools launched (neither ready yet); `ext_entry`: the extension folder the build left."""
        limits = ctx.config.limits
        self.ext_entry = ext_entry
        self.reference = ReferenceRun(ctx.problem, ctx.shape, ctx.world_size, ctx.device, ctx.ref_dir,
                                      limits.reference_s, gpus=ctx.gpus, start_s=limits.start_s,
                                      ranks_per_gpu=ctx.config.ranks_per_gpu, call_s=limits.reference_call_s,
                                      scale=limits.reference_scale, slack_s=limits.reference_slack_s).launch()
        ext_copy = private_copy(ext_entry, ctx.folder / "extensions")
        self.ext_files = hostile_files.Folder.open(ext_copy)
        self.candidate = RankPool(ctx.world_size, ctx.device, start_timeout=limits.start_s, keep_logs=ctx.log_dir,
                                  gpus=ctx.gpus, role="candidate", extensions=ext_copy,
                                  visible=visible_for(ctx.code_path, ctx.problem.loader_spec),
                                  ranks_per_gpu=ctx.config.ranks_per_gpu,
                                  sandbox_limits=evaluation_limits(ctx.problem, ctx.shape, ctx.world_size,
                                                                   ctx.device, ctx.checks))
        self.candidate.launch()
        for name, writable in EXCHANGE_DIRS.items():  # before any candidate code can plant a link there
            self.candidate.exchange_dir(name, writable)
        record.evidence["sandbox"] = self.candidate.record()
        return self.reference, self.candidate

    def end(self, ctx: Context, record: Record, *, polite: bool, abandoned: bool = False) -> None:
        """Every process and folder of the evaluation goes, whatever fails on the way (it raises after).
        `polite`: no failure and not abandoned, so the candidate's ranks may exit on their own and the lazy
        builds they made are kept; otherwise they may be stuck in a collective and are killed. Unless
        `abandoned`, the builds the ranks used are read for multimem rewrites once the ranks are gone."""
        teardown = time.perf_counter()
        try:
            if self.reference is not None:
                self.reference.kill()
            if self.candidate is not None:
                if polite:
                    self.candidate.close()
                else:
                    self.candidate.kill()
            if not abandoned:  # the ranks are gone: what they built stays as it is now
                note_rewrites(record, rewrite_record.of_folder(self.ext_files, self.ext_entry))
            if self.ext_files is not None and polite:
                added = keep_lazy_builds(self.ext_files, self.ext_entry)
                if added:
                    record.evidence["lazy_builds_kept"] = added
        finally:
            if self.candidate is not None:
                self.candidate.kill()  # nothing when closed already
            if self.ext_files is not None:
                self.ext_files.close()
            remove_private(ctx.folder)
            record.stages["teardown"] = time.perf_counter() - teardown
