"""ParallelKernelBench (PKB) compatibility: load a PKB checkout by path and its solution sets.

Nothing of PKB is vendored. A checkout holds reference/<id>_<name>.py (each defines only
`solution(*args)`) and utils/input_output_tensors.py, whose create_input_tensor(rank, world_size,
problem_id, base_shape, dtype, trial=..., device=...) returns the tuple unpacked into solution(*x).
Each reference becomes a harness.problem.Problem with origin "pkb" and loader spec
"pkb:<absolute checkout path>::<reference file name>", which the rank worker resolves through
harness.problem.load_problem_spec -> load_pkb_problem_spec. PKB problems have no oracle: validating
one checks that the reference runs and agrees with itself, nothing more, and says so.

Inputs. Trial numbers are derived from the harness's per-trial generator seed, so trials differ where
PKB's generator honours `trial`. Where it does not (PKB's collective problems fill constant tensors),
exact fills are re-drawn per trial and every other constant is left as PKB made it, with the problem
flagged (harness.pkb_inputs says which and why); input_report() gives the record per shape and world size.

Solution sets are paired with references by harness.pkb_solutions (by name, never by number alone).

The part the rank worker imports (everything above validate_pkb_problems) uses only the standard
library and torch.
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

from harness.pkb_inputs import (  # noqa: F401 (re-exported: callers import them from here)
    FLAG_CONSTANT,
    FLAG_PERTURBED,
    NOISE,
    InputPlan,
    InputReport,
    Where,
    apply_plan,
    leaves,
    merge_rows,
    plan_inputs,
    redraw,
    replace,
)
from harness.problem import MalformedProblem, Problem, import_file, module_name_for
from harness.seeds import RANK_STRIDE

if TYPE_CHECKING:  # parent side only
    from collections.abc import Callable, Sequence

    from harness.validate import Validation

CODEBASE = "ParallelKernelBench"
SPEC_PREFIX = "pkb:"
SPEC_SEPARATOR = "::"
INPUTS_FILE = Path("utils") / "input_output_tensors.py"
REFERENCE_RE = re.compile(r"^(\d+)_([A-Za-z0-9_]+)\.py$")
BACKENDS = ("cuda", "triton", "parallelkittens")
SOLUTION_RE = re.compile(r"^(\d+)_([A-Za-z0-9_]+)_(cuda|triton|parallelkittens)\.py$")
SOLUTION_SET_RE = re.compile(r"^solutions_(cuda|triton|parallelkittens)_([^_]+)_([^_]+)_([^_]+)_(.+)$")

SHAPES: dict[str, dict[str, Any]] = {"default": {"base_shape": [1024, 1024]}, "small": {"base_shape": [64, 64]}}
DEFAULT_WORLD_SIZES = (2, 4, 8)  # PKB runs 8 ranks; 2 and 4 fit smaller machines and CPU validation
DTYPE = torch.bfloat16  # PKB's default
TOLERANCE = 1e-2  # PKB's atol = rtol for bf16
TRIAL_RANGE = 1 << 16  # derived trial numbers stay small: PKB mixes them into integer seeds


class PkbError(ValueError):
    """Bad PKB input; the message is one line naming what is missing."""


class NotAPkbCheckout(PkbError):
    pass


class NoSolutions(PkbError):
    pass


# -- the checkout -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckoutStatus:
    """Whether a path is a PKB checkout; `reason` says what is missing when it is not. Truthy when ok."""

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


def is_pkb_checkout(path: str | Path) -> CheckoutStatus:
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
    status = is_pkb_checkout(path)
    if not status:
        raise NotAPkbCheckout(status.reason)
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


def spec_for(root: Path, reference: Path) -> str:
    return f"{SPEC_PREFIX}{root}{SPEC_SEPARATOR}{reference.name}"


def _problem(root: Path, problem_id: int, name: str, reference: Path) -> Problem:
    sizes, doc = _declared(reference)
    summary = doc or f"{CODEBASE} problem {problem_id} ({name}) from {root}."
    return Problem(
        name=reference.stem,
        category=guess_category(name),
        source={"codebase": CODEBASE, "path": f"reference/{reference.name}", "symbol": "solution",
                "checkout": str(root), "problem_id": str(problem_id)},
        summary=summary,
        dtype=DTYPE,
        shapes={k: dict(v) for k, v in SHAPES.items()},
        world_sizes=sizes or DEFAULT_WORLD_SIZES,
        atol=TOLERANCE,
        rtol=TOLERANCE,
        path=reference,
        module=PkbProblemModule(root, reference, problem_id),
        origin="pkb",
        spec=spec_for(root, reference),
    )


def list_pkb_problems(path: str | Path) -> list[Problem]:
    """Every reference of the checkout as a Problem (references are imported only when first used)."""
    root = _checked_root(path)
    return [_problem(root, pid, name, ref) for pid, name, ref in reference_files(root)]


@lru_cache(maxsize=8)
def _suite(root: Path) -> tuple[Problem, ...]:
    return tuple(list_pkb_problems(root))


def pkb_suite(path: str | Path) -> list[Problem]:
    """The checkout's problems for `--source pkb:PATH` (cached per checkout). Raises NotAPkbCheckout."""
    return list(_suite(_checked_root(path)))


def problem_id(problem: Problem) -> int | None:
    """PKB's numeric id of a problem from a checkout; None for this suite's own problems."""
    value = problem.source.get("problem_id") if problem.origin == "pkb" else None
    return int(value) if value is not None else None


def parse_spec(spec: str) -> tuple[Path, str]:
    if not spec.startswith(SPEC_PREFIX) or SPEC_SEPARATOR not in spec:
        raise MalformedProblem(f"{spec!r} is not a PKB problem spec (pkb:<checkout>{SPEC_SEPARATOR}<reference file>)")
    root, name = spec[len(SPEC_PREFIX):].rsplit(SPEC_SEPARATOR, 1)
    return Path(root), name


def load_pkb_problem_spec(spec: str) -> Problem:
    """The problem a loader spec names; the rank worker calls this through load_problem_spec."""
    root, file_name = parse_spec(spec)
    root = _checked_root(root)
    m = REFERENCE_RE.match(file_name)
    reference = root / "reference" / file_name
    if m is None or not reference.is_file():
        raise MalformedProblem(f"{root}: reference/{file_name} does not exist")
    ensure_importable(root)  # solutions may import the checkout's utils before anything else does
    return _problem(root, int(m.group(1)), m.group(2), reference)


def ensure_importable(root: Path) -> None:
    """Put the checkout root on sys.path and bind its `utils` package, so solutions can import it.

    The root goes at the end of sys.path (a checkout's top-level names never shadow this project's);
    `utils`, the one name PKB solutions import, is bound to the checkout's folder explicitly, replacing
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
    else:  # PKB's utils has no __init__.py: a namespace package
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


# -- inputs (what may be re-drawn: harness.pkb_inputs) -------------------------------------------------
def _redraw(t: torch.Tensor, trial_seed: int, path: Where) -> torch.Tensor:
    """A fill re-drawn for a trial (kept for callers of the older name)."""
    return redraw(t, trial_seed, path)


def trial_of(generator: torch.Generator, rank: int) -> int:
    """PKB's trial number for the harness's trial: the same on every rank, different between trials."""
    return ((generator.initial_seed() - rank) // RANK_STRIDE) % TRIAL_RANGE


class PkbProblemModule(ModuleType):
    """Stands in for a problem module: make_inputs wraps the checkout's create_input_tensor, and
    `solution` is the reference's, imported on first use. There is no oracle."""

    def __init__(self, root: Path, reference: Path, problem_id: int) -> None:
        super().__init__(module_name_for(reference, "pkb_problem"))
        self.__file__ = str(reference)
        self.checkout = root
        self.reference_path = reference
        self.problem_id = problem_id
        self.input_plans: dict[tuple, InputPlan] = {}

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
        fn = getattr(module, "create_input_tensor", None)
        if not callable(fn):
            raise MalformedProblem(f"{self.checkout / INPUTS_FILE}: defines no create_input_tensor()")
        return fn

    def draw(self, base_shape: tuple[int, ...], rank: int, world_size: int, trial: int,
             device: torch.device) -> tuple:
        """PKB's own inputs, without touching the caller's global RNG state (PKB reseeds it)."""
        devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            value = self.input_function()(rank, world_size, self.problem_id, base_shape, DTYPE,
                                          trial=trial, device=device)
        if isinstance(value, torch.Tensor):
            return (value,)
        return tuple(value)

    def make_inputs(self, shape: dict, rank: int, world_size: int, generator: torch.Generator,
                    device: torch.device) -> tuple:
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

    def input_rows(self, base_shape: tuple[int, ...], world_size: int) -> dict[int, list[tuple[str, str, str]]]:
        """InputPlan.rows() of every rank whose inputs this process drew at that shape and world size (a rank
        worker can send these back; harness.pkb_inputs.merge_rows turns them into an InputReport)."""
        return {rank: plan.rows() for (shape, w, rank, _), plan in sorted(self.input_plans.items())
                if shape == tuple(base_shape) and w == world_size}

    def input_flags(self) -> list[str]:
        """Flags for what make_inputs did in this process so far."""
        flags = set()
        for plan in self.input_plans.values():
            if plan.perturb:
                flags.add(FLAG_PERTURBED)
            if plan.constant:
                flags.add(FLAG_CONSTANT)
        return sorted(flags)


# -- solution sets ----------------------------------------------------------------------------------
def solutions_for(directory: str | Path) -> dict[int, list[Path]]:
    """PKB solution files <id>_<name>_<backend>.py of a directory, by problem id (sorted paths)."""
    d = Path(directory)
    if not d.is_dir():
        raise NoSolutions(f"{d}: no such solutions directory")
    found: dict[int, list[Path]] = {}
    for path in sorted(d.iterdir()):
        m = SOLUTION_RE.match(path.name)
        if m and path.is_file():
            found.setdefault(int(m.group(1)), []).append(path)
    if not found:
        raise NoSolutions(f"{d} holds no PKB solution file (<id>_<name>_<backend>.py with backend "
                          f"{', '.join(BACKENDS)})")
    return found


def solutions_of(problem: Problem, found: dict[int, list[Path]]) -> list[Path]:
    """The files of `found` (from solutions_for) named <id>_<name>_<backend>.py with the reference's own
    stem. The id alone never pairs a file with a problem (recorded sets use older numberings); to pair a
    whole set by name, known renames and signature, with a reason for every file, use
    harness.pkb_solutions.match_solution_set."""
    pid = problem_id(problem)
    if pid is None:
        return []
    return [p for p in found.get(pid, []) if SOLUTION_RE.match(p.name) and p.name.rsplit("_", 1)[0] == problem.name]


def solution_set_info(directory: str | Path) -> dict[str, str] | None:
    """Backend, precision, hardware, provider and model from a set named solutions_<b>_<p>_<h>_<prov>_<model>."""
    m = SOLUTION_SET_RE.match(Path(directory).name)
    if m is None:
        return None
    return dict(zip(("backend", "precision", "hardware", "provider", "model"), m.groups()))


# -- parent side: what happens to the inputs, and validation ----------------------------------------
MAX_PROBE_BYTES = 1 << 30  # a rank's inputs larger than this are not drawn in the harness's own process
PROBE_TIMEOUT_S = 300.0


def _tensor_bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for _, t in leaves(value)
               if isinstance(t, torch.Tensor) and t.layout == torch.strided)


def draw_plans(problem: Problem, shape: str, world_size: int, seed: int = 0, max_bytes: int = MAX_PROBE_BYTES,
               ranks: Sequence[int] | None = None) -> dict[int, list[tuple[str, str, str]]]:
    """Each rank's InputPlan.rows() for one shape and world size, drawn in this process on the CPU.

    Where PKB's generator builds process groups, a process group must already exist in this process (the
    probe child starts a fake one). A rank whose inputs exceed `max_bytes` (sized first on the meta
    device, which allocates nothing) is not drawn: ValueError says how large they are.
    """
    from harness.seeds import rank_seed

    module = problem.module
    assert isinstance(module, PkbProblemModule)
    base_shape = tuple(int(d) for d in problem.shape(shape)["base_shape"])
    rows: dict[int, list[tuple[str, str, str]]] = {}
    for rank in (range(world_size) if ranks is None else ranks):
        try:
            size = _tensor_bytes(module.draw(base_shape, rank, world_size, 0, torch.device("meta")))
        except Exception:  # generators that read values (.item()) cannot run on meta: size unknown, draw
            size = 0
        if size > max_bytes:
            raise ValueError(f"rank {rank}'s inputs take {size / 2**30:.1f} GiB at shape {shape!r} "
                             f"(base_shape {list(base_shape)}), more than the {max_bytes / 2**30:.1f} GiB the "
                             "harness draws in its own process: not examined")
        gen = torch.Generator()
        gen.manual_seed(rank_seed(seed, 0, rank))
        problem.make_inputs(problem.shape(shape), rank, world_size, gen, torch.device("cpu"))
        rows[rank] = module.input_plans[(base_shape, world_size, rank, "cpu")].rows()
    return rows


@lru_cache(maxsize=256)
def _report(spec: str, sha256: str, shape: str, world_size: int, seed: int) -> InputReport:
    """Drawn here when PKB's generator needs no process group, else in a child with a fake one."""
    problem = load_pkb_problem_spec(spec)
    try:
        return merge_rows(problem.name, shape, world_size, draw_plans(problem, shape, world_size, seed))
    except ValueError as err:
        if "not examined" in str(err):
            return InputReport(problem.name, shape, world_size, (), str(err))
        first = f"{type(err).__name__}: {err}"
    except Exception as err:  # most often: the generator builds process groups
        first = f"{type(err).__name__}: {err}"
    return _report_in_child(problem, shape, world_size, seed, first)


def _report_in_child(problem: Problem, shape: str, world_size: int, seed: int, first: str) -> InputReport:
    import json
    import os
    import subprocess

    command = [sys.executable, "-m", "harness.pkb_input_probe", problem.loader_spec, shape, str(world_size),
               str(seed)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    try:
        proc = subprocess.run(command, cwd=str(Path(__file__).resolve().parent.parent), env=env,
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return InputReport(problem.name, shape, world_size, (),
                           f"inputs could not be examined: drawing them took over {PROBE_TIMEOUT_S:.0f} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return InputReport(problem.name, shape, world_size, (),
                           f"inputs could not be examined ({first}; with a fake process group: {tail})")
    data = json.loads(lines[-1])
    rows = {int(rank): [tuple(r) for r in rs] for rank, rs in data["rows"].items()}
    return merge_rows(problem.name, shape, world_size, rows, data.get("error"))  # type: ignore[arg-type]


def input_report(problem: Problem, shape: str = "small", world_size: int | None = None,
                 seed: int = 0) -> InputReport:
    """What the harness does to a PKB problem's inputs at `shape` and `world_size`: which inputs it re-draws
    per trial and which it leaves constant, on which ranks, and why (cached per checkout state). For a
    result record: `input_report(...).as_dict()`; its `flags()` say whether anything was perturbed or left
    constant. Empty for this suite's own problems."""
    w = world_size or problem.world_sizes[0]
    if not isinstance(problem.module, PkbProblemModule):
        return InputReport(problem.name, shape, w)
    return _report(problem.loader_spec, problem.source_sha256, shape, w, seed)


def probe_inputs(problem: Problem, shape: str = "small", world_size: int | None = None, seed: int = 0) -> list[str]:
    """input_report as lines for a person (empty when nothing is perturbed or constant)."""
    return input_report(problem, shape, world_size, seed).lines()


def input_flags(problem: Problem, shape: str = "small", world_size: int | None = None) -> list[str]:
    """pkb_inputs_perturbed / pkb_inputs_constant for a result record (empty for this suite's problems)."""
    return sorted(input_report(problem, shape, world_size).flags())


def validate_pkb_problems(
    problems: Sequence[Problem],
    world_sizes: Sequence[int],
    *,
    shape: str = "small",
    trials: int = 3,
    seed: int = 0,
    timeout: float = 60.0,
    on_result: Callable[[Validation], None] | None = None,
) -> list[Validation]:
    """Validate PKB problems under gloo: they have no oracle, so each reference is judged as a candidate
    against itself by the full harness (harness.evaluate, no timing): it loads, runs on every rank, and
    agrees with itself on `trials` fresh inputs under the rules a PKB solution is held to. The message
    says so, and what happened to the inputs."""
    import time

    from harness.config import EvalConfig, Limits
    from harness.evaluate import evaluate
    from harness.validate import Validation

    results: list[Validation] = []
    for w in world_sizes:
        for problem in problems:
            if not problem.supports(w):
                continue
            started = time.perf_counter()
            notes = probe_inputs(problem, shape, w, seed)
            config = EvalConfig(trials=max(2, trials), seed=seed, skip_timing=True,
                                limits=Limits(check_s=timeout, reference_s=max(timeout, 120.0)))
            result = evaluate(problem, problem.path, world_size=w, device="cpu", shape=shape, config=config)
            if result.correct:
                rules = "; ".join(result.integrity.get("rules", {}).values())
                message = "; ".join([f"no oracle (PKB problem): the reference judged correct against itself on "
                                     f"{config.trials} trials ({rules})", *notes])
                verdict = "ok"
            else:
                assert result.failure is not None
                verdict, message = result.verdict, f"the reference against itself: {result.failure.message}"
                if result.failure.evidence:
                    message += "\n" + result.failure.evidence
            v = Validation(problem.name, problem.category, w, result.correct, verdict, message,
                           time.perf_counter() - started)
            results.append(v)
            if on_result:
                on_result(v)
    return results
