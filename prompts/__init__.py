"""Prompt templates and in-context examples: loading, rendering, hashing, and reading code out of replies.

Templates are files in this folder with `$placeholders` (string.Template): data, not code. Every template
and example file is hashed into each run record (`hashes()`), so two runs' prompts can be compared.

- `render_system(tools, guide_in_prompt)` (prompts.system): system.md for an agent with tools, zero_shot.md
  without tools; both carry the in-context example, and the programming guide when it is given in the prompt.
- `render_task(problem, shape, world_size, topology, include_guide)` (prompts.task): task.md: the reference
  source (prompts.source: the problem's imports, the constants and helpers `solution` uses, and `solution`
  itself; never the oracle, make_inputs or expert solutions), signature, dtype, shape, the inputs' layout
  (prompts.inputs), W, the machine's topology (prompts.machine), the rules, the symmetric-memory API, and the
  answer format.
- `extract_code(reply)` (prompts.replies): the candidate file in a model's text reply.
- prompts.templates: the files, loading, substitution, hashes; prompts.guide: guide.md and tools.md by section.

May import: harness, problems.
"""

from prompts.guide import GuideSection, arg_descriptions, guide_sections, guide_text, tool_descriptions
from prompts.machine import topology_summary
from prompts.replies import extract_code
from prompts.source import reference_source
from prompts.system import render_bash_system, render_system
from prompts.task import render_task
from prompts.templates import (
    EXAMPLES_DIR,
    PROMPT_DIR,
    SHELL_REFERENCE,
    SHELL_SOLUTION,
    PromptError,
    hashes,
    load,
)

__all__ = ["EXAMPLES_DIR", "PROMPT_DIR", "SHELL_REFERENCE", "SHELL_SOLUTION", "GuideSection", "PromptError",
           "arg_descriptions", "extract_code", "guide_sections", "guide_text", "hashes", "load", "reference_source",
           "render_bash_system", "render_system", "render_task", "tool_descriptions", "topology_summary"]
