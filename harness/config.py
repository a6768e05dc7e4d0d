"""Evaluation settings: trials, seeds, timing, the time limit of every phase and the integrity checks,
in one typed place."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import TYPE_CHECKING, Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from harness.common import spin
from harness.common.integrity import IntegrityConfig


class TimingConfig(BaseModel):
    warmup: int = Field(10, ge=0)
    iters: int = Field(50, ge=2)
    host_iters: int = Field(10, ge=1)
    min_input_sets: int = Field(2, ge=1)
    max_input_sets: int = Field(64, ge=1)
    input_memory_fraction: float = Field(0.25, gt=0, le=0.9)
    min_spin_us: float = spin.MIN_SPIN_US
    max_spin_us: float = spin.MAX_SPIN_US

    @classmethod
    def for_device(cls, device: str) -> TimingConfig:
        # On CPU the numbers only prove the plumbing: keep them cheap.
        return cls(warmup=2, iters=10, host_iters=3) if device == "cpu" else cls()


class Limits(BaseModel):
    """Seconds each phase may take before the whole rank group is killed."""

    compile_s: float = Field(180.0, gt=0)
    start_s: float = Field(120.0, gt=0)
    load_s: float = Field(300.0, gt=0, description="import of the candidate, including in-process builds")
    check_s: float = Field(120.0, gt=0, description="all correctness calls together; for a slow reference "
                                                    "(over a second a call) stretched to check_scale x its time")
    check_scale: float = Field(20.0, gt=0, description="how many times the reference's time the candidate's "
                                                       "correctness calls may take, where that exceeds check_s")
    build_s: float = Field(600.0, gt=0, description="a native build inside a call (one only the first call "
                                                    "reveals), timed and limited as compile, not as the call")
    time_s: float = Field(300.0, gt=0)
    grace_s: float = Field(5.0, gt=0, description="wait for the other ranks once one has failed")
    reference_s: float = Field(900.0, gt=0, description="each step of the reference pool (trials, timing "
                                                        "inputs, timing) at most; an overrun is infra_error")
    reference_call_s: float = Field(300.0, gt=0, description="the reference's first correctness trial (one call, "
                                                             "its inputs, the set-up): its measured cost sets the "
                                                             "limits of the later steps")
    reference_scale: float = Field(3.0, gt=0, description="later reference steps may take this many times the "
                                                          "first call's cost per call, plus reference_slack_s")
    reference_slack_s: float = Field(60.0, gt=0, description="added to every limit derived from the reference's "
                                                             "measured cost (machine load, a first-time import)")


class IntegrityChecksBase(BaseModel):
    """Settings of the integrity checks, made from harness.common.integrity.IntegrityConfig's fields (the one
    definition: the rank workers read that dataclass, they cannot import pydantic). A field left None takes
    the device's default (CPU and GPU differ in delays and margins); a misspelt name is an error, not a
    silently ignored setting."""

    model_config = ConfigDict(extra="forbid")

    def overrides(self) -> dict[str, Any]:
        """The settings given, for IntegrityConfig.coerce to lay over the device's defaults."""
        return self.model_dump(exclude_none=True)


def _optional_fields(knobs: type[IntegrityConfig]) -> dict[str, Any]:
    """Each knob as an optional pydantic field: None by default, its description and bounds from the metadata."""
    hints = get_type_hints(knobs)
    return {f.name: (hints[f.name] | None, Field(None, description=f.metadata["doc"], **f.metadata["bounds"]))
            for f in dataclasses.fields(knobs)}


if TYPE_CHECKING:  # the type checker sees the base; at run time the class carries every knob as a field
    IntegrityChecks = IntegrityChecksBase
else:
    IntegrityChecks = create_model("IntegrityChecks", __base__=IntegrityChecksBase, __module__=__name__,
                                   **_optional_fields(IntegrityConfig))


class EvalConfig(BaseModel):
    trials: int = Field(5, ge=2, description="correctness trials; >= 2 so a stale answer shows")
    seed: int = 0
    timing: TimingConfig = Field(default_factory=TimingConfig)
    limits: Limits = Field(default_factory=Limits)
    integrity: IntegrityChecks = Field(default_factory=IntegrityChecks)
    skip_timing: bool = False
    use_reference_cache: bool = True
    ranks_per_gpu: int = Field(1, ge=1, description="above 1, ranks share GPUs and symmetric memory is emulated "
                                                    "(harness/emulation): timings are not speedups")

    def timing_key(self) -> str:
        return hashlib.sha256(json.dumps(self.timing.model_dump(), sort_keys=True).encode()).hexdigest()[:12]
