"""A ParallelKernelBench checkout, loaded by path: its references as Problems of this harness.

Nothing of ParallelKernelBench is vendored. A checkout holds reference/<id>_<name>.py (each defines only
`solution(*args)`) and utils/input_output_tensors.py, whose create_input_tensor(rank, world_size,
problem_id, base_shape, dtype, trial=..., device=...) returns the tuple unpacked into solution(*x).
Each reference becomes a harness.problems.problem.Problem with origin "pkb" and loader spec
"pkb:<absolute checkout path>::<reference file name>", which the rank worker resolves through
harness.problems.registry.load_problem_spec -> load_spec. These problems have no oracle (harness.validate
says what validating one can and cannot show).

Inputs. Trial numbers are derived from the harness's per-trial generator seed, so trials differ where
the checkout's generator honours `trial`. Where it does not (its collective problems fill constant
tensors), exact fills are re-drawn per trial and every other constant is left as the checkout made it,
with the problem flagged (.inputs says which and why; .input_report gives the record per shape and
world size).

Worker-safe: the rank worker imports this module, so it uses only the standard library and torch.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from harness.common.seeds import RANK_STRIDE
from harness.problems.parallelkernelbench.inputs import (
    FLAG_CONSTANT,
    FLAG_PERTURBED,
    InputPlan,
    apply_plan,
    plan_inputs,
)
from harness.problems.problem import MalformedProblem, Problem, import_file, module_name_for

if TYPE_CHECKING:
    from collections.abc import Callable

CODEBASE = "ParallelKernelBench"
SPEC_PREFIX = "pkb:"
SPEC_SEPARATOR = "::"
INPUTS_FILE = Path("utils") / "input_output_tensors.py"
REFERENCE_RE = re.compile(r"^(\d+)_([A-Za-z0-9_]+)\.py$")

SHAPES: dict[str, dict[str, Any]] = {"default": {"base_shape": [1024, 1024]}, "small": {"base_shape": [64, 64]}}
# What held-out means for a PKB problem (docs/pkb.md): its inputs have one size knob, base_shape, so the
# held-out shape is another base_shape with as many elements and the other aspect ratio (and no square), which
# a kernel that assumed 1024 x 1024 (or 64 x 64) rows and columns does not pass by accident.
HELD_OUT: dict[str, dict[str, Any]] = {"default": {"base_shape": [512, 2048]}, "small": {"base_shape": [32, 128]}}
DEFAULT_WORLD_SIZES = (2, 4, 8)  # ParallelKernelBench runs 8 ranks; 2 and 4 fit smaller machines and CPU validation


@dataclass(frozen=True)
class Precision:
    """What a precision means for a checkout's problems: the dtype its inputs are drawn in, and atol = rtol."""

    dtype: torch.dtype
    tolerance: float


# PKB's precisions by the names its generated sets carry (solutions_<backend>_<precision>_...). bf16: atol = rtol =
# 1e-2, PKB's current head (run_local.py and run_together.py: --dtype bfloat16 "matching paper experiments",
# --atol/--rtol 1e-2); fp32: 1e-5, the first public commit's run_local.py (--dtype float32, --atol/--rtol 1e-5)
# and utils/compare_outputs.py (compare_tensors' atol = rtol = 1e-5).
PRECISIONS: dict[str, Precision] = {"bf16": Precision(torch.bfloat16, 1e-2), "fp32": Precision(torch.float32, 1e-5)}
DEFAULT_PRECISION = "bf16"  # PKB's published sets are bf16
TRIAL_RANGE = 1 << 16  # derived trial numbers stay small: the checkout mixes them into integer seeds


class CheckoutError(ValueError):
    """Bad ParallelKernelBench input (a checkout, a solution set); the message is one line naming what is
    missing."""


class NotACheckout(CheckoutError):
    pass


# -- the checkout -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckoutStatus:
    """Whether a path is a ParallelKernelBench checkout; `reason` says what is missing when it is not. Truthy
    when ok."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def reference_files(root: Path) -> list[tuple[int, str, Path]]:
    """(problem id, name, path) of every reference/<id>_<name>.py, by id then name."""
    ref_dir = root / "reference"
    if not ref_dir.is_dir():
        return []
    found = []
    for path in ref_dir.iterdir():
        m = REFERENCE_RE.match(path.name)
        if m and path.is_file():
            found.append((int(m.group(1)), m.group(2), path))
    return sorted(found, key=lambda t: (t[0], t[1]))


def is_checkout(path: str | Path) -> CheckoutStatus:
    root = Path(path)
    what = f"{root} is not a ParallelKernelBench checkout"
    if not root.exists():
        return CheckoutStatus(False, f"{what}: no such directory")
    if not root.is_dir():
        return CheckoutStatus(False, f"{what}: it is a file")
    if not (root / "reference").is_dir():
        return CheckoutStatus(False, f"{what}: reference/ is missing (expected reference/<id>_<name>.py files)")
    if not reference_files(root):
        return CheckoutStatus(False, f"{what}: reference/ holds no <id>_<name>.py file")
    if not (root / INPUTS_FILE).is_file():
        return CheckoutStatus(False, f"{what}: {INPUTS_FILE} (PKB's input generator) is missing")
    return CheckoutStatus(True)


def _checked_root(path: str | Path) -> Path:
    status = is_checkout(path)
    if not status:
        raise NotACheckout(status.reason)
    return Path(path).resolve()


# Whole names that are one collective; tokens that make a category obvious. First match wins.
_COLLECTIVE_NAMES = {"allreduce", "all_reduce", "allgather", "all_gather", "reducescatter", "reduce_scatter",
                     "broadcast", "reduce", "scatter", "gather", "alltoall", "all_to_all", "all2all"}
_CATEGORY_TOKENS: tuple[tuple[str, frozenset[str]], ...] = (
    ("expert", frozenset({"moe", "expert", "experts", "ep"})),
    ("fsdp_zero", frozenset({"fsdp", "zero", "zero1", "zero2", "zero3"})),
    ("rl_vocab", frozenset({"vocab"})),
    ("context", frozenset({"ring", "cp", "context"})),
    ("sequence", frozenset({"ulysses", "sequence", "sp"})),
    ("pipeline", frozenset({"pipeline", "pp"})),
    ("data", frozenset({"ddp", "dp"})),
    ("tensor", frozenset({"tp", "gemm", "gemv", "matmul", "rmsnorm", "rms", "layernorm", "embedding", "rope"})),
)


def guess_category(name: str) -> str:
    """A category of this suite when the name makes it obvious (all_reduce, moe_*, fsdp_*...), else 'other'."""
    lowered = name.lower()
    if lowered in _COLLECTIVE_NAMES:
        return "collective"
    tokens = set(lowered.split("_"))
    for category, words in _CATEGORY_TOKENS:
        if tokens & words:
            return category
    return "other"


def _declared(reference: Path) -> tuple[tuple[int, ...] | None, str]:
    """(WORLD_SIZES if the file declares them, the module docstring) without importing the file."""
    try:
        tree = ast.parse(reference.read_text(errors="replace"))
    except SyntaxError:
        return None, ""
    sizes = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "WORLD_SIZES"
                                                for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if isinstance(value, (list, tuple)) and value and all(isinstance(w, int) and w >= 1 for w in value):
                sizes = tuple(sorted(set(value)))
    return sizes, (ast.get_docstring(tree) or "").strip()


def precision(name: str) -> Precision:
    """A precision by name; CheckoutError naming the ones there are."""
    if name not in PRECISIONS:
        raise CheckoutError(f"unknown precision {name!r}: use {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


def spec_for(root: Path, reference: Path, precision_name: str = DEFAULT_PRECISION) -> str:
    """The loader spec: pkb:<root>::<reference file>, and ::<precision> when it is not the default (so every
    process that loads the problem draws its inputs in that dtype, and caches keyed by the problem tell them apart)."""
    suffix = "" if precision_name == DEFAULT_PRECISION else f"{SPEC_SEPARATOR}{precision_name}"
    return f"{SPEC_PREFIX}{root}{SPEC_SEPARATOR}{reference.name}{suffix}"


def _problem(root: Path, problem_id: int, name: str, reference: Path,
             precision_name: str = DEFAULT_PRECISION) -> Problem:
    chosen = precision(precision_name)
    sizes, doc = _declared(reference)
    summary = doc or f"{CODEBASE} problem {problem_id} ({name}) from {root}."
    return Problem(
        name=reference.stem,
        category=guess_category(name),
        source={"codebase": CODEBASE, "path": f"reference/{reference.name}", "symbol": "solution",
                "checkout": str(root), "problem_id": str(problem_id)},
        summary=summary,
        dtype=chosen.dtype,
        shapes={k: dict(v) for k, v in SHAPES.items()},
        held_out={k: dict(v) for k, v in HELD_OUT.items()},
        world_sizes=sizes or DEFAULT_WORLD_SIZES,
        atol=chosen.tolerance,
        rtol=chosen.tolerance,
        path=reference,
        module=ReferenceModule(root, reference, problem_id, chosen.dtype),
        origin="pkb",
        spec=spec_for(root, reference, precision_name),
    )


def list_problems(path: str | Path, precision_name: str = DEFAULT_PRECISION) -> list[Problem]:
    """Every reference of the checkout as a Problem in that precision (references are imported only when first
    used)."""
    root = _checked_root(path)
    precision(precision_name)
    return [_problem(root, pid, name, ref, precision_name) for pid, name, ref in reference_files(root)]


@lru_cache(maxsize=8)
def _suite(root: Path, precision_name: str) -> tuple[Problem, ...]:
    return tuple(list_problems(root, precision_name))


def suite(path: str | Path, precision_name: str = DEFAULT_PRECISION) -> list[Problem]:
    """The checkout's problems for `--source pkb:PATH` (cached per checkout and precision). Raises NotACheckout,
    or CheckoutError for an unknown precision."""
    return list(_suite(_checked_root(path), precision_name))


def problem_id(problem: Problem) -> int | None:
    """ParallelKernelBench's numeric id of a problem from a checkout; None for this suite's own problems."""
    value = problem.source.get("problem_id") if problem.origin == "pkb" else None
    return int(value) if value is not None else None


def _split_spec(spec: str) -> tuple[Path, str, str]:
    """(checkout root, reference file name, precision name) of a loader spec (spec_for)."""
    if not spec.startswith(SPEC_PREFIX) or SPEC_SEPARATOR not in spec:
        raise MalformedProblem(f"{spec!r} is not a PKB problem spec (pkb:<checkout>{SPEC_SEPARATOR}<reference file>)")
    head, last = spec[len(SPEC_PREFIX):].rsplit(SPEC_SEPARATOR, 1)
    if last in PRECISIONS and SPEC_SEPARATOR in head:
        root, name = head.rsplit(SPEC_SEPARATOR, 1)
        return Path(root), name, last
    return Path(head), last, DEFAULT_PRECISION


def parse_spec(spec: str) -> tuple[Path, str]:
    root, name, _ = _split_spec(spec)
    return root, name


def load_spec(spec: str) -> Problem:
    """The problem a loader spec names; the rank worker calls this through load_problem_spec."""
    root, file_name, precision_name = _split_spec(spec)
    root = _checked_root(root)
    m = REFERENCE_RE.match(file_name)
    reference = root / "reference" / file_name
    if m is None or not reference.is_file():
        raise MalformedProblem(f"{root}: reference/{file_name} does not exist")
    ensure_importable(root)  # solutions may import the checkout's utils before anything else does
    return _problem(root, int(m.group(1)), m.group(2), reference, precision_name)


def ensure_importable(root: Path) -> None:
    """Put the checkout root on sys.path and bind its `utils` package, so solutions can import it.

    The root goes at the end of sys.path (a checkout's top-level names never shadow this project's);
    `utils`, the one name the checkout's solutions import, is bound to the checkout's folder explicitly, replacing
    any other `utils` already imported.
    """
    if str(root) not in sys.path:
        sys.path.append(str(root))
    utils_dir = root / "utils"
    loaded = sys.modules.get("utils")
    if loaded is not None and [str(p) for p in getattr(loaded, "__path__", [])] == [str(utils_dir)]:
        return
    for name in [n for n in sys.modules if n == "utils" or n.startswith("utils.")]:
        del sys.modules[name]
    init = utils_dir / "__init__.py"
    if init.is_file():
        spec = importlib.util.spec_from_file_location("utils", init, submodule_search_locations=[str(utils_dir)])
    else:  # the checkout's utils has no __init__.py: a namespace package
        spec = importlib.machinery.ModuleSpec("utils", None, is_package=True)
        spec.submodule_search_locations = [str(utils_dir)]
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["utils"] = module
    try:
        if spec.loader is not None:
            spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["utils"]
        raise


# -- inputs (what may be re-drawn: .inputs) -----------------------------------------------------------
def trial_of(generator: torch.Generator, rank: int) -> int:
    """The checkout's trial number for the harness's trial: the same on every rank, different between trials."""
    return ((generator.initial_seed() - rank) // RANK_STRIDE) % TRIAL_RANGE


class ReferenceModule(ModuleType):
    """Stands in for a problem module: make_inputs wraps the checkout's create_input_tensor, and
    `solution` is the reference's, imported on first use. There is no oracle."""

    def __init__(self, root: Path, reference: Path, problem_id: int, dtype: torch.dtype) -> None:
        super().__init__(module_name_for(reference, "pkb_problem"))
        self.__file__ = str(reference)
        self.checkout = root
        self.reference_path = reference
        self.problem_id = problem_id
        self.dtype = dtype  # what create_input_tensor is asked for (the run's precision)
        # (base shape, world size, rank, device type) -> the plan made at the first draw
        self.input_plans: dict[tuple[tuple[int, ...], int, int, str], InputPlan] = {}

    def __getattr__(self, name: str) -> Any:  # only reached for attributes not set yet
        if name == "solution":
            module = self.reference_module()
            self.solution = module.solution
            return module.solution
        raise AttributeError(f"PKB problem module {self.__name__!r} has no attribute {name!r}")

    def reference_module(self) -> ModuleType:
        ensure_importable(self.checkout)
        module = import_file(self.reference_path, module_name_for(self.reference_path, "pkb_reference"))
        if not callable(getattr(module, "solution", None)):
            raise MalformedProblem(f"{self.reference_path}: defines no solution()")
        return module

    def input_function(self) -> Callable[..., Any]:
        ensure_importable(self.checkout)
        module = importlib.import_module("utils.input_output_tensors")
        fn: object = getattr(module, "create_input_tensor", None)
        if not callable(fn):
            raise MalformedProblem(f"{self.checkout / INPUTS_FILE}: defines no create_input_tensor()")
        return fn

    def draw(self, base_shape: tuple[int, ...], rank: int, world_size: int, trial: int,
             device: torch.device) -> tuple[Any, ...]:
        """The checkout's own inputs, without touching the caller's global RNG state (its generator reseeds it)."""
        devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            value = self.input_function()(rank, world_size, self.problem_id, base_shape, self.dtype,
                                          trial=trial, device=device)
        if isinstance(value, torch.Tensor):
            return (value,)
        return tuple(value)

    def make_inputs(self, shape: dict[str, Any], rank: int, world_size: int, generator: torch.Generator,
                    device: torch.device) -> tuple[Any, ...]:
        device = torch.device(device)
        base_shape = tuple(int(d) for d in shape["base_shape"])
        trial = trial_of(generator, rank)
        inputs = self.draw(base_shape, rank, world_size, trial, device)
        key = (base_shape, world_size, rank, device.type)
        plan = self.input_plans.get(key)
        if plan is None:
            other = self.draw(base_shape, rank, world_size, (trial + 1) % TRIAL_RANGE, device)
            plan = self.input_plans[key] = plan_inputs(inputs, other)
        return apply_plan(inputs, plan, generator.initial_seed() - rank)

    def input_flags(self) -> list[str]:
        """Flags for what make_inputs did in this process so far."""
        flags = set()
        for plan in self.input_plans.values():
            if plan.perturb:
                flags.add(FLAG_PERTURBED)
            if plan.constant:
                flags.add(FLAG_CONSTANT)
        return sorted(flags)
