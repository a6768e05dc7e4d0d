"""Whether a problem's reference and a candidate can run on this machine at all, read from their source.

A candidate written for CUDA (PKB's cuda backend, load_inline with CUDA sources, `.cuda()`, tensors made on
`device='cuda'`, symmetric memory, CuPy, Triton) cannot run on a CPU-only evaluation, and a reference that
needs a package this machine lacks (PKB problems 19 and 20 import Triton) cannot run anywhere here. Those
are nobody's fault: the evaluation is an `infra_error` with the reason, never a failure charged to the
model. `environment_issue` says so in one line, before anything is launched.

What counts is code that runs: the module's top level, `solution`, and every function or class either of
them names (transitively); code under a test that looks at the device or at CUDA (`if x.is_cuda:`,
`if torch.cuda.is_available():`) or inside `try:` is a fallback, not a need. A candidate's missing package
counts only when it is a GPU backend (Triton, CuPy, ...) or one the reference needs too: a misspelt import
is the candidate's own error. Standard library and ast only: nothing is imported, so a hostile candidate
runs nothing here.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeGuard

from harness.common.hostile_files import HostileFile, read_given
from harness.common.paths import REPO_ROOT
from harness.compiling.ast_names import dotted_name
from harness.compiling.source_text import SourceEncodingError, source_text

CUDA = "CUDA"
# Packages whose code runs only on a GPU; missing or not, they need CUDA on a CPU run.
GPU_PACKAGES = ("triton", "cupy", "pycuda", "cuda", "numba.cuda", "tilelang", "thunderkittens")
# A PKB checkout's helpers for its GPU backends. Importing them works anywhere (cuda_helpers only imports
# load_inline); what needs CUDA is calling their builders, or the GPU library they import (triton_utils).
# Calls that raise on a machine without CUDA (torch.cuda.device_count and is_available do not).
CUDA_CALLS = frozenset({
    "torch.cuda.current_device", "torch.cuda.current_stream", "torch.cuda.default_stream", "torch.cuda.Stream",
    "torch.cuda.Event", "torch.cuda.synchronize", "torch.cuda.set_device", "torch.cuda.get_device_properties",
    "torch.cuda.get_device_capability", "torch.cuda.get_device_name", "torch.cuda.mem_get_info",
    "torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.stream", "torch.cuda.device",
    "torch.distributed._symmetric_memory.empty", "torch.distributed._symmetric_memory.rendezvous",
})
BUILDERS = ("torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load")
# A test mentioning one of these guards what it controls: the code picks a path by device or backend.
GUARD_RE = re.compile(r"cuda|is_available|device|cpu|triton|cupy|HAS_|_AVAILABLE|backend", re.IGNORECASE)


@dataclass(frozen=True)
class Need:
    """Something a file needs to run: CUDA, or a package (`what` = its import name)."""

    what: str
    line: int
    evidence: str  # the code that needs it, short

    @property
    def is_cuda(self) -> bool:
        return self.what == CUDA


class _Scan:
    """The needs of one parsed file, from the code that runs (see the module docstring)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        self.defs: dict[str, ast.AST] = {n.name: n for n in tree.body
                                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        self.needs: list[Need] = []
        # (module, line, names taken from it) of the imports that run, unguarded
        self.imports: list[tuple[str, int, tuple[str, ...]]] = []
        self.used: set[str] = set()  # names read by code that runs, unguarded

    def resolve(self, node: ast.AST) -> str | None:
        name = dotted_name(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        full = self.aliases.get(head, head)
        return f"{full}.{rest}" if rest else full

    def run(self, entries: tuple[str, ...] = ("solution",)) -> _Scan:
        """Scan from the top level and `entries` ("*": every top-level function and class). A function
        named only under a guard is scanned as guarded: it is a fallback path too."""
        reached: dict[str, bool] = {}  # function or class name -> reached only under a guard
        todo: list[tuple[ast.AST, bool]] = [(n, False) for n in self.tree.body
                                            if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                                            and not _is_main_block(n)]
        for name in (list(self.defs) if "*" in entries else entries):
            if name in self.defs and name not in reached:
                todo.append((self.defs[name], False))
                reached[name] = False
        while todo:
            node, under_guard = todo.pop()
            for child, guarded in self._walk(node, under_guard):
                if isinstance(child, ast.Name) and child.id in self.defs and reached.get(child.id, True) \
                        and not (child.id in reached and guarded):
                    reached[child.id] = guarded
                    todo.append((self.defs[child.id], guarded))
                if not guarded:
                    self._signal(child)
                    if isinstance(child, ast.Name):
                        self.used.add(child.id)
        return self

    def _walk(self, node: ast.AST, guarded: bool) -> Iterator[tuple[ast.AST, bool]]:
        yield node, guarded
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            inner = guarded or _is_guard(node.test)
            yield from self._walk(node.test, guarded)
            yield from self._block(_as_list(node.body), inner)
            yield from self._block(_as_list(node.orelse), inner)
            return
        if isinstance(node, ast.Try) and node.handlers:
            yield from self._block(node.body, True)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                yield from self._walk(child, guarded)
            return
        blocks = [getattr(node, f) for f in ("body", "orelse", "finalbody")
                  if isinstance(getattr(node, f, None), list)]
        in_blocks = {id(stmt) for block in blocks for stmt in block}
        for child in ast.iter_child_nodes(node):
            if id(child) not in in_blocks:
                yield from self._walk(child, guarded)
        for block in blocks:
            yield from self._block(block, guarded)

    def _block(self, statements: Sequence[ast.AST], guarded: bool) -> Iterator[tuple[ast.AST, bool]]:
        """A statement list in order. After `if <device test>: ... return` the rest of the block is the
        device's own path (`if not x.is_cuda: return fallback(x)`): guarded like a branch. A refusal
        (`if not x.is_cuda: raise ...`, `assert x.is_cuda`) is a need, not a fallback."""
        for stmt in statements:
            yield from self._walk(stmt, guarded)
            if not guarded and _refuses_cpu(stmt):
                self.needs.append(Need(CUDA, stmt.lineno, _short(stmt)))
            if isinstance(stmt, ast.If) and _is_guard(stmt.test) and (_returns(stmt.body) or _returns(stmt.orelse)):
                guarded = True

    def _signal(self, node: ast.AST) -> None:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for a in node.names:
                self._imported(a.name, line)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if not self._imported(node.module, line, names=tuple(a.name for a in node.names)):
                for a in node.names:  # `from cuda import nvrtc`, `from numba import cuda`
                    if self._imported(f"{node.module}.{a.name}", line, submodule=True):
                        break
        elif isinstance(node, ast.Call):
            self._call(node, line)

    def _imported(self, module: str, line: int, submodule: bool = False, names: tuple[str, ...] = ("*",)) -> bool:
        """Record an import that runs; True when it needs CUDA."""
        if not submodule:
            self.imports.append((module, line, names))
        for gpu in GPU_PACKAGES:
            if module == gpu or module.startswith(gpu + "."):
                self.needs.append(Need(CUDA, line, f"import {module}"))
                return True
        return False

    def _call(self, node: ast.Call, line: int) -> None:
        func = self.resolve(node.func)
        short = ast.unparse(node.func)
        if func in CUDA_CALLS:
            self.needs.append(Need(CUDA, line, f"{short}()"))
        elif func == "utils.cuda_helpers.compile_cuda_extension":
            self.needs.append(Need(CUDA, line, f"{short}(...) builds a CUDA extension"))
        elif func in BUILDERS and _builds_cuda(node):
            self.needs.append(Need(CUDA, line, f"{short}(...) with CUDA sources"))
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" and len(node.args) <= 1:
            self.needs.append(Need(CUDA, line, f"{short}()"))
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "to" and node.args \
                and _is_cuda_text(node.args[0]):
            self.needs.append(Need(CUDA, line, f"{short}({ast.unparse(node.args[0])})"))
        for kw in node.keywords:
            if kw.arg == "device" and _is_cuda_text(kw.value):
                self.needs.append(Need(CUDA, line, f"device={ast.unparse(kw.value)}"))


def _is_guard(test: ast.AST) -> bool:
    return bool(GUARD_RE.search(ast.unparse(test)))


def _returns(statements: list[ast.stmt]) -> bool:
    return bool(statements) and isinstance(statements[-1], ast.Return)


NOT_CUDA_RE = re.compile(r"not [\w.()\[\]]*is_cuda|!= *['\"]cuda|is_cuda *== *False")
IS_CUDA_RE = re.compile(r"is_cuda|== *['\"]cuda")


def _refuses_cpu(stmt: ast.AST) -> TypeGuard[ast.Assert | ast.If]:
    """`assert x.is_cuda` or `if not x.is_cuda: raise`: the code refuses to run anywhere but CUDA."""
    if isinstance(stmt, ast.Assert):
        text = ast.unparse(stmt.test)
        return bool(IS_CUDA_RE.search(text)) and not NOT_CUDA_RE.search(text)
    if isinstance(stmt, ast.If) and stmt.body and isinstance(stmt.body[-1], ast.Raise):
        return bool(NOT_CUDA_RE.search(ast.unparse(stmt.test)))
    return False


def _short(stmt: ast.AST) -> str:
    text = ast.unparse(stmt.test if isinstance(stmt, ast.Assert) else stmt).splitlines()[0]
    return ("assert " if isinstance(stmt, ast.Assert) else "") + (text if len(text) <= 60 else text[:57] + "...")


def _is_main_block(node: ast.AST) -> bool:
    """`if __name__ == "__main__":` runs only when the file is executed as a script, never here."""
    return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)


def _as_list(value: Any) -> list[ast.AST]:
    return value if isinstance(value, list) else [value]


def _is_cuda_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("cuda")


def _builds_cuda(node: ast.Call) -> bool:
    for kw in node.keywords:
        if kw.arg == "with_cuda" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
            return True
        if kw.arg == "cuda_sources" and not (isinstance(kw.value, ast.Constant) and not kw.value.value):
            return True
        if kw.arg == "sources" and ".cu" in ast.unparse(kw.value):
            return True
    return any(".cu'" in ast.unparse(a) or '.cu"' in ast.unparse(a) for a in node.args[1:2])


@lru_cache(maxsize=1024)
def _scan_text(text: str, entries: tuple[str, ...] = ("solution",),
               ) -> tuple[tuple[Need, ...], tuple[tuple[str, int, tuple[str, ...]], ...], frozenset[str]] | None:
    try:
        scan = _Scan(ast.parse(text)).run(entries)
    except (SyntaxError, ValueError, RecursionError):
        return None
    return (tuple(sorted(set(scan.needs), key=lambda n: n.line)),
            tuple(sorted(set(scan.imports), key=lambda i: i[1])), frozenset(scan.used))


def _installed(module: str, local_roots: tuple[Path, ...]) -> bool:
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "__future__":
        return True
    if any((root / top).exists() or (root / f"{top}.py").exists() for root in local_roots):
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


PROJECT_ROOT = REPO_ROOT  # this suite's own modules (problems._symm) are local


def file_needs(path: Path, local_roots: tuple[Path, ...] = (), *, depth: int = 2,
               entries: tuple[str, ...] = ("solution",)) -> list[Need]:
    """What `path` needs to run: CUDA, and packages not installed here (what = the package's name).
    Imports of local modules (a checkout's `utils`, this project's `problems`) are followed `depth` levels,
    from the names imported: a solution that imports the checkout's utils.triton_utils needs Triton as much
    as one that imports it itself."""
    try:
        text = source_text(read_given(path))  # as Python reads it (any other encoding: compile refuses it)
    except (OSError, HostileFile, SourceEncodingError):
        return []
    scanned = _scan_text(text, entries)
    if scanned is None:
        return []  # a syntax error: the compile stage reports it
    needs, imports, used = scanned
    out = list(needs)
    local_roots = (*local_roots, PROJECT_ROOT)
    roots = (*local_roots, path.parent)
    for module, line, names in imports:
        if not _installed(module, roots):
            out.append(Need(module.split(".")[0], line, f"import {module}"))
            continue
        local = _local_file(module, local_roots)
        if local is not None and depth > 0 and local != path:
            # The imported module's top level runs at import; a function of it counts only where code
            # that runs here uses it (`import X` then `X.f`: all of X).
            taken = ("*",) if names == ("*",) and module.split(".")[0] in used else \
                tuple(n for n in names if n in used)
            for need in file_needs(local, local_roots, depth=depth - 1, entries=taken):
                out.append(Need(need.what, line, f"import {module} ({local.name} line {need.line}: {need.evidence})"))
    return out


def _local_file(module: str, roots: tuple[Path, ...]) -> Path | None:
    parts = module.split(".")
    for root in roots:
        for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def _describe(who: str, need: Need, where: str, device: str) -> str:
    if need.is_cuda:
        return f"{who} needs CUDA ({where}line {need.line}: {need.evidence}), and this evaluation runs on {device}"
    return (f"{who} needs the package {need.what}, which is not installed here "
            f"({where}line {need.line}: {need.evidence})")


def environment_issue(problem: Any, candidate_path: str | Path | None, device: str) -> str | None:
    """Why this evaluation cannot run on this machine, in one line, or None when nothing is known against it.

    `problem` is a harness.problems.problem.Problem (its reference file is `problem.path`; a PKB problem's checkout
    is `problem.source["checkout"]`); `device` is "cpu" or "cuda". The reference is checked first: if it
    cannot run, no candidate can be judged."""
    checkout = (problem.source or {}).get("checkout")
    roots = (Path(checkout),) if checkout else ()
    where = "CPU" if device == "cpu" else device
    reference = Path(problem.path)
    ref_needs = file_needs(reference, roots)
    label = f"reference/{reference.name}, " if checkout else f"{reference.name}, "
    issue = _first_issue("the reference", ref_needs, label, where, device == "cpu", lambda _: True)
    if issue or candidate_path is None:
        return issue
    # A candidate's missing package is the environment's fault only for a GPU backend or a package the
    # reference needs too; any other missing import is the candidate's own (api_error).
    excused = {n.what for n in ref_needs if not n.is_cuda} | {p.split(".")[0] for p in GPU_PACKAGES}
    return _first_issue("the candidate", file_needs(Path(candidate_path), roots), "", where, device == "cpu",
                        lambda what: what in excused)


def _first_issue(who: str, needs: list[Need], label: str, where: str, on_cpu: bool,
                 counts: Callable[[str], bool]) -> str | None:
    """A missing package first (true on any machine), then CUDA on a CPU run."""
    for need in needs:
        if not need.is_cuda and counts(need.what):
            return _describe(who, need, label, where)
    for need in needs:
        if need.is_cuda and on_cpu:
            return _describe(who, need, label, where)
    return None
