"""`compile`: does the candidate build? Python syntax, then any native build, in a killable process.

This is step 1 of the harness protocol alone (harness.compiling.compile.compile_candidate): the syntax check runs
nothing; a file that builds native code (load_inline, cpp_extension, NVRTC, CuPy) is imported once in
its own process with the compile time limit, and a failed build comes back as the compiler's own error
lines, trimmed. No rank starts and no GPU is held, so it costs no GPU seconds. The build ends by the
sample's wall budget (tools.base.within_deadline), like check's and bench's evaluations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.compiling.builds import BUILD_MARKERS
from harness.compiling.compile import compile_candidate
from tools.base import OutOfWall, ToolContext, ToolOutcome, bounded, out_of_wall, within_deadline
from tools.build_note import build_note
from tools.render import Block


def run(args: dict[str, Any], ctx: ToolContext, candidate: Path | None) -> ToolOutcome:
    assert candidate is not None  # run_tool requires `source` for compile
    try:
        with within_deadline(ctx):  # waiting for a build slot included
            outcome = compile_candidate(candidate, ctx.config.limits.compile_s, ctx.device,
                                        problem=ctx.problem.loader_spec)
    except OutOfWall as stop:
        return out_of_wall("compile", ctx, candidate, stop, holds_devices=False)
    data = {"tool": "compile", "ok": outcome.ok, "verdict": "compiled" if outcome.ok else outcome.verdict,
            "message": outcome.message, "evidence": outcome.evidence, "native": outcome.native,
            "seconds": round(outcome.seconds, 4)}
    if not outcome.ok:
        blocks = [Block(f"compile: {outcome.verdict}: {outcome.message}")]
        if outcome.evidence.strip():
            label = "the line" if outcome.message.startswith("SyntaxError") else "compiler output (trimmed)"
            blocks.append(Block(outcome.evidence.strip(), "both", title=f"{label}:"))
        return ToolOutcome("compile", bounded(ctx, blocks), data, 0.0, candidate)
    if not outcome.native:
        markers = ", ".join(BUILD_MARKERS)
        text = ("compile: OK. Python syntax is valid. No native build was found in the file (none of: "
                f"{markers}), so nothing else was compiled; `check` runs it.")
        return ToolOutcome("compile", bounded(ctx, [text]), data, 0.0, candidate)
    blocks = [Block(f"compile: OK. The file was imported in a separate process in {outcome.seconds:.1f} s and "
                    "its native builds (if it builds at import) are cached for check and bench.")]
    if note := build_note(outcome.builds):
        blocks.append(Block(note))
    if outcome.message:
        # precompile could not import the file for a reason other than a build failure (nothing was cached).
        blocks.append(Block(f"note: {outcome.message}. Builds that run only inside solution() (or "
                            "kernels CuPy compiles at their first launch) were not compiled here; `check` "
                            "will report their errors.", "tail"))
    return ToolOutcome("compile", bounded(ctx, blocks), data, 0.0, candidate)
