"""Static findings on a candidate's source: suspicious constructs, as flags (never verdicts). Judge side.

A determined candidate hides any of these from an AST (exec, getattr with built strings); the runtime
checks decide. The findings say what a reader of the source should look at.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

from harness.compiling.ast_names import dotted_name

# CPython 3.11's parser is not safe to run from two threads at once ("AST constructor recursion depth
# mismatch"), and evaluations run concurrently in threads of one harness process (pkb run, pkb search).
_PARSE = threading.Lock()

_INTROSPECTION = {"_getframe", "_current_frames", "f_back", "f_locals", "f_globals", "currentframe",
                  "get_objects", "get_referrers", "get_referents", "settrace", "setprofile", "getouterframes"}
_PATCH_ROOTS = {"time", "builtins", "harness", "json", "hmac", "multiprocessing", "sys", "gc", "importlib"}
_PATCH_WORDS = {"Event", "Stream", "synchronize", "elapsed_time", "record", "perf_counter", "monotonic",
                "Tensor", "distributed", "all_reduce", "all_gather", "barrier", "solution", "compare"}
_FD_CALLS = {"write", "dup", "dup2", "fdopen", "writev", "pwrite", "sendfile"}


def _dotted(node: ast.AST) -> str:
    return dotted_name(node) or ""


def static_scan(source: str | bytes) -> list[dict[str, Any]]:
    """Suspicious constructs in a candidate's source, as {"flag", "line", "what"}. Flags, not verdicts:
    a determined candidate hides any of these from an AST (exec, getattr with built strings), and the
    runtime checks are what decide. An unparsable file yields nothing (compile reports it). Given bytes (the
    file as it is), the parser decodes them as import does, a PEP 263 declaration included; the compile
    stage refuses any declaration but UTF-8 (harness.compiling.source_text), so text decoded as UTF-8
    reads the same."""
    try:
        with _PARSE:
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    aliases: dict[str, str] = {}  # local name -> module path
    findings: list[dict[str, Any]] = []

    def add(flag: str, node: ast.AST, what: str) -> None:
        findings.append({"flag": f"static:{flag}", "line": getattr(node, "lineno", 0), "what": what})

    def harness_module(name: str) -> bool:
        parts = name.split(".")
        if parts[0] in ("harness", "tests", "agent", "tools"):
            return True
        # A problem module is the reference itself; problems._symm is shared plumbing for solutions.
        return parts[0] == "problems" and len(parts) > 1 and not parts[1].startswith("_")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if harness_module(a.name):
                    add("harness_access", node, f"import {a.name}")
                if a.name.startswith("multiprocessing.connection"):
                    add("fd_access", node, f"import {a.name}")
                if a.name == "ctypes":
                    add("ctypes", node, "import ctypes")
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            if harness_module(node.module):
                add("harness_access", node, f"from {node.module} import ...")
            if node.module.startswith("multiprocessing.connection"):
                add("fd_access", node, f"from {node.module} import ...")
            if node.module == "ctypes":
                add("ctypes", node, "from ctypes import ...")
        elif isinstance(node, ast.Attribute) and node.attr in _INTROSPECTION:
            add("introspection", node, f".{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if "/proc/" in text and ("/fd" in text or "/mem" in text):
                add("fd_access", node, repr(text[:60]))
            if text.startswith(("harness.", "__main__")) or text in ("harness", "__main__"):
                add("harness_access", node, repr(text[:60]))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute):
                    name = _dotted(target)
                    root = aliases.get(name.split(".")[0], name.split(".")[0]).split(".")[0]
                    words = set(name.split("."))
                    if name.startswith("torch.backends") or not name:
                        continue
                    if root in _PATCH_ROOTS or (root in ("torch", "dist") and words & _PATCH_WORDS):
                        add("monkeypatch", node, f"assigns {name}")
        elif isinstance(node, ast.Call):
            func = _dotted(node.func)
            if func in ("setattr", "delattr") and node.args:
                patched = _dotted(node.args[0])
                root = aliases.get(patched.split(".")[0], patched.split(".")[0]).split(".")[0] if patched else ""
                if root in _PATCH_ROOTS or root in ("torch", "dist"):
                    add("monkeypatch", node, f"{func}({patched}, ...)")
            module, _, attr = func.rpartition(".")
            if aliases.get(module, module) == "os" and attr in _FD_CALLS:
                add("fd_access", node, f"os.{attr}()")
            if attr in ("Thread", "Process") or func in ("threading.Thread", "os.fork"):
                add("threads", node, f"{func}()")
    return findings
