"""Evaluation settings: trials, seeds, timing and the time limit of every phase, in one typed place."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, Field


class TimingConfig(BaseModel):
    warmup: int = Field(10, ge=0)
    iters: int = Field(50, ge=2)
    host_iters: int = Field(10, ge=1)
    min_input_sets: int = Field(2, ge=1)
    max_input_sets: int = Field(64, ge=1)
    input_memory_fraction: float = Field(0.25, gt=0, le=0.9)
    min_spin_us: float = 20.0
    max_spin_us: float = 2000.0

    @classmethod
    def for_device(cls, device: str) -> TimingConfig:
        # On CPU the numbers only prove the plumbing: keep them cheap.
        return cls(warmup=2, iters=10, host_iters=3) if device == "cpu" else cls()


class Limits(BaseModel):
    """Seconds each phase may take before the whole rank group is killed."""

    compile_s: float = Field(180.0, gt=0)
    start_s: float = Field(120.0, gt=0)
    load_s: float = Field(300.0, gt=0, description="import of the candidate, including in-process builds")
    check_s: float = Field(120.0, gt=0)
    time_s: float = Field(300.0, gt=0)
    grace_s: float = Field(5.0, gt=0, description="wait for the other ranks once one has failed")


class EvalConfig(BaseModel):
    trials: int = Field(5, ge=2, description="correctness trials; >= 2 so a stale answer shows")
    seed: int = 0
    timing: TimingConfig = Field(default_factory=TimingConfig)
    limits: Limits = Field(default_factory=Limits)
    skip_timing: bool = False
    use_reference_cache: bool = True

    def timing_key(self) -> str:
        return hashlib.sha256(json.dumps(self.timing.model_dump(), sort_keys=True).encode()).hexdigest()[:12]
