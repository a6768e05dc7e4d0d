"""The machine's profile as the cache keeps it (its topology, harness.measure.discovery, and its
calibration, harness.measure.calibration) and the roofline's ceilings read from it.

`save()` / `load()` keep both as one JSON document in the cache; `ceilings()` gives the roofline its three
numbers, each marked measured or datasheet. Parent-side only (pydantic).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from harness.common import hostile_files
from harness.measure.calibration import Calibration
from harness.measure.discovery import SCHEMA_VERSION, Topology, TopologyError, discover
from harness.measure.hardware import datasheet
from harness.records.cache_dir import cache_root
from harness.records.environment import hardware_key

Source = Literal["measured", "datasheet", "unavailable"]


class Profile(BaseModel):
    """What the cache holds: the topology, the calibration if one was run, and the hardware key."""

    schema_version: int = SCHEMA_VERSION
    hardware_key: str | None = None
    topology: Topology
    calibration: Calibration | None = None


# -- cache and ceilings ----------------------------------------------------------------------------


def cache_path() -> Path:
    return cache_root() / "topology.json"


def save(profile: Profile, path: Path | None = None) -> Path:
    path = path or cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(profile.model_dump_json(indent=1))
    tmp.replace(path)
    return path


def load(path: Path | None = None) -> Profile | None:
    """The cached profile, None when there is none; TopologyError when the file is not one."""
    path = path or cache_path()
    if not path.exists():
        return None
    try:
        return Profile.model_validate_json(hostile_files.read_bytes(path, 64 << 20))
    except (ValidationError, ValueError, OSError, hostile_files.HostileFile) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TopologyError(f"{path} is not a topology profile ({first})") from None


def ceilings(profile: Profile | None = None) -> dict[str, Any]:
    """The roofline's ceilings: link bytes/s (per direction), HBM bytes/s, bf16 FLOP/s.

    Each comes with its source: "measured" (calibration), "datasheet" (NVLink links x speed for the link;
    the vendor datasheet for HBM and the matrix rate), or "unavailable" (value None). "source" sums them
    up: one of those three, or "mixed". With no profile given, the cached one is used if it exists and
    can be read; else a fresh discover().
    """
    notes: list[str] = []
    if profile is None:
        try:
            profile = load()
        except TopologyError as err:
            notes.append(f"ignored the cache: {err}")
        profile = profile or Profile(topology=discover())
    topo, cal = profile.topology, profile.calibration
    name = topo.gpus[0].name if topo.gpus else None
    sheet = datasheet(name) if name else None
    spec_link = topo.link_spec_bytes_per_s

    def pick(measured: float | None, fallback: float | None) -> tuple[float | None, Source]:
        if measured:
            return measured, "measured"
        return (fallback, "datasheet") if fallback else (None, "unavailable")

    link, link_src = pick(cal.link_bytes_per_s if cal else None, spec_link)
    hbm, hbm_src = pick(max(cal.hbm_copy_bytes_per_s, default=None) if cal else None, sheet[0] if sheet else None)
    mm, mm_src = pick(max(cal.matmul_bf16_flops_per_s, default=None) if cal else None, sheet[1] if sheet else None)
    sources = {link_src, hbm_src, mm_src}
    if link_src == "datasheet":
        notes.append("link: NVLink spec (active links x per-link speed), not measured; `pkb topology --calibrate`")
    if link_src == "measured" and spec_link and link and link > spec_link:
        notes.append("measured peer copy exceeds the NVLink spec: check the link speeds")
    if cal is not None and profile.hardware_key and profile.hardware_key != hardware_key():
        notes.append(f"calibrated under another environment (hardware key {profile.hardware_key})")
    return {
        "gpu": name,
        "gpu_count": topo.gpu_count,
        "link_bytes_per_s": link,
        "link_source": link_src,
        "link_spec_bytes_per_s": spec_link,
        "hbm_bytes_per_s": hbm,
        "hbm_source": hbm_src,
        "matmul_flops_per_s": mm,
        "matmul_source": mm_src,
        "source": sources.pop() if len(sources) == 1 else "mixed",
        "calibrated_at": cal.measured_at if cal else None,
        "notes": notes,
    }
