"""Integrity settings and the constants both sides of the trust boundary share. Plain data (torch only for the
precision probe's inputs, imported where they are made).

What the checks are, and which side runs them:
- the judge (harness.judge, a process that never imports candidate code) decides every verdict and
  every flag that can clear a candidate: it compares outputs the ranks hand over as files with the
  reference's, produced by a pool that never loaded a candidate; it reconciles the times ranks claim
  with its own clock; it counts traffic between sandboxed ranks from outside;
- the candidate's rank (harness.rank) only produces data, inside a sandbox (harness.launch.sandbox); its
  tripwires (harness.rank.tripwires) can report against it, never for it.

tests/exploits/README.md says what each measure does and does not stop.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from harness.common.flags import (  # the flags' names, re-exported (harness.common.flags has no torch)
    IMPOSSIBLE,
    INPUT_CACHING,
    LAZY_OUTPUT,
    MUTATES_INPUTS,
    OUTPUT_REUSED,
    RACE,
    REDUCED_PRECISION,
    SPAWNED_THREADS,
    SPEEDUP_DISQUALIFIERS,
    STALE_OUTPUT,
    TAMPERING,
    TIMED_OUTPUT_WRONG,
    TIMING_IMPLAUSIBLE,
    TIMING_INCONSISTENT,
    UNSYNCHRONIZED_WORK,
    USES_TORCH_COLLECTIVES,
)

if TYPE_CHECKING:
    import torch

# The public names, the re-exported flags included (with no implicit re-export, a type checker needs them
# listed to let `from harness.common.integrity import TAMPERING` through).
__all__ = [
    "FRESH_TRIAL_OFFSET", "IMPOSSIBLE", "INPUT_CACHING", "IntegrityConfig", "LAZY_OUTPUT", "MUTATES_INPUTS",
    "OUTPUT_REUSED", "PROBE_TRIAL", "RACE", "REDUCED_PRECISION", "SPAWNED_THREADS", "SPEEDUP_DISQUALIFIERS",
    "STALE_OUTPUT", "STRESS_TRIAL_BASE", "TAMPERING", "TIMED_OUTPUT_WRONG", "TIMING_IMPLAUSIBLE", "TIMING_INCONSISTENT",
    "UNSYNCHRONIZED_WORK", "USES_TORCH_COLLECTIVES", "mixed_seed", "precision_probe_inputs", "probe_seed",
]

# Trial numbers of the extra correctness trials: far from the T ordinary ones and from timing's sets.
STRESS_TRIAL_BASE = 500_000
PROBE_TRIAL = 600_000
FRESH_TRIAL_OFFSET = 500_000  # added to timing's trial base for the never-seen (fresh) input sets


def _knob(default: Any, doc: str, **bounds: float) -> Any:
    """A field of IntegrityConfig: its default, what it does, and the bounds a setting must respect (ge, gt,
    le), which harness.config.IntegrityChecks enforces on what a user gives."""
    return field(default=default, metadata={"doc": doc, "bounds": bounds})


@dataclass
class IntegrityConfig:
    """Knobs of the integrity checks, defined once: `for_device` gives the defaults, and
    harness.config.IntegrityChecks (the typed settings of EvalConfig) is made from these fields. Plain data:
    it travels to the ranks, which cannot import pydantic."""

    stress_trials: int = _knob(2, "correctness trials with one rank late (stress trial i delays rank i % W)", ge=0)
    stress_delay_s: float = _knob(0.05, "how late the late rank starts: host sleep on CPU, device spin on GPU", ge=0)
    jitter_s: float = _knob(0.005, "random start delay of every rank in every call, so stress calls do not stand "
                                   "out", ge=0)
    precision_probe: bool = _knob(True, "a trial whose inputs make reduced precision exceed the tolerance")
    lazy_delay_s: float = _knob(0.05, "pause before re-reading an output, to see whether it still changes", ge=0)
    fresh_iters: int = _knob(5, "timed calls on never-seen inputs, compared with the rotated-input median (input "
                                "caching)", ge=0)
    timed_checks: int = _knob(22, "calls of the timing phase whose outputs are judged, drawn at random among all of "
                                   "them (warm-up, timed, host-timed, fresh) from the evaluation's secret; a rank "
                                   "learns it after the call. 22: a candidate wrong on 20% of its calls is caught "
                                   "with probability >= 1 - 0.8^22 = 0.993 (docs/harness.md)", ge=0)
    timed_probes: int = _knob(2, "precision-probe calls placed at random among the timed calls (always judged, never "
                                 "counted): reduced precision only where a call looks timed", ge=0)
    timed_check_elements: int = _knob(1 << 20, "a judged timed output tensor larger than this is compared at this many "
                                               "positions drawn at random by the judge (every element in the "
                                               "correctness phase)", ge=1)
    timed_check_bytes: int = _knob(4 << 30, "at most this many bytes of expected outputs (all ranks) judged in timing: "
                                            "very large outputs judge fewer calls (the record states the detection "
                                            "probability that leaves)", ge=0)
    busy_bytes: int = _knob(256 << 20, "GPU: low-priority work kept running around every checked call", ge=4)
    guard: bool = _knob(True, "the rank's tripwire: harness and runtime callables verified after every request")
    # 3 on CPU: with three evaluations at once on 2 cores, honest calls on never-seen buffers took up to 3x
    # their neighbours (10.2 ms against 3.3); in the median over five pairs, 1.5 flagged 3 of 50 honest
    # evaluations, 3 none (2026-12-02, docs/harness.md). A per-buffer memo is 20-50x. On a GPU 1.5.
    caching_ratio: float = _knob(3.0, "a call on never-seen inputs above ratio * the rotated call just before it + "
                                         "margin, in the median over such pairs, reads as input caching", ge=1.0)
    caching_margin_ms: float = _knob(0.5, "the margin of caching_ratio: at least this (the noise floor) ...", ge=0)
    caching_margin_work: float = _knob(0.25, "... or this share of the reference's measured median per call, whichever "
                                            "is larger: a margin that grows with the work", ge=0)
    impossible_slack: float = _knob(0.9, "median below slack * roofline bound reads as impossible", gt=0, le=1.0)
    reconcile: bool = _knob(True, "claimed times checked against the harness's own clock")
    unexplained_ratio: float = _knob(1.0, "per-iteration time the claims leave unexplained, beyond the reference's, "
                                          "above max(margin, ratio * claimed median) is timing_inconsistent", ge=0)
    # The floor on CPU: a candidate pool and the reference pool are timed apart, and on a loaded 2-core
    # machine the scheduler alone puts milliseconds between them (docs/harness.md has the measurements).
    unexplained_margin_ms: float = _knob(5.0, "the margin of unexplained_ratio: at least this (the noise floor) ...",
                                         ge=0)
    unexplained_work_ratio: float = _knob(0.5, "... or this share of the reference's measured median per call, "
                                               "whichever is largest", ge=0)
    # The sandbox's resource limits (harness.launch.sandbox.limits), per rank: a sandbox holds the W ranks of one
    # evaluation and gets W times each. Going over is the candidate's runtime_error, naming the limit.
    # Memory: the largest need known is PKB's 68 and 77 at their base shapes (13-16 GiB a rank,
    # docs/measurements/pkb-runs.md);
    # this project's largest input is 1 GiB a rank (all_reduce's `1gib` shape), and the CPU kernels' shared
    # mappings in /dev/shm take 2 W times a rank's input. 32 GiB a rank leaves twice the largest need.
    rank_memory_bytes: int = _knob(32 << 30, "host memory per rank: the sandbox's processes together, its "
                                             "/dev/shm and /tmp included, get W times this (device memory is "
                                             "not limited)", ge=256 << 20)
    rank_shm_bytes: int = _knob(8 << 30, "size of the sandbox's /dev/shm per rank (the CPU kernels map their "
                                         "exchange buffers there: 2 W times a rank's input)", ge=1 << 20)
    rank_tmp_bytes: int = _knob(1 << 30, "size of the sandbox's /tmp per rank (TMPDIR points into the scratch)",
                                ge=1 << 20)
    rank_scratch_bytes: int = _knob(32 << 30, "bytes the sandbox's scratch and extension folders may hold per "
                                              "rank, the inputs the harness copies in included", ge=64 << 20)
    rank_scratch_files: int = _knob(50_000, "files and folders the sandbox's scratch and extension folders may "
                                            "hold per rank", ge=100)
    # A reference timing is a denominator every later evaluation of the problem reuses: one taken while the
    # machine was busy (a CV of 116% on a loaded 2-core CPU, 2026-12-01; the same candidate then read 5.45x
    # against it and 0.88x against a fresh one) must not be cached. CPU timings only prove the plumbing and
    # scatter widely; CUDA events of a collective that holds still stay within a few percent.
    reference_cv_max: float = _knob(0.5, "a reference timing is cached only when its CV is at most this; above "
                                         "it the reference is timed again", gt=0)
    reference_attempts: int = _knob(3, "timings of the reference at most, until one is stable (the steadiest is "
                                       "used, and cached only if stable)", ge=1)

    @classmethod
    def for_device(cls, device: str) -> IntegrityConfig:
        if device == "cuda":
            # busy: ~1 ms of short low-priority blocks around a checked call (fill + multiply, 4 TB/s).
            return cls(stress_delay_s=0.002, jitter_s=0.0002, lazy_delay_s=0.01, caching_ratio=1.5,
                       caching_margin_ms=0.005,
                       busy_bytes=1 << 30, unexplained_margin_ms=0.03, reference_cv_max=0.1)
        return cls()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> IntegrityConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})

    @classmethod
    def coerce(cls, value: Any, device: str) -> IntegrityConfig:
        """Accept an IntegrityConfig, a dict or a pydantic model with the same fields, or None."""
        if value is None:
            return cls.for_device(device)
        if isinstance(value, cls):
            return value
        if hasattr(value, "model_dump"):
            value = value.model_dump(exclude_none=True)
        return cls.from_dict({**cls.for_device(device).to_dict(), **{k: v for k, v in dict(value).items()
                                                                     if v is not None}})


def mixed_seed(seed: int, salt: int) -> int:
    """The run's seed mixed with the evaluation's secret salt: inputs cannot be predicted from the run."""
    if not salt:
        return seed
    return int.from_bytes(hashlib.sha256(f"pkb-salt:{seed}:{salt}".encode()).digest()[:6], "little")


def probe_seed(seed: int, rank: int) -> int:
    """The generator seed of the precision probe's replacement values on `rank`."""
    return int.from_bytes(hashlib.sha256(f"pkb-probe:{seed}:{rank}".encode()).digest()[:6], "little")


# -- the precision probe ----------------------------------------------------------------------------
_MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23, "float64": 23}  # by torch dtype name


def precision_probe_inputs(inputs: tuple[Any, ...], dtype: torch.dtype,
                           generator: torch.Generator) -> tuple[Any, ...]:
    """The inputs with every tensor of the problem's dtype replaced by values whose low bits matter:
    1 + k * 2^-m (m the dtype's mantissa bits, exact in the dtype), and one element in eight scaled by
    64. An 8-bit path (fp8, or int8 with per-block scales: a block's outlier sets the step) rounds the
    small values by more than any tolerance; the dtype itself represents every one of them exactly.
    All values are positive, so sums do not cancel and a different summation order stays close."""
    # Deferred: the settings above are read without torch (harness.config, the CLI); this runs in a rank.
    import torch

    bits = _MANTISSA_BITS.get(str(dtype).removeprefix("torch."))
    if bits is None:
        return inputs

    def replace(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype == dtype and value.numel() > 0:
            steps = torch.randint(0, 1 << bits, value.shape, generator=generator, device=value.device)
            probe = 1.0 + steps.to(torch.float64) * 2.0 ** -bits
            large = torch.rand(value.shape, generator=generator, device=value.device) < 0.125
            return torch.where(large, probe * 64.0, probe).to(dtype)
        if isinstance(value, (tuple, list)):
            return type(value)(replace(v) for v in value)
        return value

    return tuple(replace(v) for v in inputs)


