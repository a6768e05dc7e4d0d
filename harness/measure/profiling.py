"""Where a candidate's time goes, the parent side: starts the ranks for op "profile" (harness.rank.timeline
summarises each rank's PyTorch profiler timeline), merges their summaries into a ProfileReport and, on GPUs,
adds Nsight Compute metrics (harness.measure.ncu) and Nsight Systems' kernel summary (harness.measure.nsys).
Ranks that share GPUs (harness.emulation) are profiled the same way; the report then says what such a profile
can and cannot tell (emulation_caveats).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.common import failures
from harness.compiling.compile import compile_candidate, private_copy, visible_for
from harness.launch.pool import Hang, PoolError, RankMisbehaved, RankPool
from harness.launch.sandbox.budget import evaluation_limits
from harness.launch.sandbox.private import private_folder, remove_private, stage_file
from harness.measure import ncu as nsight
from harness.measure import nsys as systems
from harness.measure.roofline import resolve_ceilings
from harness.problems.parallelkernelbench import multicast
from harness.rank.candidate import required_positional

# What a profile of ranks sharing GPUs (docs/emulation.md) can and cannot tell, as people and the model read it
# (docs/profiling.md): one line each, under emulation_caveats' first.
EMULATED_TIMES = ("times: the ranks take turns on the GPU (time slices), so a wait on a peer includes the peer's "
                  "turn (milliseconds); call, comm, overlap, idle and skew are not comparable with real multi-GPU "
                  "runs and are never speedups")
EMULATED_TRAFFIC_ONE_GPU = ("traffic: the peers' buffers are this GPU's own memory, so peer loads and stores are "
                            "DRAM/L2 traffic and nothing crosses NVLink (its counters are not read)")
EMULATED_TRAFFIC_SOME_GPUS = ("traffic: a peer on the same GPU is that GPU's own DRAM/L2 traffic, not NVLink; NVLink "
                              "counters see only the peers on other GPUs")
EMULATED_COLLECTIVES = ("collectives (the reference's, torch.distributed calls) run on the host, not as NCCL "
                        "kernels; the emulation's barrier and signal kernels (pkb_emu_*) stand in for torch's")
EMULATED_NCU = ("Nsight Compute, rank {rank} only: a kernel's launch shape, registers, DRAM bytes, SM and memory "
                "throughput and stall reasons are its own; the pkb_emu_* kernels are left out (the timeline has them)")


def emulation_caveats(world_size: int, ranks_per_gpu: int, *, device: str = "cuda", gpus: list[int] | None = None,
                      ncu_rank: int | None = None) -> list[str]:
    """What a profile of W ranks at `ranks_per_gpu` a GPU can and cannot tell (none in the ordinary mode);
    `ncu_rank`: the rank Nsight Compute profiled, where it ran."""
    if ranks_per_gpu <= 1 or device != "cuda":
        return []
    traffic = EMULATED_TRAFFIC_ONE_GPU if nsight.on_one_gpu(world_size, ranks_per_gpu, gpus) \
        else EMULATED_TRAFFIC_SOME_GPUS
    said = [EMULATED_TIMES, traffic, EMULATED_COLLECTIVES]
    if ncu_rank is not None:
        said.append(EMULATED_NCU.format(rank=ncu_rank))
    return [f"emulated: {ranks_per_gpu} ranks share each GPU (symmetric memory emulated); what this profile can "
            "and cannot tell:", *(f"- {line}" for line in said)]


class ProfileError(RuntimeError):
    """The profile could not be taken (the candidate does not build or load, or a rank failed)."""

    def __init__(self, message: str, verdict: str = failures.INFRA_ERROR, evidence: str = "") -> None:
        super().__init__(message)
        self.verdict = verdict
        self.evidence = evidence


@dataclass
class KernelStat:
    name: str
    kind: str
    us_per_iter: float
    launches_per_iter: float


@dataclass
class RankTimeline:
    rank: int
    iterations: int
    call_us: float  # mean window length: the rank's time per call (= busy + idle)
    call_median_us: float  # what the slowest rank and the skew are judged on
    comm_us: float
    compute_us: float
    overlap_us: float
    busy_us: float
    idle_us: float
    gaps_per_iter: float
    largest_gap_us: float
    lanes: int
    kernel_count: int
    kernels: list[KernelStat]
    window_source: str


@dataclass
class ProfileReport:
    problem: str
    target: str  # "reference" or the candidate file's name
    shape: str
    world_size: int
    device: str
    warmup: int
    iterations: int
    ranks: list[RankTimeline]
    slowest_rank: int
    skew: float  # (max - min) / max of the ranks' median call times
    ranks_per_gpu: int = 1  # above 1: ranks shared GPUs (harness.emulation)
    emulation: list[str] = field(default_factory=list)  # emulation_caveats: what this profile cannot tell
    ncu: Any = None  # harness.measure.ncu.NcuReport, when Nsight Compute was asked for
    # harness.measure.ncu.KernelSummary per top kernel (Nsight Compute's counters against the ceilings), and the
    # ceilings
    kernel_summary: list[Any] = field(default_factory=list)
    ceilings: dict[str, Any] | None = None
    nsys: Any = None  # harness.measure.nsys.NsysReport, when Nsight Systems was asked for
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def merge(replies: Sequence[dict[str, Any]]) -> tuple[list[RankTimeline], int, float]:
    ranks = []
    for r, reply in enumerate(replies):
        ranks.append(RankTimeline(
            rank=r, iterations=int(reply["iterations"]), call_us=float(reply["call_us"]),
            call_median_us=float(reply["call_median_us"]),
            comm_us=float(reply["comm_us"]), compute_us=float(reply["compute_us"]),
            overlap_us=float(reply["overlap_us"]), busy_us=float(reply["busy_us"]), idle_us=float(reply["idle_us"]),
            gaps_per_iter=float(reply["gaps_per_iter"]), largest_gap_us=float(reply["largest_gap_us"]),
            lanes=int(reply["lanes"]), kernel_count=int(reply["kernel_count"]),
            kernels=[KernelStat(**k) for k in reply["kernels"]], window_source=str(reply["window_source"])))
    calls = [r.call_median_us for r in ranks]
    slowest = max(range(len(ranks)), key=calls.__getitem__) if ranks else 0
    skew = (max(calls) - min(calls)) / max(calls) if ranks and max(calls) > 0 else 0.0
    return ranks, slowest, skew


def _claimed(reply: dict[str, Any], candidate: bool) -> ProfileError:
    """A rank's report of its own failure. A candidate's rank cannot make it anything but its failure (not
    correct, not infra_error, which nobody is charged for); a trusted pool's failure is the harness's."""
    verdict = reply.get("verdict")
    if not candidate:
        verdict = failures.INFRA_ERROR
    elif verdict not in failures.VERDICTS or verdict in (failures.CORRECT, failures.INFRA_ERROR):
        verdict = failures.RUNTIME_ERROR
    return ProfileError(str(reply.get("message", "failed"))[:1500], str(verdict), str(reply.get("evidence", ""))[:4000])


def _ask(pool: RankPool, message: dict[str, Any], timeout: float, what: str) -> list[dict[str, Any]]:
    candidate = pool.role == "candidate"
    try:
        replies = pool.request(message, timeout=timeout)
    except Hang as hang:
        failed = [r for r in hang.replies.values() if not r.get("ok")]
        if failed:
            raise _claimed(min(failed, key=lambda r: int(r.get("rank", 0))), candidate) from hang
        raise ProfileError(f"{what}: rank(s) {hang.missing} did not finish within {timeout:.0f} s",
                           failures.DEADLOCK if candidate else failures.INFRA_ERROR) from hang
    except (RankMisbehaved, PoolError) as err:  # past start-up a candidate pool stops with its ranks
        raise ProfileError(f"{what}: {err}", failures.RUNTIME_ERROR if candidate else failures.INFRA_ERROR) from err
    bad = [r for r in replies if not r.get("ok")]
    if bad:
        raise _claimed(min(bad, key=lambda r: int(r.get("rank", 0))), candidate)
    return replies


def profile(problem: Any, candidate: Path | None, *, world_size: int, device: str, shape: str, seed: int = 0,
            warmup: int = 3, iters: int = 5, timeout: float = 300.0, ncu: bool = False, ncu_rank: int = 0,
            ncu_budget_s: float = 60.0, ncu_metrics: Sequence[str] | None = None,
            ncu_replay: str = "kernel", gpus: list[int] | None = None, ranks_per_gpu: int = 1,
            nsys: bool = False, nsys_budget_s: float = 60.0, keep_dir: Path | None = None) -> ProfileReport:
    """Profile `candidate` (None: the reference) on `world_size` ranks; on GPUs optionally add Nsight
    Compute metrics of one rank (harness.measure.ncu), summarised per kernel against this machine's ceilings, and
    Nsight Systems' kernel summary of that rank where nsys is installed (harness.measure.nsys). `gpus` and
    `ranks_per_gpu` place the ranks (harness.emulation when they share GPUs); `keep_dir` keeps the raw Nsight
    reports. Raises ProfileError when the candidate cannot run."""
    started = time.perf_counter()
    notes: list[str] = []
    if candidate is not None and ranks_per_gpu > 1 and device == "cuda":
        # Multicast the emulation cannot rewrite: refused before anything runs, as an evaluation refuses it.
        refused = multicast.emulation_reason(Path(candidate).read_bytes().decode(errors="replace"))
        if refused:
            raise ProfileError(f"not available in emulation: {refused}")
    base: dict[str, Any] = {"problem": problem.loader_spec, "shape": shape, "candidate": None}
    entry = None
    # The candidate runs here too: in its sandbox, like in an evaluation (a timeline decides nothing, but
    # its code is as hostile as ever); the ranks import a read-only copy, never its own folder.
    folder = private_folder("pkb-profile-")
    copy = None
    if candidate is not None:
        candidate = Path(candidate).resolve()
        built = compile_candidate(candidate, 180.0, device, problem=problem.loader_spec)
        if not built.ok:
            remove_private(folder)
            raise ProfileError(built.message, built.verdict, built.evidence)
        copy = stage_file(candidate.read_bytes(), candidate.name, folder / "code")
        base["candidate"] = str(copy)
        entry = built.extensions
    pool = RankPool(world_size, device, role="candidate" if copy is not None else "trusted",
                    extensions=private_copy(entry, folder / "extensions") if copy is not None else None,
                    visible=visible_for(copy, problem.loader_spec) if copy is not None else (),
                    gpus=gpus, ranks_per_gpu=ranks_per_gpu,
                    sandbox_limits=evaluation_limits(problem, shape, world_size, device))
    try:
        pool.start()
        if candidate is not None:
            _ask(pool, {"op": "setup", "problem": problem.loader_spec}, 60.0, "load")
            _ask(pool, {"op": "load_candidate", **base, "params": len(required_positional(problem.solution))},
                 300.0, "load")
        replies = _ask(pool, {"op": "profile", **base, "seed": seed, "warmup": warmup, "iters": iters,
                              "mode": "timeline", "tag": uuid.uuid4().hex[:12]}, timeout, "profile")
        pool.close()
    except PoolError as err:  # the pool did not start: no candidate code had run
        raise ProfileError(str(err)) from err
    finally:
        pool.kill()  # after a failure the ranks may be stuck in a collective: no polite exit
        remove_private(folder)
    try:
        ranks, slowest, skew = merge(replies)
    except (KeyError, TypeError, ValueError) as err:  # a reply is a claim: one that is not a profile is a failure
        raise ProfileError(f"a rank's profile could not be read: {type(err).__name__}: {err}"[:600],
                           failures.RUNTIME_ERROR if candidate is not None else failures.INFRA_ERROR) from err
    if any(r.window_source.startswith("whole profile") for r in ranks):
        notes.append("no spin markers in the trace: windows span the whole profile, harness barriers included")
    report = ProfileReport(problem=problem.name, target=candidate.name if candidate else "reference", shape=shape,
                           world_size=world_size, device=device, warmup=warmup, iterations=iters, ranks=ranks,
                           slowest_rank=slowest, skew=skew, ranks_per_gpu=ranks_per_gpu, notes=notes,
                           emulation=emulation_caveats(world_size, ranks_per_gpu, device=device, gpus=gpus,
                                                       ncu_rank=ncu_rank if ncu else None))
    if ncu:
        report.ncu = nsight.collect(problem, candidate, world_size=world_size, device=device, shape=shape,
                                    seed=seed, rank=ncu_rank, budget_s=ncu_budget_s, metrics=ncu_metrics,
                                    replay=ncu_replay, gpus=gpus, ranks_per_gpu=ranks_per_gpu,
                                    keep_dir=keep_dir / "ncu" if keep_dir is not None else None)
        if report.ncu.kernels:
            report.kernel_summary, report.ceilings = kernel_summary(report.ncu, ranks, ncu_rank, device)
    if nsys and device == "cuda":
        report.nsys = systems.collect(problem, candidate, world_size=world_size, shape=shape, seed=seed,
                                      rank=ncu_rank, budget_s=nsys_budget_s, gpus=gpus, ranks_per_gpu=ranks_per_gpu,
                                      keep_dir=keep_dir / "nsys" if keep_dir is not None else None)
    report.seconds = time.perf_counter() - started
    return report


def kernel_summary(ncu_report: Any, ranks: list[RankTimeline], rank: int,
                   device: str) -> tuple[list[Any], dict[str, Any]]:
    """Nsight Compute's kernels of `rank` against this machine's ceilings (harness.measure.roofline's: the calibration,
    else the datasheet, else the reference machine's), their share of that rank's call from the timeline."""
    c = resolve_ceilings(None, device=device)
    hbm = nsight.Ceiling(c.hbm_bytes_per_s, c.hbm_source)
    link = nsight.Ceiling(c.link_bytes_per_s, c.link_source)
    call_us = next((r.call_median_us for r in ranks if r.rank == rank), None)
    summary = nsight.summarize_kernels(ncu_report, hbm=hbm, link=link, call_us=call_us)
    return summary, {"hbm_bytes_per_s": c.hbm_bytes_per_s, "hbm_source": c.hbm_source,
                     "link_bytes_per_s": c.link_bytes_per_s, "link_source": c.link_source}
