"""Names of the integrity flags a result can carry, and which of them keep a speedup from counting.

Plain strings, no torch: metrics and reports read them from sample records; harness.common.integrity (which
sets them) re-exports them. Also the caveat shown beside CPU speedups (timing_note).
"""

from collections.abc import Mapping
from typing import Any

# torch.distributed collectives inside solution() after its first call, on any backend (NCCL, gloo)
USES_TORCH_COLLECTIVES = "uses_torch_collectives"
LEGACY_USES_NCCL = "uses_nccl"  # the same flag in records written before 2026-12-01
TAMPERING = "tampering"  # harness/runtime callables replaced, or a forged reply on the harness channel
LAZY_OUTPUT = "lazy_output"  # output not plain, or completed/changed after the call returned
UNSYNCHRONIZED_WORK = "unsynchronized_work"  # GPU: output incomplete on the caller's stream at return
OUTPUT_REUSED = "output_reused"  # a later call overwrote an earlier call's output (informational)
MUTATES_INPUTS = "mutates_inputs"
STALE_OUTPUT = "stale_output"
RACE = "race"  # correct when ranks run in step, wrong when one rank is late (stress trials)
REDUCED_PRECISION = "reduced_precision"  # fails the precision probe while passing random inputs
TIMED_OUTPUT_WRONG = "timed_output_wrong"  # a timed call's output was wrong although the check passed
INPUT_CACHING = "input_caching"  # never-seen inputs much slower than rotated ones: results are cached
TIMING_IMPLAUSIBLE = "timing_implausible"  # non-positive or non-finite times
TIMING_INCONSISTENT = "timing_inconsistent"  # claimed times the harness's own clock cannot reconcile
IMPOSSIBLE = "impossible"  # faster than the roofline lower bound
SPAWNED_THREADS = "spawned_threads"  # the candidate left Python threads running (informational)
EMULATED = "emulated"  # ranks shared a GPU (harness.emulation): the timings are not speedups

# The flags read from the candidate's times (against the reference's, the harness's clock, the roofline):
# like the times themselves they depend on the load of the machine that ran the evaluation.
FROM_TIMES = frozenset({INPUT_CACHING, TIMING_IMPLAUSIBLE, TIMING_INCONSISTENT, IMPOSSIBLE})

# A correct candidate with one of these flags is never counted as fast (its speedup is not trusted).
SPEEDUP_DISQUALIFIERS = frozenset({
    USES_TORCH_COLLECTIVES, LEGACY_USES_NCCL, TAMPERING, UNSYNCHRONIZED_WORK, LAZY_OUTPUT, INPUT_CACHING,
    TIMING_IMPLAUSIBLE, IMPOSSIBLE, TIMING_INCONSISTENT, EMULATED,
    "static:harness_access", "static:introspection", "static:monkeypatch", "static:fd_access",
})


def fast_eligible(flags: list[str] | tuple[str, ...] | set[str] | frozenset[str]) -> bool:
    """False when a flag means the speedup must not count toward fast_p (correct, never fast)."""
    return not (set(flags) & SPEEDUP_DISQUALIFIERS)


def is_emulated(record: Any) -> bool:
    """Whether a result (EvalResult or its JSON) or a sample record comes from an emulated evaluation: its
    `emulated` field, or the `emulated` flag. Such a speedup is never counted, whatever it measured."""
    if isinstance(record, Mapping):
        return bool(record.get("emulated")) or EMULATED in (record.get("flags") or ())
    return bool(getattr(record, "emulated", False)) or EMULATED in (getattr(record, "flags", None) or ())


# What a CPU timing is worth, said wherever a CPU speedup is shown (pkb eval, the run report, the search's
# terminal table, live page and report): gloo over a CPU's memory, not NVLink.
CPU_TIMING_NOTE = "CPU timings only prove the plumbing: a CPU speedup says nothing about a GPU kernel"


def timing_note(device: str | None) -> str | None:
    """The caveat to show beside speedups measured on `device`; None where they mean what they say."""
    return CPU_TIMING_NOTE if device == "cpu" else None
