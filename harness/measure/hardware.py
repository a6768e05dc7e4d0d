"""Hardware figures, defined once in harness/measure/hardware.json: the vendor datasheet per GPU model, and what was
measured on the project's reference machine (two H200, NV18), which the roofline falls back to where this
machine's own ceilings are unknown. harness.measure.topology reads the datasheet; harness.measure.roofline the fallback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HARDWARE_FILE = Path(__file__).with_name("hardware.json")


@dataclass(frozen=True)
class DatasheetEntry:
    match: str  # contained in the GPU's name
    hbm_bytes_per_s: float
    bf16_flops_per_s: float


def _load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(HARDWARE_FILE.read_text())
    return data


_DATA = _load()
DATASHEET: tuple[DatasheetEntry, ...] = tuple(
    DatasheetEntry(g["match"], float(g["hbm_bytes_per_s"]), float(g["bf16_flops_per_s"]))
    for g in _DATA["datasheet"]["gpus"])
# The reference machine's measured ceilings, keyed as harness.measure.roofline.Ceilings names them.
REFERENCE_CEILINGS: dict[str, float] = {key: float(_DATA["reference_machine"][key])
                                        for key in ("link_bytes_per_s", "hbm_bytes_per_s", "matmul_flops_per_s")}
REFERENCE_SOURCE: str = _DATA["reference_machine"]["source"]


def datasheet(gpu_name: str) -> tuple[float, float] | None:
    """(HBM bytes/s, dense bf16 FLOP/s) from the vendor datasheet, or None for a GPU not in the table."""
    for entry in DATASHEET:
        if entry.match in gpu_name:
            return entry.hbm_bytes_per_s, entry.bf16_flops_per_s
    return None
