"""Seed derivation. One place, so the worker, the oracle and the tests draw the same inputs."""

import hashlib

# Trials are spaced this far apart so that trial_seed + rank never collides with another trial's seeds.
RANK_STRIDE = 1 << 16


def trial_seed(seed: int, trial: int) -> int:
    """A 48-bit seed for one trial, mixed so nearby (seed, trial) pairs give unrelated streams."""
    digest = hashlib.sha256(f"pkb:{seed}:{trial}".encode()).digest()
    return (int.from_bytes(digest[:6], "little") // RANK_STRIDE) * RANK_STRIDE


def rank_seed(seed: int, trial: int, rank: int) -> int:
    """The seed of rank `rank`'s generator; problems recover trial_seed as initial_seed() - rank."""
    return trial_seed(seed, trial) + rank


# Timing input sets use trials far from correctness trials, so timed inputs are never checked ones.
TIMING_TRIAL_BASE = 1_000_000
