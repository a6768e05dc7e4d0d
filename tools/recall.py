"""`recall`: an earlier candidate's complete file, by its number, with what the tools measured on it.

In a long session the agent loop shortens older candidates in the conversation to a one-line reference
(agent.context); this tool is how the model gets one back. It reads only the sample's own files
(candidates/NNN.py and the tool record beside it), runs nothing and holds no GPU. The file comes back
whole, not cut to the tools' answer budget: a partial file is no use to a model that wants to edit it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.common import hostile_files
from tools.base import CANDIDATES_DIR, ToolContext, ToolInputError, ToolOutcome

# A candidate is the model's own text; this bounds what a corrupt or huge file could put into the context.
MAX_CHARS = 200_000
SOURCE_LIMIT, RECORD_LIMIT = 16 << 20, 64 << 20  # bytes read of a candidate file and of its record


def measurements(record: dict[str, Any]) -> str:
    """What a candidate's tool record says about it in a few words: tool, verdict, speedup."""
    raw = record.get("data")
    data: dict[str, Any] = raw if isinstance(raw, dict) else {}
    parts = [f"{record.get('tool') or 'a reply'}"]
    if data.get("verdict"):
        parts.append(f"verdict {data['verdict']}")
    if isinstance(data.get("speedup"), (int, float)):
        parts.append(f"speedup {data['speedup']:.3g}x")
    return ", ".join(parts)


def run(args: dict[str, Any], ctx: ToolContext, candidate: Path | None) -> ToolOutcome:
    number = args.get("candidate")
    if isinstance(number, str) and number.strip().isdigit():
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int) or number < 0:
        raise ToolInputError(f"`candidate` must be a candidate number (0, 1, 2, ...), got {number!r}")
    path = ctx.candidates_dir / f"{number:03d}.py"
    if not path.is_file():
        known = sorted(p.stem for p in ctx.candidates_dir.glob("*.py")) if ctx.candidates_dir.is_dir() else []
        listed = ", ".join(str(int(k)) for k in known if k.isdigit()) or "none yet"
        raise ToolInputError(f"no candidate {number}; the candidates so far: {listed}")
    # The sample's own folder (the trusted side wrote these), read as hostile all the same: without a sandbox
    # a candidate could have planted a link or a FIFO there.
    try:
        source = hostile_files.read_bytes(path, SOURCE_LIMIT).decode(errors="replace")
    except hostile_files.HostileFile as err:
        raise ToolInputError(f"candidate {number} cannot be read: {err}") from None
    cut = ""
    if len(source) > MAX_CHARS:
        source, cut = source[:MAX_CHARS], f"\n[... {len(source) - MAX_CHARS} characters cut ...]"
    try:
        record = hostile_files.read_json(path.with_suffix(".json"), RECORD_LIMIT)
    except (OSError, hostile_files.HostileFile):
        record = {}
    said = measurements(record) if isinstance(record, dict) else "no record"
    text = (f"recall: candidate {number} ({CANDIDATES_DIR}/{path.name}; {said}), the whole file:\n\n"
            f"```python\n{source.rstrip()}{cut}\n```")
    return ToolOutcome("recall", text, {"tool": "recall", "candidate": number, "file": f"{CANDIDATES_DIR}/{path.name}"})
