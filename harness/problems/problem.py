"""Loading one problem module and holding it to the contract of problems/README.md.

Worker-safe: standard library and torch only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import torch

CATEGORIES = (
    "collective",
    "tensor",
    "sequence",
    "context",
    "data",
    "fsdp_zero",
    "expert",
    "pipeline",
    "rl_vocab",
    "other",
)
REQUIRED_FUNCTIONS = ("make_inputs", "solution", "oracle")
REQUIRED_KEYS = ("name", "category", "source", "summary", "dtype", "shapes", "world_sizes", "tolerance")
REQUIRED_SOURCE_KEYS = ("codebase", "path", "symbol")
REQUIRED_SHAPES = ("default", "small")
# Held-out scoring shapes (PROBLEM["held_out"]): for a visible shape V, the shape named HELD_OUT_PREFIX + V has
# the same meaning at another size. The agent's tools never use it; the final scoring runs it too.
HELD_OUT_PREFIX = "held-out:"


class MalformedProblem(ValueError):
    """A problem file that breaks the contract. The message names the file and the missing piece."""


@dataclass(frozen=True)
class Problem:
    """A loaded problem: its metadata plus the functions of its module."""

    name: str
    category: str
    source: dict[str, str]
    summary: str
    dtype: torch.dtype
    shapes: dict[str, dict[str, Any]]
    world_sizes: tuple[int, ...]
    atol: float
    rtol: float
    path: Path
    module: ModuleType = field(repr=False, compare=False)
    origin: str = "pkb-agent"  # or "pkb" for problems loaded from a PKB checkout
    spec: str = ""  # how a rank worker loads it again; empty means the file path
    # visible shape name -> its held-out shape (same keys, other sizes), chosen by the problem, not the run
    held_out: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def loader_spec(self) -> str:
        """The string a rank worker passes to harness.problems.registry.load_problem_spec to get this problem back."""
        return self.spec or str(self.path)

    # problem_from_module checked that the module defines these functions (REQUIRED_FUNCTIONS); their
    # types are the contract of problems/README.md.
    @property
    def make_inputs(self) -> Callable[..., tuple[Any, ...]]:
        return cast("Callable[..., tuple[Any, ...]]", self.module.make_inputs)

    @property
    def solution(self) -> Callable[..., Any]:
        return cast("Callable[..., Any]", self.module.solution)

    @property
    def oracle(self) -> Callable[..., list[Any]] | None:
        return getattr(self.module, "oracle", None)

    @property
    def traffic(self) -> Callable[..., dict[str, Any] | list[dict[str, Any]]] | None:
        """One dict for every rank, or a list of one per rank (harness.measure.roofline checks what it gets)."""
        return getattr(self.module, "traffic", None)

    @property
    def source_sha256(self) -> str:
        """Hash of everything that defines the reference and its inputs (cache keys use it)."""
        digest = hashlib.sha256(self.path.read_bytes())
        if self.spec.startswith("pkb:"):  # a ParallelKernelBench checkout's inputs come from its own generator
            generator = Path(self.spec[4:].split("::", 1)[0]) / "utils" / "input_output_tensors.py"
            if generator.exists():
                digest.update(generator.read_bytes())
            # a precision other than PKB's default (checkout.spec_for): other inputs, other reference outputs
            digest.update("::".join(self.spec.split("::")[2:]).encode())
        return digest.hexdigest()

    def shape(self, name: str) -> dict[str, Any]:
        """A named shape, or "held-out:V", the held-out counterpart of visible shape V."""
        if name.startswith(HELD_OUT_PREFIX) and name[len(HELD_OUT_PREFIX):] in self.held_out:
            return self.held_out[name[len(HELD_OUT_PREFIX):]]
        if name not in self.shapes:
            raise KeyError(f"problem {self.name!r} has no shape {name!r}; it has: {', '.join(self.shapes)}")
        return self.shapes[name]

    def held_out_shapes(self, visible: str) -> list[str]:
        """The names of the held-out shapes that go with the visible shape `visible` (none if not declared)."""
        return [HELD_OUT_PREFIX + visible] if visible in self.held_out else []

    def supports(self, world_size: int) -> bool:
        return world_size in self.world_sizes

    def reference_signature(self) -> inspect.Signature:
        return inspect.signature(self.solution)


def import_file(path: Path, module_name: str) -> ModuleType:
    """Import a Python file under a unique module name (so two files named alike never collide)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def module_name_for(path: Path, prefix: str) -> str:
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    return f"{prefix}_{path.stem}_{digest}"


def load_problem(path: str | Path) -> Problem:
    """Import `path` and check it against the contract; raise MalformedProblem naming what is wrong."""
    path = Path(path).resolve()
    try:
        module = import_file(path, module_name_for(path, "pkb_problem"))
    except Exception as exc:  # a broken problem file must name itself, not crash the caller
        raise MalformedProblem(f"{path}: cannot import: {type(exc).__name__}: {exc}") from exc
    return problem_from_module(module, path)


def _fail(path: Path, what: str) -> MalformedProblem:
    return MalformedProblem(f"{path}: {what}")


def problem_from_module(module: ModuleType, path: Path) -> Problem:
    meta = getattr(module, "PROBLEM", None)
    if not isinstance(meta, dict):
        raise _fail(path, "missing PROBLEM (a dict of metadata)")
    for key in REQUIRED_KEYS:
        if key not in meta:
            raise _fail(path, f"PROBLEM is missing {key!r}")
    for fn in REQUIRED_FUNCTIONS:
        if not callable(getattr(module, fn, None)):
            raise _fail(path, f"missing function {fn}()")

    name, category = meta["name"], meta["category"]
    if name != path.stem:
        raise _fail(path, f"PROBLEM['name'] is {name!r} but the file is named {path.stem!r}")
    if category not in CATEGORIES:
        raise _fail(path, f"unknown category {category!r}; expected one of {', '.join(CATEGORIES)}")
    if path.parent.name != category:
        raise _fail(path, f"category {category!r} but the file lives in folder {path.parent.name!r}")

    source = meta["source"]
    if not isinstance(source, dict):
        raise _fail(path, "PROBLEM['source'] must be a dict with codebase, path and symbol")
    for key in REQUIRED_SOURCE_KEYS:
        if not str(source.get(key, "")).strip():
            raise _fail(path, f"PROBLEM['source'] is missing {key!r}")
    if not str(meta["summary"]).strip():
        raise _fail(path, "PROBLEM['summary'] is empty")

    dtype = getattr(torch, str(meta["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise _fail(path, f"PROBLEM['dtype'] {meta['dtype']!r} is not a torch dtype")

    shapes = meta["shapes"]
    if not isinstance(shapes, dict):
        raise _fail(path, "PROBLEM['shapes'] must be a dict of named shape dicts")
    for key in REQUIRED_SHAPES:
        if key not in shapes:
            raise _fail(path, f"PROBLEM['shapes'] is missing the {key!r} shape")
    for key, value in shapes.items():
        if not isinstance(value, dict):
            raise _fail(path, f"shape {key!r} must be a dict")

    world_sizes = meta["world_sizes"]
    if not world_sizes or not all(isinstance(w, int) and w >= 1 for w in world_sizes):
        raise _fail(path, "PROBLEM['world_sizes'] must be a non-empty list of positive ints")

    tol = meta["tolerance"]
    if not isinstance(tol, dict) or "atol" not in tol or "rtol" not in tol:
        raise _fail(path, "PROBLEM['tolerance'] must be a dict with atol and rtol")

    held_out = meta.get("held_out", {})
    if not isinstance(held_out, dict):
        raise _fail(path, "PROBLEM['held_out'] must map visible shape names to shape dicts")
    for visible, dims in held_out.items():
        if visible not in shapes:
            raise _fail(path, f"PROBLEM['held_out'] names {visible!r}, which is not one of the shapes")
        if not isinstance(dims, dict) or set(dims) != set(shapes[visible]):
            raise _fail(path, f"the held-out shape of {visible!r} must have exactly its keys: "
                              f"{sorted(shapes[visible])}")
        if dims == shapes[visible]:
            raise _fail(path, f"the held-out shape of {visible!r} equals it; it must differ in size")

    params = list(inspect.signature(module.make_inputs).parameters)
    if len(params) != 5:
        raise _fail(path, "make_inputs must take (shape, rank, world_size, generator, device)")

    return Problem(
        name=name,
        category=category,
        source={k: str(v) for k, v in source.items()},
        summary=str(meta["summary"]).strip(),
        dtype=dtype,
        shapes={k: dict(v) for k, v in shapes.items()},
        world_sizes=tuple(sorted(world_sizes)),
        atol=float(tol["atol"]),
        rtol=float(tol["rtol"]),
        path=path,
        module=module,
        held_out={k: dict(v) for k, v in held_out.items()},
    )
