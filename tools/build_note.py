"""The build line of a check, bench or compile answer: the build's seconds and what came from a cache.

Read from what the harness records per native build (EvalResult.integrity["builds"], the compile stage's
`builds`): `cache` is "hit" when this very source was built before (nothing compiled) or "miss"; a load_inline
build split in two (harness.compiling.split_build) adds `binding_cache`, whether the binding unit (main.cpp:
torch/extension.h, the cpp_sources, the generated bindings) came from the object cache. Every field is read
defensively: older records, builds that are not split and unknown values simply say less.
"""

from __future__ import annotations

from typing import Any

from harness.compiling.compile import HIT, MISS  # the marks of both caches
from harness.records.results import EvalResult


def build_records(builds: Any) -> list[dict[str, Any]]:
    return [b for b in builds if isinstance(b, dict)] if isinstance(builds, list) else []


def binding_marks(builds: Any) -> list[str]:
    """The distinct `binding_cache` marks of the builds, at the top of a build's record or in a nested report."""
    marks: list[str] = []
    for build in build_records(builds):
        nested = [v.get("binding_cache") for v in build.values() if isinstance(v, dict)]
        for mark in [build.get("binding_cache"), *nested]:
            if isinstance(mark, str) and mark not in marks:
                marks.append(mark)
    return marks


def result_build(result: EvalResult) -> tuple[Any, Any]:
    """A result's builds and build seconds: those of the build made before the GPU lease where an executor made
    one (environment.executor: on a GPU the build runs before the lease, and the compile stage within the lease
    then finds every build cached), else the compile stage's own."""
    executor = result.environment.get("executor")
    if isinstance(executor, dict) and executor.get("builds"):
        return executor["builds"], executor.get("build_before_lease_s")
    return result.integrity.get("builds"), result.stages.get("compile")


def build_note(builds: Any, seconds: Any = None) -> str | None:
    """One line, or None where nothing native was built (a PyTorch-only candidate)."""
    records = build_records(builds)
    if not records:
        return None
    parts = [f"{seconds:.1f} s"] if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else []
    marks = binding_marks(records)
    if all(b.get("cache") == HIT for b in records):
        parts.append("this exact source was built before, taken from the cache")
    elif HIT in marks and MISS not in marks:
        parts.append("the binding unit (cpp_sources, torch headers) came from the cache, only cuda_sources was "
                     "compiled")
    elif MISS in marks:
        parts.append("the binding unit (cpp_sources, torch headers) was compiled too; an edit that keeps "
                     "cpp_sources takes it from the cache")
    return "build: " + "; ".join(parts) if parts else None
