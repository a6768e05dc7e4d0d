"""What the model may call: compile, check, bench, profile, roofline, submit, guide, recall.

Each tool is thin: it saves the candidate the model sent, calls the harness (which runs in killable
processes), and renders a short answer bounded by a token budget, keeping the structured result apart.

    from tools import ToolContext, run_tool
    outcome = run_tool("check", {"source": code}, ctx)   # outcome.text for the model, outcome.data kept

LangChain tool objects for `bind_tools` are in tools.langchain (make_tools).
"""

from tools.base import TOOL_NAMES, ToolContext, ToolOutcome, run_tool

__all__ = ["TOOL_NAMES", "ToolContext", "ToolOutcome", "run_tool"]
