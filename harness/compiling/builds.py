"""Native builds a candidate would do on its first call, found in its source and done ahead of time.

PKB's recorded solutions build their kernels lazily, inside `solution()` (through the checkout's
`utils.cuda_helpers.compile_cuda_extension`, which calls torch's load_inline), so importing the file
builds nothing and the build would land in the ranks' first correctness call, with the GPUs held and the
peers waiting. This module finds such build calls in function bodies, and where every argument can be
evaluated from the module's own top-level names (the usual case: a string constant for the name and one
for the source), makes the very same call once, in the precompile process. The extension then sits in
torch's extension cache (TORCH_EXTENSIONS_DIR) under the same name and source hash, and the rank's own
first call loads it instead of compiling.

Builders recognised: torch.utils.cpp_extension.load_inline and load, any function of another module that
wraps them (PKB's compile_cuda_extension), CuPy's RawModule and RawKernel (compiled into CuPy's kernel
cache). NVRTC calls are reported but not made: an NVRTC program is compiled at run time into the calling
process and nothing persists for the ranks. A call whose arguments use local values (a rank number, a
shape) cannot be made ahead of time; it is counted as undiscovered, with the reason.

Runs inside the sandboxed precompile process, after the candidate was imported there: torch and the
standard library only. Nothing here decides a verdict: each outcome carries what the split build
(harness.compiling.split_build) reported for it, the candidate process's own account, informational only.
"""

from __future__ import annotations

import ast
import importlib
import re
import time
import types
from dataclasses import dataclass, field
from typing import Any, TypedDict

from harness.compiling import split_build
from harness.compiling.ast_names import dotted_name

BUILD_MARKERS = ("load_inline", "cpp_extension", "compile_cuda_extension", "nvrtc", "NVRTC", "RawKernel",
                 "RawModule")
TORCH_BUILDERS = {"load_inline": "load_inline", "load": "cpp_extension.load"}
CUPY_BUILDERS = ("RawModule", "RawKernel")
NVRTC_NAMES = ("nvrtcCompileProgram", "nvrtcCreateProgram")
# Pure functions an argument may call (paths of include folders, str() of a constant).
SAFE_CALLS = frozenset({"os.path.join", "os.path.dirname", "os.path.abspath", "os.path.realpath", "str", "int",
                        "list", "tuple", "dict", "sorted"})
_SAFE_NODES = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Attribute, ast.JoinedStr, ast.FormattedValue,
               ast.BinOp, ast.Add, ast.Mod, ast.Mult, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.Subscript,
               ast.Slice, ast.UnaryOp, ast.USub, ast.keyword, ast.Call, ast.Starred)


# A PKB checkout's helpers are imported from its `utils` package under names of their own: any import
# from there may be a builder.
CHECKOUT_HELPER_RE = re.compile(r"^\s*(from\s+utils[.\s]|import\s+utils\b)", re.MULTILINE)


def may_build(source: str) -> bool:
    """Whether a source may build native code: it names a builder, or imports a checkout helper (PKB's
    compile_cuda_extension and the like). The compile stage starts a precompile process only then."""
    return any(marker in source for marker in BUILD_MARKERS) or bool(CHECKOUT_HELPER_RE.search(source))


@dataclass
class BuildCall:
    """A build call found in a function body, with its arguments evaluated from module-level names."""

    kind: str  # load_inline, cpp_extension.load, <module>.<helper>, cupy.RawModule, cupy.RawKernel
    function: str  # the function whose body holds the call
    line: int
    builder: Any = field(repr=False)
    helper_cuda: bool = False  # a helper (or CuPy) that always builds CUDA code
    args: list[Any] = field(default_factory=list, repr=False)
    kwargs: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        """The extension's name where the builder takes one, else the kind."""
        if self.kind.startswith("cupy."):
            return self.kind
        value = self.kwargs.get("name", self.args[0] if self.args else None)
        return str(value) if value is not None else self.kind

    @property
    def needs_cuda(self) -> bool:
        if self.helper_cuda:
            return True
        if self.kind not in TORCH_BUILDERS.values():
            return False
        sources = self.kwargs.get("cuda_sources") or (self.args[2] if self.kind == "load_inline" and
                                                      len(self.args) > 2 else None)
        listed = self.kwargs.get("sources", self.args[1] if self.kind == "cpp_extension.load" and
                                 len(self.args) > 1 else [])
        listed = listed if isinstance(listed, (list, tuple)) else [listed]
        return bool(sources) or bool(self.kwargs.get("with_cuda")) or any(str(s).endswith(".cu") for s in listed)

    def key(self) -> str:
        return repr((self.kind, self.args, sorted(self.kwargs.items())))


@dataclass(frozen=True)
class Undiscovered:
    """A build call that cannot be made ahead of time, and why; its build will happen in the first call."""

    kind: str
    function: str
    line: int
    reason: str


@dataclass
class Discovery:
    calls: list[BuildCall] = field(default_factory=list)
    undiscovered: list[Undiscovered] = field(default_factory=list)


@dataclass
class BuildOutcome:
    name: str
    kind: str
    function: str
    line: int
    seconds: float
    ok: bool | None  # None: skipped (see `skipped`)
    skipped: str = ""
    error: str = ""
    exception: BaseException | None = field(default=None, repr=False)
    split: dict[str, Any] = field(default_factory=dict)  # the split build's report of this call, if one ran

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "function": self.function, "line": self.line,
                               "seconds": round(self.seconds, 3), "ok": self.ok}
        if self.skipped:
            out["skipped"] = self.skipped
        if self.error:
            out["error"] = self.error
        out.update(split_fields(self.split))
        return out


def split_fields(report: dict[str, Any]) -> dict[str, Any]:
    """A build entry's fields from a split build's report (split_build.BuildReport.as_dict): the extension's
    folder, where its binding unit came from and each step's seconds; none when no split build ran."""
    if not report:
        return {}
    return {"extension": report["extension"], "binding_cache": report["binding_cache"],
            "split_seconds": report["seconds"]}


def _lookup(dotted: str, namespace: dict[str, Any]) -> Any:
    head, *rest = dotted.split(".")
    if head not in namespace:
        raise NameError(head)
    value = namespace[head]
    for part in rest:
        value = getattr(value, part)
    return value


def _constants(code: types.CodeType) -> set[str]:
    """Every string constant of a function's code, nested code and keyword-name tuples included."""
    out: set[str] = set()
    for c in code.co_consts:
        if isinstance(c, str):
            out.add(c)
        elif isinstance(c, tuple):
            out.update(x for x in c if isinstance(x, str))
        elif isinstance(c, types.CodeType):
            out |= _constants(c)
    return out


def _builder_kind(obj: Any, module: types.ModuleType) -> tuple[str, bool] | None:
    """(kind, whether it builds CUDA code for sure) of a builder, or None when the object builds nothing."""
    from torch.utils import cpp_extension

    if obj is cpp_extension.load_inline:
        return TORCH_BUILDERS["load_inline"], False
    if obj is cpp_extension.load:
        return TORCH_BUILDERS["load"], False
    owner = getattr(obj, "__module__", "") or ""
    name = getattr(obj, "__name__", "")
    if owner.startswith("cupy") and name in CUPY_BUILDERS:
        return f"cupy.{name}", True
    if isinstance(obj, types.FunctionType) and owner != module.__name__:
        # A helper of another module (a checkout's utils) that calls load_inline or load itself.
        referenced = [obj.__globals__.get(n) for n in obj.__code__.co_names]
        calls_torch = any(r is cpp_extension.load_inline or r is cpp_extension.load for r in referenced) or \
            (any(r is cpp_extension for r in referenced) and {"load_inline", "load"} & set(obj.__code__.co_names))
        if calls_torch:
            return f"{owner}.{name}", bool({"cuda_sources", "with_cuda"} & _constants(obj.__code__))
    return None


def _unsafe_part(node: ast.AST, namespace: dict[str, Any]) -> str | None:
    """Why an argument cannot be evaluated from module-level names, or None when it can."""
    for child in ast.walk(node):
        if not isinstance(child, _SAFE_NODES):
            return f"its argument uses {type(child).__name__}"
        if isinstance(child, ast.Name) and child.id not in namespace and child.id not in ("str", "int", "list",
                                                                                            "tuple", "dict", "sorted"):
            return f"its argument {child.id!r} is not a module-level name"
        if isinstance(child, ast.Call) and dotted_name(child.func) not in SAFE_CALLS:
            return f"its argument calls {ast.unparse(child.func)}()"
    return None


def _evaluate(node: ast.expr, namespace: dict[str, Any]) -> Any:
    code = compile(ast.Expression(body=node), "<build argument>", "eval")
    return eval(code, dict(namespace))  # noqa: S307 - the node was checked to read module-level names only


def _functions(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every function, methods and nested ones included."""
    out: list[tuple[str, ast.AST]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _local_imports(fn: ast.AST) -> dict[str, tuple[str, str | None]]:
    """Names a function binds by importing inside its body: name -> (module, attribute or None)."""
    out: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
    return out


def _resolve(dotted: str, namespace: dict[str, Any], local: dict[str, tuple[str, str | None]]) -> Any:
    """The object a call names: a module-level name, or one the function imports itself (the first call
    would import that module too; importing it here does nothing the candidate would not)."""
    head = dotted.split(".")[0]
    if head in namespace or head not in local:
        return _lookup(dotted, namespace)
    module_name, attr = local[head]
    value = importlib.import_module(module_name)
    if attr is not None:
        value = getattr(value, attr)
    for part in dotted.split(".")[1:]:
        value = getattr(value, part)
    return value


def find_builds(module: types.ModuleType, source: str) -> Discovery:
    """The build calls in the function bodies of an imported module (top-level builds ran at import)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return Discovery()
    namespace = vars(module)
    found = Discovery()
    seen: set[int] = set()
    for qualname, fn in _functions(tree):
        local = _local_imports(fn)
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call) or id(node) in seen:
                continue
            seen.add(id(node))
            dotted = dotted_name(node.func)
            if dotted is None:
                continue
            if dotted.split(".")[-1] in NVRTC_NAMES:
                found.undiscovered.append(Undiscovered("nvrtc", qualname, node.lineno, "NVRTC compiles into the "
                                                       "calling process at run time: nothing persists to build"))
                continue
            try:
                builder = _resolve(dotted, namespace, local)
            except (NameError, AttributeError, ImportError):
                if dotted.split(".")[-1] in (*TORCH_BUILDERS, "compile_cuda_extension", *CUPY_BUILDERS):
                    found.undiscovered.append(Undiscovered(dotted, qualname, node.lineno,
                                                           f"{dotted} is not a module-level name"))
                continue
            recognised = _builder_kind(builder, module)
            if recognised is None:
                continue
            kind, helper_cuda = recognised
            why = next((r for r in (_unsafe_part(a, namespace) for a in [*node.args, *node.keywords]) if r), None)
            if why is None and (any(isinstance(a, ast.Starred) for a in node.args) or
                                any(k.arg is None for k in node.keywords)):
                why = "it passes *args or **kwargs"
            if why is not None:
                found.undiscovered.append(Undiscovered(kind, qualname, node.lineno, why))
                continue
            try:
                args = [_evaluate(a, namespace) for a in node.args]
                kwargs = {k.arg: _evaluate(k.value, namespace) for k in node.keywords if k.arg}
            except Exception as exc:  # a module-level name that fails to evaluate (an attribute missing)
                found.undiscovered.append(Undiscovered(kind, qualname, node.lineno,
                                                       f"its arguments did not evaluate ({type(exc).__name__}: {exc})"))
                continue
            found.calls.append(BuildCall(kind, qualname, node.lineno, builder, helper_cuda, args, kwargs))
    return found


def cuda_builds_possible() -> str:
    """Why CUDA extensions cannot be built in this process ('' when they can)."""
    import torch

    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU build: CUDA extensions cannot be built here"
    return ""


class _CallFields(TypedDict):
    """The fields of a BuildOutcome that name its call."""

    name: str
    kind: str
    function: str
    line: int


def trigger(call: BuildCall) -> BuildOutcome:
    """Make the build call, as the first call of `solution` would; the extension lands in the cache."""
    base: _CallFields = {"name": call.name, "kind": call.kind, "function": call.function, "line": call.line}
    if call.needs_cuda:
        reason = cuda_builds_possible()
        if reason:
            return BuildOutcome(**base, seconds=0.0, ok=None, skipped=reason)
    started, reported = time.perf_counter(), len(split_build.REPORTS)
    try:
        built = call.builder(*call.args, **call.kwargs)
        if call.kind.startswith("cupy.") and hasattr(built, "compile"):
            built.compile()  # CuPy compiles on first use; compile() puts the binary in its cache now
    except BaseException as exc:  # a failed build is data here; the caller classifies it
        text = f"{type(exc).__name__}: {exc}"
        return BuildOutcome(**base, seconds=time.perf_counter() - started, ok=False, error=text[-2000:],
                            exception=exc)
    # The call's own split build (a helper that builds several extensions: its last one).
    split = split_build.REPORTS[-1].as_dict() if len(split_build.REPORTS) > reported else {}
    return BuildOutcome(**base, seconds=time.perf_counter() - started, ok=True, split=split)


def build_ahead(module: types.ModuleType, source: str) -> tuple[list[BuildOutcome], list[Undiscovered]]:
    """Find and make every build the module's functions would make on first use (each distinct call once)."""
    found = find_builds(module, source)
    outcomes: list[BuildOutcome] = []
    done: set[str] = set()
    for call in found.calls:
        try:
            key = call.key()
        except Exception:  # an argument whose repr fails: build it anyway
            key = f"{call.function}:{call.line}"
        if key in done:
            continue
        done.add(key)
        outcomes.append(trigger(call))
    return outcomes, found.undiscovered
