"""Failure classes, comparable with PKB's taxonomy. Plain strings so the rank worker can use them."""

COMPILE_ERROR = "compile_error"
API_ERROR = "api_error"
RUNTIME_ERROR = "runtime_error"
SHAPE_MISMATCH = "shape_mismatch"
OUTPUT_MISMATCH = "output_mismatch"
DEADLOCK = "deadlock"  # a phase ran out while ranks waited on each other (barrier, collective, signal spin)
TIMEOUT = "timeout"  # a phase ran out while every rank still at work was busy, none waiting on a peer
CORRECT = "correct"
# Harness or machine failure: retried, never charged to the model.
INFRA_ERROR = "infra_error"

VERDICTS = (
    CORRECT,
    COMPILE_ERROR,
    API_ERROR,
    RUNTIME_ERROR,
    SHAPE_MISMATCH,
    OUTPUT_MISMATCH,
    DEADLOCK,
    TIMEOUT,
    INFRA_ERROR,
)

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
