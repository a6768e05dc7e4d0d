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

# Timed iterations draw their own inputs (harness.rank.refill), from trials this far above the timing sets'.
TIMED_CALL_OFFSET = 100_000


def private_seed(seed: int, trial: int, rank: int) -> int:
    """A 48-bit seed for rank `rank`'s own draws in one trial, independent of every other rank's: knowing it
    (a timed call's rank is handed its own) says nothing about a peer's. Unlike rank_seed, which a problem
    turns back into the trial seed and so into every rank's seed."""
    digest = hashlib.sha256(f"pkb-private:{seed}:{trial}:{rank}".encode()).digest()
    return int.from_bytes(digest[:6], "little")


def fill_recipe(seed: int, trial: int, rank: int, probe: bool = False) -> dict[str, int | None]:
    """What one rank needs to draw its inputs of one timed call (harness.rank.refill.draw): the trial seed its
    problem derives shared metadata from (the same on every rank), its own private seed, and for a precision
    probe the seed of the probe's values. Never the run's seed: a rank cannot derive a peer's recipe."""
    return {"shared": trial_seed(seed, trial), "private": private_seed(seed, trial, rank),
            "probe": private_seed(seed, trial, rank + RANK_STRIDE) if probe else None}
