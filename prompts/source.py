"""The reference source a task prompt shows: the problem's imports, the constants and helpers `solution`
uses, and `solution` itself; never the oracle, make_inputs or expert solutions."""

from __future__ import annotations

import ast
from pathlib import Path

from prompts.templates import PromptError


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


HIDDEN = frozenset({"PROBLEM", "make_inputs", "oracle", "traffic"})


def reference_source(path: Path) -> str:
    """The reference as the model sees it: the module's imports, the constants, helpers and classes that
    `solution` uses (transitively), and `solution` itself, in file order with their comments. The oracle,
    make_inputs, traffic and PROBLEM stay out: the oracle is the answer key."""
    text = Path(path).read_text(encoding="utf-8")
    tree = ast.parse(text)
    lines = text.splitlines()
    definitions = {name: node for node in tree.body for name in _bound_names(node) if name not in HIDDEN}
    if "solution" not in definitions:
        raise PromptError(f"{path}: defines no solution()")
    wanted: set[str] = set()
    frontier = ["solution"]
    while frontier:
        name = frontier.pop()
        if name in wanted or name not in definitions:
            continue
        wanted.add(name)
        frontier.extend(_names_used(definitions[name]) - wanted)
    keep = [node for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom)) or (_bound_names(node) & wanted)]
    chunks = []
    for node in keep:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):  # the comment right above it
            start -= 1
        chunks.append("\n".join(lines[start:node.end_lineno]))
    imports = [c for c, n in zip(chunks, keep) if isinstance(n, (ast.Import, ast.ImportFrom))]
    rest = [c for c, n in zip(chunks, keep) if not isinstance(n, (ast.Import, ast.ImportFrom))]
    return "\n".join(imports) + "\n\n\n" + "\n\n\n".join(rest)
