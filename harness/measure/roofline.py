"""The communication-aware roofline: how fast a problem could possibly run on this machine.

For every rank: interconnect bytes sent and received (traced from the reference's torch.distributed
calls by harness.rank.tracing, or the problem's declared `traffic()`, which wins key by key), HBM bytes
(inputs plus outputs unless declared) and matrix FLOPs (PyTorch's FLOP counter unless declared). Each
rank's lower bound is

    max(max(send, recv) / link bandwidth, HBM bytes / HBM bandwidth, FLOPs / matrix rate)

(links are full duplex: sending and receiving overlap), and the problem's bound is the largest over
ranks, since an iteration ends when its slowest rank does. The ceilings come from `pkb topology`
(harness.measure.topology.ceilings(): measured where calibrated); where that is absent or knows nothing, the
figures measured on the reference machine (two H200, harness/measure/hardware.json) are used and marked as such.
The fraction a timed side reaches is bound / measured median; a median below the bound by more than IMPOSSIBLE_MARGIN is
`impossible` (a broken timer, a cached answer, or a wrong model: an integrity flag, never a score).

Parent-side only (pydantic).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from harness.common import hostile_files
from harness.common.seeds import TIMING_TRIAL_BASE
from harness.config import TimingConfig
from harness.judge.reference import ReferenceFailed, time_reference_in_pool
from harness.launch.pool import Hang, PoolError, RankPool
from harness.measure import topology
from harness.measure.hardware import REFERENCE_CEILINGS, REFERENCE_SOURCE
from harness.problems.problem import Problem
from harness.rank import tracing as tracing_rules
from harness.records.cache_dir import cache_root
from harness.records.results import EvalResult, TimingStats

FALLBACK_CEILINGS = REFERENCE_CEILINGS  # the reference 2x H200's measured ceilings (harness/measure/hardware.json)
FALLBACK_SOURCE = REFERENCE_SOURCE
IMPOSSIBLE_MARGIN = 0.10
# Below this a bound is latency territory (on the reference machine NCCL's all-reduce takes 11.5 us at 64 KiB).
LATENCY_S = 5e-6
TRAFFIC_KEYS = ("send_bytes", "recv_bytes", "hbm_bytes", "flops")

Resource = Literal["interconnect", "hbm", "compute"]


class RooflineError(RuntimeError):
    """The roofline could not be computed: the trace failed or a declared traffic() is malformed."""


# -- ceilings -------------------------------------------------------------------------------------------


class Ceilings(BaseModel):
    link_bytes_per_s: float = Field(description="per direction, per GPU")
    link_source: str
    hbm_bytes_per_s: float = Field(description="read + write counted")
    hbm_source: str
    matmul_flops_per_s: float = Field(description="dense bf16")
    matmul_source: str
    gpu: str | None = None
    notes: list[str] = Field(default_factory=list)


def _topology_ceilings(notes: list[str], discover: bool) -> dict[str, Any]:
    """topology.ceilings() of the cached `pkb topology` profile; without one, of a fresh discovery when
    `discover` (GPU runs), else nothing (discovery takes seconds and finds no GPU ceilings on a CPU)."""
    try:
        profile = topology.load()
        if profile is None and not discover:
            notes.append("no `pkb topology` profile cached: the reference 2x H200's figures are used")
            return {}
        return dict(topology.ceilings(profile))
    except Exception as exc:  # a bad cache or a failed discovery must not take the roofline down with it
        notes.append(f"topology ceilings unavailable ({type(exc).__name__}: {exc}); the reference 2x H200's figures "
                     "are used")
        return {}


def resolve_ceilings(given: Ceilings | Mapping[str, Any] | None = None, device: str = "cuda") -> Ceilings:
    """`given` (a Ceilings, or a mapping shaped like topology.ceilings()), else this machine's (see
    _topology_ceilings); any value missing, None or "unavailable" falls back to the reference machine's
    figure, marked as such."""
    if isinstance(given, Ceilings):
        return given
    notes: list[str] = []
    data = dict(given) if given is not None else _topology_ceilings(notes, discover=device == "cuda")
    notes.extend(str(n) for n in data.get("notes", []) or [])
    values: dict[str, Any] = {}
    for key, prefix in (("link_bytes_per_s", "link"), ("hbm_bytes_per_s", "hbm"), ("matmul_flops_per_s", "matmul")):
        value, source = data.get(key), data.get(f"{prefix}_source") or "given"
        if not value or source == "unavailable" or not math.isfinite(float(value)) or float(value) <= 0:
            value, source = FALLBACK_CEILINGS[key], FALLBACK_SOURCE
        values[key], values[f"{prefix}_source"] = float(value), str(source)
    return Ceilings(**values, gpu=data.get("gpu"), notes=notes)


# -- the record -----------------------------------------------------------------------------------------


class KindTotal(BaseModel):
    kind: str
    count: int
    bytes: int = Field(description="payload S summed over calls, as harness.rank.tracing defines it per kind")
    send_bytes: int
    recv_bytes: int
    group_size: int


class RankBound(BaseModel):
    rank: int
    send_bytes: float
    recv_bytes: float
    hbm_bytes: float
    flops: float
    sources: dict[str, str] = Field(description="per quantity: traced or declared")
    link_s: float
    hbm_s: float
    compute_s: float
    bound_s: float
    binding: Resource


class Achieved(BaseModel):
    median_ms: float
    clock: str
    fraction: float = Field(description="bound / median: 1.0 is the hardware limit")
    impossible: bool = Field(description=f"median below the bound by more than {IMPOSSIBLE_MARGIN:.0%}")


class Roofline(BaseModel):
    problem: str
    shape: str
    world_size: int
    device: str
    traffic_source: Literal["traced", "declared", "declared+traced"]
    declared: list[str] = Field(default_factory=list, description="quantities the problem's traffic() gave")
    bound_rank: int
    send_bytes: float
    recv_bytes: float
    hbm_bytes: float
    flops: float
    link_s: float
    hbm_s: float
    compute_s: float
    bound_s: float
    binding: Resource
    collectives: list[KindTotal] = Field(default_factory=list, description="the bound rank's traced calls")
    ranks: list[RankBound]
    ceilings: Ceilings
    reference: Achieved | None = None
    candidate: Achieved | None = None
    impossible: bool = False
    flags: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


# -- declared traffic -------------------------------------------------------------------------------------


def declared_traffic(problem: Problem, shape: str, world_size: int) -> list[dict[str, float]] | None:
    """The problem's traffic(shape, W) as one dict per rank (a single dict applies to every rank)."""
    fn = problem.traffic
    if fn is None:
        return None
    try:
        value = fn(problem.shape(shape), world_size)
    except Exception as exc:
        raise RooflineError(f"{problem.name}: traffic() raised {type(exc).__name__}: {exc}") from exc
    per_rank = [value] * world_size if isinstance(value, Mapping) else list(value)
    if len(per_rank) != world_size:
        raise RooflineError(f"{problem.name}: traffic() gave {len(per_rank)} ranks for W={world_size}")
    out = []
    for entry in per_rank:
        if not isinstance(entry, Mapping):
            raise RooflineError(f"{problem.name}: traffic() must give a dict or a list of dicts")
        unknown = set(entry) - set(TRAFFIC_KEYS)
        if unknown:
            raise RooflineError(f"{problem.name}: traffic() has unknown keys {sorted(unknown)}; "
                                f"expected some of {', '.join(TRAFFIC_KEYS)}")
        for key, v in entry.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise RooflineError(f"{problem.name}: traffic()[{key!r}] = {v!r} is not a non-negative number")
        out.append({k: float(v) for k, v in entry.items()})
    return out


# -- the bound ---------------------------------------------------------------------------------------------


def rank_bound(rank: int, traced: Mapping[str, Any], declared: Mapping[str, float] | None,
               ceilings: Ceilings) -> RankBound:
    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    for key in TRAFFIC_KEYS:
        if declared is not None and key in declared:
            values[key], sources[key] = float(declared[key]), "declared"
        else:
            values[key], sources[key] = float(traced.get(key, 0.0)), "traced"
    link_s = max(values["send_bytes"], values["recv_bytes"]) / ceilings.link_bytes_per_s
    hbm_s = values["hbm_bytes"] / ceilings.hbm_bytes_per_s
    compute_s = values["flops"] / ceilings.matmul_flops_per_s
    times: dict[Resource, float] = {"interconnect": link_s, "hbm": hbm_s, "compute": compute_s}
    binding = max(times, key=times.__getitem__)
    return RankBound(rank=rank, **values, sources=sources, link_s=link_s, hbm_s=hbm_s, compute_s=compute_s,
                     bound_s=times[binding], binding=binding)


def achieved(bound_s: float, stats: TimingStats | None, device: str,
             margin: float = IMPOSSIBLE_MARGIN) -> Achieved | None:
    if stats is None or stats.median_ms <= 0:
        return None
    measured_s = stats.median_ms / 1e3
    # Only device clocks on GPUs are held to the bound: CPU timings say nothing about the GPU's limits.
    judged = device == "cuda" and stats.clock == "cuda_events"
    return Achieved(median_ms=stats.median_ms, clock=stats.clock, fraction=bound_s / measured_s,
                    impossible=judged and measured_s < bound_s * (1.0 - margin))


def build_roofline(problem: str, shape: str, world_size: int, device: str, traced: Sequence[Mapping[str, Any]],
                   declared: Sequence[Mapping[str, float]] | None, ceilings: Ceilings,
                   reference: TimingStats | None = None, candidate: TimingStats | None = None,
                   margin: float = IMPOSSIBLE_MARGIN) -> Roofline:
    """The roofline from per-rank traces (harness.rank.tracing replies, in rank order) and declared traffic."""
    if len(traced) != world_size:
        raise RooflineError(f"{len(traced)} traces for W={world_size}")
    ranks = [rank_bound(r, traced[r], declared[r] if declared else None, ceilings) for r in range(world_size)]
    top = max(ranks, key=lambda b: b.bound_s)
    declared_keys = sorted({k for d in declared or [] for k in d}, key=TRAFFIC_KEYS.index)
    if not declared_keys:
        source = "traced"
    elif set(declared_keys) == set(TRAFFIC_KEYS):
        source = "declared"
    else:
        source = "declared+traced"
    kinds = [KindTotal(kind=k, **v) for k, v in (traced[top.rank].get("by_kind") or {}).items()]
    ref, cand = achieved(top.bound_s, reference, device, margin), achieved(top.bound_s, candidate, device, margin)
    flags, notes = [], list(ceilings.notes)
    if cand is not None and cand.impossible:
        flags.append("candidate_below_roofline")
    if ref is not None and ref.impossible:
        flags.append("reference_below_roofline")
        notes.append("the reference beats the bound: this problem's traffic model or the ceilings are wrong")
    if device != "cuda" and (ref or cand):
        notes.append("timed on CPU against GPU ceilings: the fractions only prove the plumbing")
    if top.bound_s == 0:
        notes.append("nothing to move or compute: the bound is zero")
    elif top.bound_s < LATENCY_S:
        notes.append(f"the bound is under {LATENCY_S * 1e6:.0f} us: launch and synchronisation latency (about 10 us "
                     "per NCCL call on 2x H200) dominates, and a bandwidth roofline says little at this size")
    for r, t in enumerate(traced):
        for err in t.get("trace_errors") or []:
            notes.append(f"rank {r}: a call could not be read: {err}")
    return Roofline(
        problem=problem, shape=shape, world_size=world_size, device=device, traffic_source=source,
        declared=declared_keys, bound_rank=top.rank, send_bytes=top.send_bytes, recv_bytes=top.recv_bytes,
        hbm_bytes=top.hbm_bytes, flops=top.flops, link_s=top.link_s, hbm_s=top.hbm_s, compute_s=top.compute_s,
        bound_s=top.bound_s, binding=top.binding, collectives=kinds, ranks=ranks, ceilings=ceilings,
        reference=ref, candidate=cand, impossible=bool(flags), flags=flags, notes=notes,
    )


# -- running it ---------------------------------------------------------------------------------------------


def _ask(pool: RankPool, message: dict[str, Any], what: str, timeout: float) -> list[dict[str, Any]]:
    try:
        replies = pool.request(message, timeout=timeout)
    except Hang as hang:
        pool.kill()  # ranks stuck in a collective: the pool cannot be used again
        failed = [r for r in hang.replies.values() if not r.get("ok")]
        detail = failed[0].get("message", "") if failed else f"ranks {hang.missing} did not answer"
        raise RooflineError(f"{what}: {detail}") from hang
    bad = [r for r in replies if not r.get("ok")]
    if bad:
        pool.kill()
        first = min(bad, key=lambda r: r.get("rank", 0))
        raise RooflineError(f"{what}: {first.get('message', 'failed')}\n{first.get('evidence', '')}".rstrip())
    return replies


def trace_reference(problem: Problem, shape: str, world_size: int, device: str, *, pool: RankPool | None = None,
                    seed: int = 0, trial: int = TIMING_TRIAL_BASE, timeout: float = 300.0) -> list[dict[str, Any]]:
    """Every rank's trace of the reference (harness.rank.tracing), on the first timed input set by default.
    A pool that is given is reused (and killed if the trace fails); otherwise one is started and closed."""
    message = {"op": "trace", "problem": problem.loader_spec, "shape": shape, "seed": seed, "trial": trial}
    if pool is not None:
        return _ask(pool, message, "trace", timeout)
    try:
        with RankPool(world_size, device) as own:
            return _ask(own, message, "trace", timeout)
    except PoolError as err:
        raise RooflineError(f"trace: {err}") from err


def time_reference(pool: RankPool, problem: Problem, shape: str, device: str, *, seed: int = 0,
                   config: Mapping[str, Any] | None = None, timeout: float = 300.0) -> TimingStats:
    """The reference timed with the harness protocol in an existing (trusted) pool, exactly as an
    evaluation times it (harness.judge.reference)."""
    timing = TimingConfig(**config) if config is not None else TimingConfig.for_device(device)
    with tempfile.TemporaryDirectory(prefix="pkb-roofline-") as folder:
        try:
            return time_reference_in_pool(pool, problem, shape, device, Path(folder), seed=seed, config=timing,
                                          timeout=timeout)
        except ReferenceFailed as err:
            raise RooflineError(f"timing the reference: {err}") from err


def _stats(result: EvalResult | TimingStats | None, side: str) -> TimingStats | None:
    if result is None or isinstance(result, TimingStats):
        return result
    if result.timings is None:
        return None
    return result.timings.reference if side == "reference" else result.timings.candidate


def roofline(problem: Problem, shape: str, world_size: int, device: str,
             ceilings: Ceilings | Mapping[str, Any] | None = None,
             candidate_result: EvalResult | TimingStats | None = None,
             reference_result: EvalResult | TimingStats | None = None, *,
             pool: RankPool | None = None, seed: int = 0, timeout: float = 300.0,
             traced: Sequence[Mapping[str, Any]] | None = None) -> Roofline:
    """The roofline of `problem` at `shape` on `world_size` ranks. The reference is traced in `pool` (or a
    pool of its own) unless `traced` holds the replies already. Timings: an EvalResult gives its
    candidate's (and, unless `reference_result` is given, its reference's) median; a TimingStats is used
    as it is."""
    if not problem.supports(world_size):
        raise RooflineError(f"{problem.name} does not support W={world_size}")
    problem.shape(shape)  # unknown shape: KeyError naming the shapes it has
    declared = declared_traffic(problem, shape, world_size)
    traces = list(traced) if traced is not None else trace_reference(problem, shape, world_size, device, pool=pool,
                                                                     seed=seed, timeout=timeout)
    reference = _stats(reference_result, "reference") or (
        _stats(candidate_result, "reference") if isinstance(candidate_result, EvalResult) else None)
    return build_roofline(problem.name, shape, world_size, device, traces, declared, resolve_ceilings(ceilings, device),
                          reference=reference, candidate=_stats(candidate_result, "candidate"))


def trace_cache_path(problem: Problem, shape: str, world_size: int, device: str) -> Path:
    """Where a reference's trace is kept: keyed by the problem's source, the shape, W, the device, torch
    and the tracing rules themselves, so any change to one of them traces again."""
    rules = hashlib.sha256(Path(inspect.getfile(tracing_rules)).read_bytes()).hexdigest()[:12]
    key = "|".join([problem.name, problem.source_sha256[:16], shape, str(world_size), device, torch.__version__, rules])
    root = cache_root() / "roofline"
    return root / f"{problem.name}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def cached_trace(problem: Problem, shape: str, world_size: int, device: str, *, pool: RankPool | None = None,
                 seed: int = 0, timeout: float = 300.0) -> list[dict[str, Any]]:
    """trace_reference, kept on disk: a reference's trace never changes for the same key."""
    path = trace_cache_path(problem, shape, world_size, device)
    try:  # the cache folder is hidden from sandboxes; read as hostile all the same (a fallback run could write it)
        traced = hostile_files.read_json(path, 64 << 20)
        if isinstance(traced, list) and len(traced) == world_size and all(isinstance(t, dict) for t in traced):
            return traced
    except (OSError, hostile_files.HostileFile):
        pass
    traced = trace_reference(problem, shape, world_size, device, pool=pool, seed=seed, timeout=timeout)
    path.parent.mkdir(parents=True, exist_ok=True)
    hostile_files.replace_file(path, json.dumps(traced).encode())
    return traced


def lower_bound_ms(problem: Problem, shape: str, world_size: int, device: str, *,
                   pool: RankPool | None = None) -> float | None:
    """The roofline bound of one call in milliseconds, for harness.common.integrity's plausibility check. GPU
    runs only: a CPU timing is never held to GPU ceilings. The first call for a (problem, shape, W) traces
    the reference (in `pool` if given, else in a pool of its own); later calls read the cached trace."""
    if device != "cuda":
        return None
    r = roofline(problem, shape, world_size, device, _machine_ceilings(device),
                 traced=cached_trace(problem, shape, world_size, device, pool=pool))
    return r.bound_s * 1e3 if r.bound_s > 0 else None


@functools.lru_cache(maxsize=2)
def _machine_ceilings(device: str) -> Ceilings:
    """This machine's ceilings, resolved once per process (discovery takes seconds)."""
    return resolve_ceilings(None, device)
