"""Telling a hang from slowness when a phase runs out of time. Judge side.

When a request overruns, the pool takes every rank's stack before it is killed (harness.launch.pool.Hang).
Among the ranks that had not answered: if any is waiting on another rank (a barrier, a collective, a
store wait, a device synchronize, which is where a host sits while its GPU spins on a peer's signal),
the ranks wait on each other: `deadlock`. If every one of them is at work in its own code, nobody waits
for anybody: `timeout` (too slow, not stuck). Without stacks the verdict stays `deadlock`, as before
this module, and the message says the stacks were missing.

The stacks go into the result (integrity.stacks, and trimmed into the failure's evidence), because a
stack is the most useful thing a hung kernel can tell the model that wrote it.
"""

from __future__ import annotations

from harness.common import failures

# Frames that mean "this thread waits for another rank" (Python files and functions, native symbols).
_WAITING = (
    "torch/distributed/", "distributed_c10d", "_symmetric_memory", "barrier", "all_reduce", "allreduce",
    "all_gather", "allgather", "reduce_scatter", "all_to_all", "alltoall", "broadcast", "irecv", "recv (",
    "gloo::", "c10d::", "nccl", "Synchronize", "synchronize", "cudaMemcpy", "cuMemcpy", "cudaEventQuery",
    "wait_stream", "Work::wait", ".wait (",
)
# Frames of the harness's own idle loop: a rank sitting there has answered already.
_IDLE = ("serve (harness/rank/worker.py", "harness/rank/worker.py:", "multiprocessing/connection.py")


def _thread_blocks(stack: str) -> list[str]:
    blocks: list[str] = []
    current: list[str] = []
    for line in stack.splitlines():
        if line.startswith(("Thread ", "Current thread", "Process ")) and current:
            blocks.append("\n".join(current))
            current = []
        current.append(line)
    if current:
        blocks.append("\n".join(current))
    return [b for b in blocks if "File " in b or "(" in b]


def waits_on_peers(stack: str) -> bool:
    """Whether any thread of this rank's stack sits in a wait on another rank or on the device."""
    for block in _thread_blocks(stack):
        top = "\n".join(block.splitlines()[:12])
        if any(marker in top for marker in _WAITING):
            return True
    return False


def classify(missing: list[int], stacks: dict[int, str]) -> tuple[str, str]:
    """(verdict, why) for ranks that did not answer in time."""
    have = {r: stacks[r] for r in missing if stacks.get(r)}
    if not have:
        return failures.DEADLOCK, "no stacks could be taken, so ranks waiting on each other could not be ruled out"
    waiting = [r for r, s in have.items() if waits_on_peers(s)]
    if waiting:
        return failures.DEADLOCK, f"rank(s) {', '.join(map(str, waiting))} were waiting on another rank"
    return failures.TIMEOUT, (f"rank(s) {', '.join(map(str, sorted(have)))} were all busy in their own code, none "
                              f"waiting on another rank: too slow, not stuck")


def evidence(stacks: dict[int, str], limit: int = 2500) -> str:
    """The stacks, trimmed for a failure record: each rank's first thread block, most recent frames."""
    parts = []
    share = max(400, limit // max(1, len(stacks)))
    for rank in sorted(stacks):
        blocks = _thread_blocks(stacks[rank]) or [stacks[rank]]
        main = next((b for b in blocks if "MainThread" in b or "Current thread" in b), blocks[0])
        parts.append(f"[rank {rank}]\n{main[:share]}")
    return "\n".join(parts)[:limit]
