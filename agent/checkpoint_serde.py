"""LangGraph checkpoints without secrets: the checkpointer's serializer, redacting what it writes.

The checkpoints hold every message of an agent thread, tool answers included, and a tool answer can
carry what a candidate managed to read. Each serialized checkpoint passes harness.records.redaction before it
reaches the SQLite file; values are masked in place (same length), because the serialized form
(msgpack) records the length of every string.
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from harness.records.redaction import redact_bytes


class RedactingSerializer:
    """A SerializerProtocol that redacts what the wrapped serializer (LangGraph's default) produces."""

    def __init__(self, inner: SerializerProtocol | None = None) -> None:
        self.inner = inner or JsonPlusSerializer()

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        kind, data = self.inner.dumps_typed(obj)
        return kind, redact_bytes(data, same_length=True)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return self.inner.loads_typed(data)
