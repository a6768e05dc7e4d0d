"""The rendezvous exchange: every rank of a group publishes its allocation's IPC handle in the store and
maps every peer's. Store only, as torch's rendezvous does: no collective of the process group runs, so
the harness's collective monitor and the groups' sequence numbers see nothing.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from harness.emulation import driver

KEY_ROOT = "pkb-emulation"


@dataclass(frozen=True)
class PeerRecord:
    """What one rank tells its peers about one allocation."""

    rank: int
    pid: int
    device_uuid: str
    ipc_handle: str  # hex of the 64-byte CUDA IPC handle of the whole allocation (pad + data)
    pad_bytes: int
    data_offset: int
    data_bytes: int
    tensor_offset: int  # where the rendezvoused tensor starts in the data

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> PeerRecord:
        fields = json.loads(raw.decode())
        return cls(**fields)


def exchange(store: Any, prefix: str, mine: PeerRecord, world_size: int) -> list[PeerRecord]:
    """Publish `mine` under `prefix` and read every rank's record (blocking on the store's timeout,
    as torch's rendezvous does when a rank never comes)."""
    store.set(f"{prefix}/{mine.rank}", mine.encode())
    records = [mine if r == mine.rank else PeerRecord.decode(bytes(store.get(f"{prefix}/{r}")))
               for r in range(world_size)]
    for r, record in enumerate(records):
        if record.rank != r:
            raise RuntimeError(f"rendezvous: slot {r} holds rank {record.rank}'s record")
    return records


def validate(records: list[PeerRecord]) -> None:
    """What torch's rendezvous insists on: every rank brings an allocation of the same size, and
    the tensor starts at the same place in each."""
    sizes = {r.data_bytes - r.tensor_offset for r in records}
    if len(sizes) != 1:
        raise RuntimeError("rendezvous: the ranks' symmetric tensors differ in size: "
                           + ", ".join(f"rank {r.rank}: {r.data_bytes - r.tensor_offset} bytes" for r in records))
    pads = {r.pad_bytes for r in records}
    if len(pads) != 1:
        raise RuntimeError("rendezvous: the ranks' signal pads differ in size (set_signal_pad_size on some "
                           "ranks only?)")


class PeerMappings:
    """Peer allocations mapped into this process, by exporter and handle: a handle can be opened once
    per process (a second cuIpcOpenMemHandle of the same handle fails), so a second rendezvous of the
    same allocation, or one in another group, reuses the first mapping."""

    def __init__(self) -> None:
        self._opened: dict[tuple[int, str], int] = {}

    def base_of(self, record: PeerRecord, ordinal: int, own_base: int | None) -> int:
        if record.pid == os.getpid():
            if own_base is None:
                raise RuntimeError("rendezvous: two ranks of the group live in one process")
            return own_base
        key = (record.pid, record.ipc_handle)
        if key not in self._opened:
            self._opened[key] = driver.ipc_open(ordinal, bytes.fromhex(record.ipc_handle))
        return self._opened[key]
