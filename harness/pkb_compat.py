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
a float tensor that is a fill (few distinct values, not all zero) is re-drawn per trial as
value * (1 + 0.25 * N(0, 1)); the noise is seeded by the trial and the tensor's own values, so tensors
that are equal across ranks stay equal (replicated parameters stay replicated) and ranks that differ
still differ. Other tensors that stay identical across trials (integers, zeros, non-fill floats whose
structure we cannot know) are left alone, and the problem is flagged as having constant inputs.

The part the rank worker imports (everything above validate_pkb_problems) uses only the standard
library and torch.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

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

FILL_MAX_DISTINCT = 64  # a float tensor with at most this many distinct values is a fill
NOISE = 0.25  # relative spread of a re-drawn fill
FLAG_PERTURBED = "pkb_inputs_perturbed"
FLAG_CONSTANT = "pkb_inputs_constant"


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


# -- inputs -----------------------------------------------------------------------------------------
Where = tuple[int, ...]  # where a tensor sits in the input tuple: (argument index, item index, ...)


@dataclass
class InputPlan:
    """What make_inputs does to one rank's PKB inputs, decided once per shape, world size and rank."""

    perturb: list[Where] = field(default_factory=list)
    constant: list[tuple[Where, str]] = field(default_factory=list)  # identical across trials, left alone

    def notes(self) -> list[str]:
        out = [f"input {_where(p)} is a fill identical across trials in PKB: re-drawn per trial" for p in self.perturb]
        out += [f"input {_where(p)} stays identical across trials ({why}): cannot perturb it safely"
                for p, why in self.constant]
        return out


def _where(path: Where) -> str:
    return "#" + "".join(f"[{i}]" if n else str(i) for n, i in enumerate(path))


def _leaves(value: Any, path: Where = ()) -> list[tuple[Where, Any]]:
    if isinstance(value, (tuple, list)):
        out: list[tuple[Where, Any]] = []
        for i, v in enumerate(value):
            out.extend(_leaves(v, (*path, i)))
        return out
    return [(path, value)]


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8),
                       b.detach().contiguous().reshape(-1).view(torch.uint8))


def plan_inputs(first: tuple, second: tuple) -> InputPlan:
    """Compare two trials' PKB inputs and decide which tensors to re-draw per trial."""
    plan = InputPlan()
    other = dict(_leaves(second))
    for path, t in _leaves(first):
        u = other.get(path)
        if not isinstance(t, torch.Tensor) or not isinstance(u, torch.Tensor) or t.numel() < 2:
            continue
        if t.layout != torch.strided or u.layout != torch.strided:
            continue  # sparse and other layouts: passed through as PKB made them
        if not _same_bytes(t, u):
            continue  # PKB already draws this one per trial
        if not t.is_floating_point():
            plan.constant.append((path, f"{str(t.dtype).replace('torch.', '')} tensor"))
        elif isinstance(t, torch.nn.Parameter) or t.requires_grad:
            plan.constant.append((path, "a tensor that requires grad"))
        elif not bool(t.detach().ne(0).any()):
            plan.constant.append((path, "all zeros, likely a buffer"))
        elif t.detach().float().unique().numel() > FILL_MAX_DISTINCT:
            plan.constant.append((path, "a float tensor that is not a fill, of unknown structure"))
        else:
            plan.perturb.append(path)
    return plan


def _redraw(t: torch.Tensor, trial_seed: int, path: Where) -> torch.Tensor:
    """value * (1 + NOISE * N(0, 1)), seeded by the trial, the position and the tensor's own values."""
    values = t.detach().float().unique().tolist()
    key = f"{trial_seed}|{path}|{tuple(t.shape)}|{t.dtype}|{values}"
    gen = torch.Generator(device=t.device)
    gen.manual_seed(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 1)
    noise = torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32)
    out = torch.empty_like(t)
    out.copy_(t.detach().float() * (1.0 + NOISE * noise))
    return out


def _replace(value: Any, path: Where, new: Any) -> Any:
    if not path:
        return new
    items = list(value)
    items[path[0]] = _replace(items[path[0]], path[1:], new)
    return tuple(items) if isinstance(value, tuple) else items


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
        trial_seed = generator.initial_seed() - rank
        for path in plan.perturb:
            leaf = dict(_leaves(inputs))[path]
            inputs = _replace(inputs, path, _redraw(leaf, trial_seed, path))
        return inputs

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
    """The files of `found` (from solutions_for) that solve `problem`: <id>_<name>_<backend>.py with the
    reference's own <id>_<name>; by id alone when none carries the name (two references may share an id)."""
    pid = problem_id(problem)
    if pid is None:
        return []
    candidates = found.get(pid, [])
    named = [p for p in candidates if SOLUTION_RE.match(p.name) and p.name.rsplit("_", 1)[0] == problem.name]
    return named or candidates


def solution_set_info(directory: str | Path) -> dict[str, str] | None:
    """Backend, precision, hardware, provider and model from a set named solutions_<b>_<p>_<h>_<prov>_<model>."""
    m = SOLUTION_SET_RE.match(Path(directory).name)
    if m is None:
        return None
    return dict(zip(("backend", "precision", "hardware", "provider", "model"), m.groups()))


# -- parent side: what happens to the inputs, and validation ----------------------------------------
def probe_inputs(problem: Problem, shape: str = "small", world_size: int | None = None, seed: int = 0) -> list[str]:
    """Draw every rank's inputs in this process and say what was perturbed or left constant.

    Inputs that need a process group (some PKB problems build groups in create_input_tensor) cannot be
    drawn here; the answer then says so.
    """
    from harness.seeds import rank_seed

    module = problem.module
    if not isinstance(module, PkbProblemModule):
        return []
    w = world_size or problem.world_sizes[0]
    ranks_by_note: dict[str, list[int]] = {}
    try:
        for rank in range(w):
            gen = torch.Generator()
            gen.manual_seed(rank_seed(seed, 0, rank))
            problem.make_inputs(problem.shape(shape), rank, w, gen, torch.device("cpu"))
            plan = module.input_plans[(tuple(problem.shape(shape)["base_shape"]), w, rank, "cpu")]
            for note in plan.notes():
                ranks_by_note.setdefault(note, []).append(rank)
    except Exception as exc:  # anything PKB's generator raises outside a process group
        return [f"inputs could not be drawn outside a process group ({type(exc).__name__}: {exc}); "
                "whether they vary across trials is unknown"]
    return [f"{note} (rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))})" for note, r in ranks_by_note.items()]


def input_flags(problem: Problem, shape: str = "small", world_size: int | None = None) -> list[str]:
    """pkb_inputs_perturbed / pkb_inputs_constant for a result record (empty for this suite's problems)."""
    if not isinstance(problem.module, PkbProblemModule):
        return []
    probe_inputs(problem, shape, world_size)
    return problem.module.input_flags()


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
