"""Why a sample stopped: the one closed list (docs/run-layout.md's `stop_reason`).

Every stop the agent graph and the runner record is a member of StopReason; `checked` is how a record
is built from a value that may have come through a checkpoint, so an unknown reason fails where the
record is created instead of reaching sample.json.
"""

from __future__ import annotations

from enum import StrEnum


class StopReason(StrEnum):
    # The model ended the sample.
    SUBMITTED = "submitted"  # the submit tool, or an agent's reply with code and no tool call
    MODEL_ENDED = "model_ended"  # a reply with neither a tool call nor code; the last candidate is scored
    NO_CODE = "no_code"  # it ended with nothing to score
    ZERO_SHOT = "zero_shot"  # the one reply of a zero-shot sample held code
    # The provider ended it.
    MODEL_ERROR = "model_error"  # a request the server refused (a 400), after agent.retry
    CONTEXT_OVERFLOW = "context_overflow"  # the request is longer than the model's context window
    # A budget (agent.budgets), one reason per limit.
    MAX_TURNS = "max_turns"
    MAX_INPUT_TOKENS = "max_input_tokens"
    MAX_OUTPUT_TOKENS = "max_output_tokens"
    MAX_COST = "max_cost"
    MAX_WALL = "max_wall"
    MAX_GPU = "max_gpu"
    # No model at all: a solution file read from a directory (agent.replay).
    REPLAYED = "replayed"


def checked(value: object) -> str | None:
    """`value` as a stop reason's plain string (None stays None: a sample still running); anything not in
    StopReason raises ValueError."""
    if value is None:
        return None
    if isinstance(value, str) and value in _VALUES:
        return StopReason(value).value
    raise ValueError(f"unknown stop reason {value!r}; the reasons are: "
                     f"{', '.join(sorted(_VALUES))}")


_VALUES = frozenset(r.value for r in StopReason)
