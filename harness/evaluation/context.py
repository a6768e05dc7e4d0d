"""The inputs of one evaluation, fixed before any phase runs: what is evaluated, where, under which settings,
with which secret, and the private folders the trusted side keeps its files in."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from harness.common import integrity
from harness.common.integrity import IntegrityConfig
from harness.config import EvalConfig
from harness.launch.sandbox.private import private_folder, stage_file
from harness.problems.problem import Problem


@dataclasses.dataclass(frozen=True)
class Context:
    """What every phase reads and none changes. `rng` is the one stateful member: the secret's generator,
    drawn from in the protocol's order (trial order, the timing plan, stress delays, sampled timed outputs)."""

    problem: Problem
    path: Path  # the user's file (resolved): the record names it
    world_size: int
    device: str
    shape: str
    config: EvalConfig
    checks: IntegrityConfig
    log_dir: Path | None
    gpus: list[int] | None
    source: bytes
    # The secret: it orders the trials, mixes the seed, and picks the timed calls that are judged. It never
    # enters a candidate's process.
    salt: int
    rng: random.Random
    # Under the private root (harness.launch.sandbox.private): no sandbox sees it, whatever TMPDIR is, except the
    # read-only copy of the candidate the ranks import (its own folder is never bound).
    folder: Path
    ref_dir: Path  # the reference's inputs and expected outputs
    code_path: Path  # the ranks' read-only copy of the candidate

    @classmethod
    def open(cls, problem: Problem, path: Path, *, world_size: int, device: str, shape: str, config: EvalConfig,
             checks: IntegrityConfig, log_dir: Path | None, gpus: list[int] | None, salt: int,
             rng: random.Random) -> Context:
        """The context of evaluating `path`, with its private folder made (the caller removes it)."""
        source = path.read_bytes()
        folder = private_folder("pkb-eval-")
        ref_dir = folder / "reference"
        ref_dir.mkdir()
        code_path = stage_file(source, path.name, folder / "code")
        return cls(problem=problem, path=path, world_size=world_size, device=device, shape=shape, config=config,
                   checks=checks, log_dir=log_dir, gpus=gpus, source=source, salt=salt, rng=rng, folder=folder,
                   ref_dir=ref_dir, code_path=code_path)

    @property
    def seed(self) -> int:
        """The run's seed mixed with the salt: only trusted processes ever hold it."""
        return integrity.mixed_seed(self.config.seed, self.salt)

    @property
    def emulated(self) -> bool:
        """Ranks share GPUs (harness.emulation)."""
        return self.config.ranks_per_gpu > 1

    @property
    def text(self) -> str:
        """The candidate's source as text, for the scans that read it."""
        return self.source.decode(errors="replace")
