"""The versions of the packages a run depends on, for its header (run.json, search.json).

Kept apart from agent.runner so that `pkb search` can record them without importing the runner's
dependencies (LangGraph, the provider SDKs).
"""

from __future__ import annotations

import importlib.metadata
import platform


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("pkb-agent", "torch", "langgraph", "langchain-core", "langchain-openai", "langchain-anthropic",
                 "anthropic", "openai"):
        try:
            out[dist.replace("-", "_")] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist.replace("-", "_")] = "not installed"
    return out
