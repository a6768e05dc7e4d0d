"""`submit`: the model's final kernel. Saves it as final.py and ends the sample.

Submit does not score: the agent graph's final node evaluates final.py with the full harness on fresh
seeds, so a kernel tuned to the tools' seeds gains nothing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from tools.base import CANDIDATES_DIR, FINAL_FILE, ToolContext, ToolOutcome, bounded, write_atomic


def run(args: dict[str, Any], ctx: ToolContext, candidate: Path | None) -> ToolOutcome:
    assert candidate is not None  # run_tool requires `source` for submit
    final = Path(ctx.workdir) / FINAL_FILE
    source = candidate.read_text()
    write_atomic(final, source)
    data = {"tool": "submit", "final": FINAL_FILE, "candidate": f"{CANDIDATES_DIR}/{candidate.name}",
            "sha256": hashlib.sha256(source.encode()).hexdigest()}
    text = (f"submit: received {CANDIDATES_DIR}/{candidate.name} as your final kernel. The session ends here; "
            "the kernel is scored with the full harness on fresh seeds.")
    return ToolOutcome("submit", bounded(ctx, [text]), data, 0.0, candidate, ends_sample=True)
