"""Failure classes, comparable with PKB's taxonomy. Plain strings so the rank worker can use them."""

from typing import Literal, get_args

# The verdicts, listed once: the result schema's type (harness.records.results) and VERDICTS below.
Verdict = Literal["correct", "compile_error", "api_error", "runtime_error", "shape_mismatch", "output_mismatch",
                  "deadlock", "timeout", "infra_error"]
VERDICTS: tuple[str, ...] = get_args(Verdict)

COMPILE_ERROR = "compile_error"
API_ERROR = "api_error"
RUNTIME_ERROR = "runtime_error"
SHAPE_MISMATCH = "shape_mismatch"
OUTPUT_MISMATCH = "output_mismatch"
DEADLOCK = "deadlock"  # a phase ran out while ranks waited on each other (barrier, collective, signal spin)
TIMEOUT = "timeout"  # a phase ran out while every rank still at work was busy, none waiting on a peer
CORRECT = "correct"
# Harness or machine failure: retried, never charged to the model. Only for the causes below, none of which
# a candidate can bring about; every infra_error record names its cause (Failure.infra_cause). Anything
# else that goes wrong while a candidate's code or artifacts are handled is the candidate's failure.
INFRA_ERROR = "infra_error"
INFRA_CAUSES = {
    "environment": "this machine lacks what the reference needs, or a GPU package or CUDA the candidate needs",
    "sandbox": "PKB_SANDBOX=require and no sandbox can be started here",
    "launch": "the candidate's rank pool did not start; no candidate code had run in it",
    "reference": "the reference pool failed, overran Limits.reference_s or returned what cannot be compared",
    "emulation": "ranks sharing a GPU: the emulation refused an API that the candidate's source names",
    "harness": "the harness failed before any candidate code or artifact was involved",
    "executor": "the executor lost the evaluation (a Ray worker or node died; retries ran out)",
}
# The same causes in a reader's words (reports, exports, the console), beside the recorded cause.
INFRA_CAUSE_LABELS = {
    "environment": "this machine lacks a package or CUDA that it needs",
    "sandbox": "sandbox failed to start",
    "launch": "rank pool did not start",
    "reference": "reference failed",
    "emulation": "refused by the emulation",
    "harness": "harness failed",
    "executor": "executor lost the evaluation",
}
NEEDS_CUDA_LABEL = "needs a CUDA device: run with --device cuda on a GPU machine"
# Causes that the same request meets again on this machine: trying again only holds the devices longer (a
# multicast refusal was tried three times, about a minute of the only GPU each: one H200, 2026-12-02).
LASTING_INFRA_CAUSES = frozenset({"environment", "sandbox", "emulation"})

# Verdicts another evaluation on the same GPU cannot have brought about: a neighbour can slow a rank, take its
# memory or change which interleaving a race meets, but not make a wrong output right, a shape wrong or an API
# missing, nor bring about a lasting infra cause (the source names a refused API; a package is missing). An
# untimed evaluation that shared its GPU and ended otherwise is judged again alone (agent.executors.local), so
# a verdict never depends on the neighbours. A compile_error inside a lease came from a build in a rank (the
# build before the lease takes no lease), which a neighbour's load could have stopped: judged again.
STANDS_WHEN_SHARED = frozenset({CORRECT, SHAPE_MISMATCH, API_ERROR})


def stands_when_shared(verdict: str, infra_cause: str | None = None) -> bool:
    """Whether a verdict reached while other evaluations shared the GPU counts as it is."""
    return verdict in STANDS_WHEN_SHARED or (verdict == INFRA_ERROR and infra_cause in LASTING_INFRA_CAUSES)


# PKB's figure names the same classes differently; reports use these labels.
PKB_LABELS = {
    COMPILE_ERROR: "nvcc/syntax",
    API_ERROR: "API typo",
    RUNTIME_ERROR: "runtime",
    SHAPE_MISMATCH: "shape",
    OUTPUT_MISMATCH: "output mismatch",
    DEADLOCK: "deadlock",
    TIMEOUT: "deadlock (timeout)",  # PKB's figure counts every hang as a deadlock
    CORRECT: "correct",
    INFRA_ERROR: "infrastructure",
}
