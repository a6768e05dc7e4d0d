"""What the model may call: compile, check, bench, profile, roofline, submit, guide, recall.

Each tool is thin: it saves the candidate the model sent, calls the harness (which runs in killable
processes), and renders a short answer bounded by a token budget, keeping the structured result apart.

- .specs: every tool's facts (name, source, argument, device), and the name lists derived from them;
- .dispatch: run_tool(name, args, ctx), one call;
- .base: what every tool shares (ToolContext, ToolOutcome, candidate files); tools/<name>.py: each tool;
- .render (token budgets) and .summaries (the harness's records as text for the model);
- .langchain_tools: the tools as LangChain tool objects, for `bind_tools`.

This package's __init__ imports nothing: tools.specs is read without the harness.

May import: prompts, harness, problems.
"""
