"""Prompt files: where they are, loading one, substituting its `$placeholders` (string.Template), its
markdown sections, and the hashes of every template and example file that go into each run record."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from string import Template
from typing import Any

PROMPT_DIR = Path(__file__).resolve().parent
EXAMPLES_DIR = PROMPT_DIR / "examples"
EXAMPLES = ("ring_shift.py",)  # shown to the model, in this order
GUIDE_FILE = "guide.md"
TOOLS_FILE = "tools.md"
ANSWER_FORMATS_FILE = "answer_formats.md"
# The bash condition's files in its scratch folder (tools/bash.py), as this project's prompt names them.
SHELL_SOLUTION = "solution.py"
SHELL_REFERENCE = "reference.py"
# This package's own modules: they render the templates and are not hashed as one (pkb_generator.py is: it
# writes PKB's own prompt, which is data to this project).
CODE = frozenset({"__init__.py", "templates.py", "guide.py", "system.py", "source.py", "inputs.py", "machine.py",
                  "task.py", "replies.py"})


class PromptError(ValueError):
    """A template or prompt file that cannot be used (missing, outside the folder, bad placeholders)."""




def _path(name: str) -> Path:
    path = (PROMPT_DIR / name).resolve()
    if PROMPT_DIR not in path.parents or not path.is_file():
        raise PromptError(f"no prompt file {name!r} in {PROMPT_DIR}")
    return path


def load(name: str) -> str:
    """The text of a prompt file, by its path relative to the prompts folder ("system.md", "examples/x.py")."""
    return _path(name).read_text(encoding="utf-8")


def template_files() -> list[str]:
    """Every template and example file, relative to the prompts folder (the package's code excluded)."""
    files = [p for p in PROMPT_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts
             and not (p.parent == PROMPT_DIR and p.name in CODE)]
    return sorted(p.relative_to(PROMPT_DIR).as_posix() for p in files)


def hashes() -> dict[str, str]:
    """sha256 of every template and example file, keyed by its path relative to the prompts folder."""
    return {name: hashlib.sha256(_path(name).read_bytes()).hexdigest() for name in template_files()}


def substitute(template: str, /, **values: Any) -> str:
    try:
        return Template(load(template)).substitute({k: str(v) for k, v in values.items()})
    except (KeyError, ValueError) as err:
        raise PromptError(f"{template}: placeholder problem: {err}") from err




def markdown_sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) for every `## heading` of a markdown file; text before the first one is dropped."""
    parts = re.split(r"(?m)^## ", text)
    out = []
    for part in parts[1:]:
        heading, _, body = part.partition("\n")
        out.append((heading.strip(), body.strip()))
    return out
