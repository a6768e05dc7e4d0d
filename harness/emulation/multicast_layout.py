"""Where emulated multicast addresses live and how a kernel finds every rank's memory behind one.

Pure Python: the emulated handle, the device table and the CPU tests share these facts.

Under emulation `handle.multicast_ptr` is the start of a reserved, never mapped address range as large
as the handle's buffer (a *window*). No multicast object exists: an access to the window itself faults.
The rewritten kernels (harness.emulation.multimem_rewrite) turn each multimem instruction on an address
`a` of a window into ordinary accesses at every rank's address, `buffer_ptrs[r] + (a - window base)`.
They find the window in a table of 64-bit words in device memory:

    [MAGIC, count, window 0, window 1, ...]     window = [base, size, world, rank 0's base, ..., rank MAX_RANKS-1's]

The constants below are the only definition of that layout: the C++ the rewrite injects is generated from
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAGIC = 0x706B626D63  # "pkbmc": a table the harness filled, not zeroed memory
MAX_RANKS = 32
MAX_WINDOWS = 64
HEADER_WORDS = 2
WINDOW_WORDS = 3 + MAX_RANKS
TABLE_WORDS = HEADER_WORDS + MAX_WINDOWS * WINDOW_WORDS
# Windows are reserved in whole granules (the driver's VMM granularity on Hopper), so two windows never
# share a page and an access past a window's end faults or lands in no other window.
GRANULE = 2 << 20


@dataclass(frozen=True)
class Window:
    """One emulated multicast range: its base and size, and every rank's buffer (rank order)."""

    base: int
    size: int
    rank_bases: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.rank_bases) <= MAX_RANKS:
            raise ValueError(f"a window serves 1 to {MAX_RANKS} ranks, got {len(self.rank_bases)}")
        if self.size < 0 or self.base <= 0:
            raise ValueError(f"window base {self.base:#x} and size {self.size} must be positive")

    def contains(self, address: int, nbytes: int = 1) -> bool:
        return self.base <= address and address + nbytes <= self.base + self.size

    def unicast(self, rank: int, address: int) -> int:
        """Rank `rank`'s address behind multicast address `address` (what the rewritten kernels compute)."""
        if not self.contains(address):
            raise ValueError(f"{address:#x} is outside the window at {self.base:#x} ({self.size} bytes)")
        return self.rank_bases[rank] + (address - self.base)


def reserved_bytes(buffer_size: int) -> int:
    """The address range reserved for a window over a buffer of `buffer_size` bytes (whole granules)."""
    return max(GRANULE, -(-buffer_size // GRANULE) * GRANULE)


def table_words(windows: Sequence[Window]) -> list[int]:
    """The whole device table for `windows`, as unsigned 64-bit words (unused slots zero)."""
    if len(windows) > MAX_WINDOWS:
        raise ValueError(f"at most {MAX_WINDOWS} multicast windows are emulated per process, got {len(windows)}")
    words = [0] * TABLE_WORDS
    words[0], words[1] = MAGIC, len(windows)
    for i, w in enumerate(windows):
        at = HEADER_WORDS + i * WINDOW_WORDS
        words[at:at + 3] = [w.base, w.size, len(w.rank_bases)]
        words[at + 3:at + 3 + len(w.rank_bases)] = list(w.rank_bases)
    return words


def find(windows: Sequence[Window], address: int, nbytes: int) -> Window | None:
    """The window holding [address, address + nbytes), as the device code looks it up (first match)."""
    return next((w for w in windows if w.contains(address, nbytes)), None)
