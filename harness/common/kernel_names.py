"""Kernel names as people (and models) read them: without the argument list, templates folded when long.

Pure: the profiler timeline (harness.measure.profiling) and the Nsight summaries (tools.summaries) use it.
"""

from __future__ import annotations


def short_name(name: str, limit: int = 80) -> str:
    """A kernel's name without its argument list (and template arguments when still too long)."""
    name = name.removeprefix("void ").strip()
    depth = 0
    for i, ch in enumerate(name):  # cut at the argument list's '(' outside template brackets
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth <= 0 and i > 0 and name[i - 1] != " ":  # "Memcpy PtoP (Device -> Device)" stays
            name = name[:i]
            break
    if len(name) > limit and "<" in name:
        name = name[: name.index("<")] + "<...>"
    return name if len(name) <= limit else name[: limit - 3] + "..."
