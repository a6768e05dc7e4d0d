"""The agent: LangGraph loop, model providers, budgets, the experiment runner and the `pkb` CLI.

May import: tools, prompts, harness, problems.
"""
