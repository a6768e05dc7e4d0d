"""The import graph of the project's own modules, read from the source (AST), import statements in function
bodies included: it has no cycle, its layers point down (agent -> tools -> prompts -> harness -> problems),
every import of our own code inside a function says in a comment why it is deferred, and a rank process
(the one that runs beside candidate code) can reach only the rank side of the harness."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "tools", "prompts", "harness", "problems")
# The folders whose imports are ruled: each says in its __init__'s docstring what it may import, on a line
# "May import: a, b." (names of the level above it: packages, or harness's folders and top modules).
HARNESS_FOLDERS = ("common", "compiling", "emulation", "evaluation", "judge", "launch", "measure", "problems",
                   "rank", "records")
_MAY_IMPORT = re.compile(r"^May import: (.+?)\.$", re.MULTILINE | re.DOTALL)


def may_import(folder: Path) -> set[str]:
    """What a folder's __init__ docstring says it may import ("nothing of ours ..." is the empty set)."""
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    found = _MAY_IMPORT.search(doc)
    assert found, f"{folder.relative_to(REPO)}/__init__.py: its docstring has no 'May import: ...' line"
    said = " ".join(found.group(1).split())
    return set() if said.startswith("nothing of ours") else {name.strip() for name in said.split(",")}


# What each package may import of the others (a package may always import itself), as its docstring says.
ALLOWED = {package: may_import(REPO / package) for package in PACKAGES}


def module_files() -> dict[str, Path]:
    """Our modules by dotted name (expert solutions under problems/*/solutions are candidates, not modules)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO)
            if "solutions" in rel.parts or "__pycache__" in rel.parts:
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = module_files()


def _own(name: str) -> str | None:
    """The longest of our module names that `name` starts with (an imported attribute resolves to its module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the module's package
            package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join([*package, *([base] if base else [])])
        # `from P import x`: the submodule P.x where there is one, else P itself (x is a name defined in P)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    return sorted({t for t in map(_own, names) if t is not None and t != module})


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(module: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, list[ast.stmt]]]:
    """Every import statement of the module outside `if TYPE_CHECKING:` blocks: (node, in a function, the
    statement list that holds it)."""
    tree = ast.parse(MODULES[module].read_text())

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, list[ast.stmt]]]:
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for child in block:
                if _is_type_checking(child):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    yield child, in_function, block
                walk_inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                yield from walk(child, walk_inner)

    yield from walk(tree, False)


def graph() -> dict[str, set[str]]:
    return {m: {t for node, _, _ in imports(m) for t in _targets(node, m)} for m in MODULES}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


# What a rank process may load of ours: the rank side (harness/rank/), the small folder both sides share
# (harness/common/), the one-GPU stand-ins it installs when ranks share a GPU (harness/emulation/), and what
# loads a problem, since the reference runs in the rank (harness/problems/: only its loaders are reached).
RANK_ENTRIES = ("harness.rank.worker", "harness.rank.launcher", "harness.rank.zygote")
RANK_SIDE = ("harness.rank", "harness.common", "harness.emulation", "harness.problems")


def rank_side_reach(edges: dict[str, set[str]]) -> set[str]:
    """Every module of ours a rank process can load: from its entries, along every import (deferred ones
    included), with each module's enclosing packages (importing a.b.c runs a and a.b)."""
    seen: set[str] = set()
    stack = list(RANK_ENTRIES)
    while stack:
        module = stack.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        stack += [".".join(parts[:i]) for i in range(1, len(parts))]
        stack += edges.get(module, ())
    return seen


def _in(module: str, folders: tuple[str, ...]) -> bool:
    return any(module == f or module.startswith(f + ".") for f in folders)


def test_a_rank_reaches_only_the_rank_side():
    reached = rank_side_reach(graph())
    assert {"harness.rank.worker", "harness.rank.timed", "harness.common.failures"} <= reached  # the walk is real
    outside = sorted(m for m in reached if m != "harness" and not _in(m, RANK_SIDE))
    assert not outside, outside
    problems = sorted(m for m in reached if _in(m, ("harness.problems",)))
    # Of the problems folder only what loads one: no validation, no PKB solution sets or its own harness.
    assert set(problems) <= {"harness.problems", "harness.problems.problem", "harness.problems.registry",
                             "harness.problems.parallelkernelbench", "harness.problems.parallelkernelbench.checkout",
                             "harness.problems.parallelkernelbench.inputs"}, problems


def test_the_rank_launcher_imports_only_the_worker_and_only_after_its_limits():
    # It sets the sandbox's limits before any torch or candidate import: the standard library at its top, and
    # the worker it forks ranks from (a CPU pool's) imported inside a function, once the limits are set.
    found = [(t, in_function) for node, in_function, _ in imports("harness.rank.launcher")
             for t in _targets(node, "harness.rank.launcher")]
    assert found == [("harness.rank.worker", True)]


def test_the_fork_server_imports_only_the_launcher():
    # It forks trusted launchers: the worker comes through the launcher's deferred import, nothing else of ours.
    found = [(t, in_function) for node, in_function, _ in imports("harness.rank.zygote")
             for t in _targets(node, "harness.rank.zygote")]
    assert found == [("harness.rank.launcher", False)]


def harness_folder(module: str) -> str | None:
    """The folder of harness/ a module belongs to (a module at harness/'s top is a node of its own)."""
    parts = module.split(".")
    if parts[0] != "harness" or len(parts) == 1:
        return None
    return ".".join(parts[:2])


def test_the_harness_folders_import_each_other_without_a_cycle():
    """Folders follow one evaluation's flow (problems, compiling, launch, rank, judge, measure, records, with
    common/ under all of them): read folder by folder, the harness has no cycle either."""
    folders: dict[str, set[str]] = {}
    for module, targets in graph().items():
        here = harness_folder(module)
        if here is not None:
            folders.setdefault(here, set()).update(
                f for f in map(harness_folder, targets) if f is not None and f != here)
    assert "harness.common" in folders and not folders["harness.common"]  # common imports no other folder
    assert find_cycle(folders) is None, " -> ".join(find_cycle(folders) or [])


def test_each_harness_folder_imports_only_what_its_docstring_says():
    """docs/design.md's folder picture, kept true: a folder's imports of the others are the ones its __init__
    names (a module at harness/'s top, such as cancel or config, counts as a folder of its own)."""
    declared = {f"harness.{f}": {f"harness.{n}" for n in may_import(REPO / "harness" / f)} for f in HARNESS_FOLDERS}
    undeclared = []
    for module, targets in graph().items():
        here = harness_folder(module)
        if here in declared:
            reached = {f for f in map(harness_folder, targets) if f is not None and f != here}
            undeclared += [f"{module} imports {t}" for t in sorted(reached - declared[here])]
    assert not undeclared, undeclared
    names = {p.name for p in (REPO / "harness").iterdir() if (p / "__init__.py").is_file() or p.suffix == ".py"}
    for folder, allowed in declared.items():  # a name that is no folder or module of harness/ is a typo
        assert {n.split(".")[1] for n in allowed} <= {n.removesuffix(".py") for n in names}, folder


def test_the_graph_is_read():
    edges = graph()
    assert "agent.cli" in edges and "harness.evaluate" in edges["agent.cli.eval"]  # a deferred import counts
    assert "harness.problems.registry" in edges["harness.rank.worker"]


def test_the_import_graph_has_no_cycle():
    assert find_cycle(graph()) is None, " -> ".join(find_cycle(graph()) or [])


def test_layers_point_down():
    crossings = sorted(f"{m} imports {t}" for m, targets in graph().items() for t in targets
                       if t.split(".")[0] != m.split(".")[0] and t.split(".")[0] not in ALLOWED[m.split(".")[0]])
    assert not crossings, crossings


def test_imports_inside_functions_say_why():
    """Our own modules are imported at the top; one imported inside a function (heavy, or on a side of the trust
    boundary that must not load it) has a comment on its lines or the line above them."""
    silent = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        for node, in_function, block in imports(module):
            if not in_function or not _targets(node, module):
                continue
            # the run of import statements this one belongs to, in the same block
            i = block.index(node)
            first = i
            while first > 0 and isinstance(block[first - 1], (ast.Import, ast.ImportFrom)):
                first -= 1
            last = i
            while last + 1 < len(block) and isinstance(block[last + 1], (ast.Import, ast.ImportFrom)):
                last += 1
            start, end = block[first].lineno - 1, block[last].end_lineno or block[last].lineno
            if not any("#" in line for line in lines[max(0, start - 1):end]):
                silent.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not silent, silent
