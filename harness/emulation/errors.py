"""The one exception the emulation raises for what it cannot do, and how the harness recognises it.

A rank process can only send text to the judge, so the contract is the message: every refusal reads
``not available in emulation: <api>: <why>``. `parse_refusal` turns such a line back into its parts, on
the trusted side, without importing anything else of this package. A candidate can raise the same text
itself; `refusal_is_plausible` is the judge's cross-check that the candidate's source names the refused
API at all (a weak check: a comment satisfies it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "not available in emulation"

# The word each refused API leaves in the source of a candidate that really uses it.
_SOURCE_TOKENS = {
    "multicast": ("multicast", "multimem"),
    "nccl": ("nccl", "NCCL"),
    "symm_mem_op": ("symm_mem", "_symmetric_memory", "_SymmetricMemory"),
    "symm_mem_api": ("symm_mem", "_symmetric_memory", "_SymmetricMemory"),
}


class NotAvailableInEmulation(RuntimeError):
    """The candidate asked for something one GPU cannot emulate (multicast, NCCL, torch's own symm_mem
    ops). Not the candidate's fault: the harness maps it to `infra_error: not available in emulation`."""

    def __init__(self, kind: str, api: str, why: str) -> None:
        if kind not in _SOURCE_TOKENS:
            raise ValueError(f"unknown refusal kind {kind!r}")
        self.kind = kind
        self.api = api
        self.why = why
        super().__init__(f"{PREFIX}: {api}: {why} [{kind}]")


@dataclass(frozen=True)
class Refusal:
    kind: str
    api: str
    why: str


_LINE = re.compile(rf"{re.escape(PREFIX)}: (?P<api>[^:\n]+): (?P<why>[^\n]*?) \[(?P<kind>[a-z_]+)\]")


def parse_refusal(text: str) -> Refusal | None:
    """The refusal in an error message or traceback, or None. Only the last one counts (a traceback
    repeats the message of the exception that ended the call last)."""
    found = [m for m in _LINE.finditer(text or "") if m.group("kind") in _SOURCE_TOKENS]
    if not found:
        return None
    m = found[-1]
    return Refusal(kind=m.group("kind"), api=m.group("api").strip(), why=m.group("why").strip())


def refusal_is_plausible(refusal: Refusal, source: str) -> bool:
    """Whether the candidate's source mentions the kind of API it was refused. A refusal whose source
    never names it was raised by the candidate itself: charge it as the runtime error it is."""
    return any(token in source for token in _SOURCE_TOKENS[refusal.kind])
