"""The machine's GPUs and how they are joined, as the machine says (torch, NVML, `nvidia-smi`).

`discover()` creates nothing on a GPU beyond torch's own context; NVLink multicast is read as a device
attribute only, never exercised. Parsers of `nvidia-smi` text are pure functions, tested on canned output.
Parent-side only (pydantic). What is measured on top of this: harness.measure.calibration; the cached
profile and the roofline's ceilings: harness.measure.topology.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import re
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from harness.common.safe_env import SAFE_ENV

SCHEMA_VERSION = 1  # of the cached profile (harness.measure.topology) and the topology in it
CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 132  # cuda.h; read with cuDeviceGetAttribute, nothing created
NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON = 90  # nvml.h: common speed of the active links, in MB/s


class TopologyError(RuntimeError):
    """Calibration cannot run here or failed, or a cached profile is unreadable."""


# -- the record ------------------------------------------------------------------------------------


class NvLink(BaseModel):
    link: int
    active: bool
    gbytes_per_s: float | None = Field(None, description="per direction, as the driver reports it (1e9 B/s)")
    version: int | None = Field(None, description="NVML's nvmlNvlinkVersion_t value, as reported")


class Gpu(BaseModel):
    index: int = Field(description="torch / CUDA ordinal")
    name: str
    uuid: str | None = None
    memory_bytes: int
    sm_count: int
    l2_bytes: int
    compute_capability: str
    nvlinks: list[NvLink] = Field(default_factory=list)
    multicast_supported: bool | None = Field(
        None, description="CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED; what the device says, not what policy allows")

    @property
    def active_links(self) -> int:
        return sum(1 for link in self.nvlinks if link.active)

    @property
    def link_spec_bytes_per_s(self) -> float | None:
        """Active links times their speed, per direction; None where no speed is known."""
        speeds = [link.gbytes_per_s for link in self.nvlinks if link.active and link.gbytes_per_s]
        return sum(speeds) * 1e9 if speeds else None


class Topology(BaseModel):
    schema_version: int = SCHEMA_VERSION
    discovered_at: str
    gpu_count: int
    gpus: list[Gpu] = Field(default_factory=list)
    torch: str
    cuda: str | None = Field(None, description="the CUDA runtime torch was built with")
    cuda_driver: str | None = Field(None, description="the newest CUDA the driver supports")
    driver: str | None = None
    nccl: str | None = None
    peer_access: list[list[bool]] = Field(default_factory=list, description="[i][j]: GPU i can map GPU j's memory")
    interconnect: list[list[str]] = Field(
        default_factory=list, description="`nvidia-smi topo -m` GPU-to-GPU cells (NV18, SYS, ...), nvidia-smi order")
    nvlink_source: Literal["nvml", "nvidia-smi", "none"] = "none"
    multicast_supported: bool | None = Field(None, description="every GPU reports the multicast attribute")
    multicast_disabled_by_policy: bool = Field(description="NCCL_NVLS_ENABLE=0 and friends are set here")
    multicast_env: dict[str, str | None] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    @property
    def link_spec_bytes_per_s(self) -> float | None:
        """Per direction, from the NVLink spec: the least-connected GPU's links times their speed."""
        known = [v for v in (g.link_spec_bytes_per_s for g in self.gpus) if v]
        return min(known) if known else None


# -- pure parsers and rules ------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PORT = re.compile(r"(GPU|NIC)\d+")
_GPU = re.compile(r"GPU\d+")
_SMI_GPU = re.compile(r"GPU (\d+): (.*?)(?: \(UUID: ([^)]+)\))?$")
_SMI_LINK = re.compile(r"Link (\d+): (.*)$")
_SPEED = re.compile(r"([\d.]+)\s*GB/s")
_NVML_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def parse_topo_matrix(text: str) -> list[list[str]]:
    """The GPU-to-GPU cells of `nvidia-smi topo -m` ("X" on the diagonal), in nvidia-smi's GPU order."""
    columns: list[str] = []
    rows: dict[str, list[str]] = {}
    for line in _ANSI.sub("", text).splitlines():
        tokens = line.split()
        if not tokens:
            continue
        if tokens[0].rstrip(":") == "Legend":
            break
        if not columns:
            if tokens[0] == "GPU0" and (len(tokens) < 2 or tokens[1] != "X"):
                columns = list(itertools.takewhile(_PORT.fullmatch, tokens))
            continue
        if _GPU.fullmatch(tokens[0]):
            rows.setdefault(tokens[0], tokens[1:1 + len(columns)])
    gpu_cols = [i for i, c in enumerate(columns) if c.startswith("GPU")]
    return [[cells[i] if i < len(cells) else "?" for i in gpu_cols]
            for name in (columns[i] for i in gpu_cols) if (cells := rows.get(name)) is not None]


def nvlink_count(cell: str) -> int:
    """Links in a `topo -m` cell: "NV18" -> 18; anything else (SYS, PHB, X) -> 0."""
    m = re.fullmatch(r"NV(\d+)", cell.strip())
    return int(m.group(1)) if m else 0


class SmiNvlinks(BaseModel):
    index: int = Field(description="nvidia-smi (PCI bus) order, not necessarily torch's")
    name: str
    uuid: str | None = None
    links: list[NvLink] = Field(default_factory=list)


def parse_nvlink_status(text: str) -> list[SmiNvlinks]:
    """`nvidia-smi nvlink -s`: each GPU's links and their per-direction speed ("<inactive>" when down)."""
    gpus: list[SmiNvlinks] = []
    for raw in _ANSI.sub("", text).splitlines():
        line = raw.strip()
        if m := _SMI_GPU.match(line):
            gpus.append(SmiNvlinks(index=int(m[1]), name=m[2].strip(), uuid=m[3]))
        elif gpus and (m := _SMI_LINK.match(line)):
            speed = _SPEED.search(m[2])
            gbps = float(speed[1]) if speed else None
            gpus[-1].links.append(NvLink(link=int(m[1]), active=bool(gbps), gbytes_per_s=gbps))
    return gpus


def nvml_field_number(field: Any) -> float | None:
    """The number in an NVML nvmlFieldValue_t, or None when NVML said no."""
    if getattr(field, "nvmlReturn", 1) != 0:
        return None
    member = _NVML_VALUE_MEMBERS.get(getattr(field, "valueType", -1))
    return None if member is None else float(getattr(field.value, member))


def multicast_disabled_by_policy(env: Mapping[str, str] | None = None) -> bool:
    """True when every multicast switch of harness.common.safe_env.SAFE_ENV is set to its off value."""
    env = os.environ if env is None else env
    return all(env.get(key) == value for key, value in SAFE_ENV.items())


# -- discovery -------------------------------------------------------------------------------------


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _run(argv: list[str]) -> str | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _torch_gpu(index: int) -> Gpu:
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    uuid_text = None if uuid is None else str(uuid)
    if uuid_text and not uuid_text.startswith("GPU-"):
        uuid_text = f"GPU-{uuid_text}"  # torch prints the bare hex form; NVML and nvidia-smi prefix it
    return Gpu(index=index, name=props.name, uuid=uuid_text, memory_bytes=int(props.total_memory),
               sm_count=int(props.multi_processor_count), l2_bytes=int(getattr(props, "L2_cache_size", 0)),
               compute_capability=f"{props.major}.{props.minor}")


def _nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _multicast_attribute(ordinal: int) -> bool | None:
    """CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED through the driver API: a read, nothing is created."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, value = ctypes.c_int(-1), ctypes.c_int(-1)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
        return None
    if cuda.cuDeviceGetAttribute(ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, device) != 0:
        return None
    return bool(value.value)


def _nvml_probe(gpus: list[Gpu], notes: list[str]) -> dict[str, str]:
    """Fill each GPU's NVLinks from NVML; return driver facts. Never raises: a probe is not a verdict."""
    try:
        import pynvml
    except ImportError:
        notes.append("pynvml (nvidia-ml-py) is not installed: NVLink facts come from nvidia-smi")
        return {}
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVML missing or driver not loaded
        notes.append(f"NVML did not start ({err}): NVLink facts come from nvidia-smi")
        return {}
    facts: dict[str, str] = {}
    try:
        facts["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            v = int(pynvml.nvmlSystemGetCudaDriverVersion())
            facts["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
        except Exception:
            pass
        max_links = max(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)), 18)
        speed_field = int(getattr(pynvml, "NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON", NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON))
        for gpu in gpus:
            handle = _nvml_handle(pynvml, gpu)
            if handle is None:
                notes.append(f"GPU {gpu.index}: no NVML handle (UUID {gpu.uuid})")
                continue
            speed = None
            try:
                mbps = nvml_field_number(pynvml.nvmlDeviceGetFieldValues(handle, [speed_field])[0])
                speed = mbps / 1000 if mbps else None
            except Exception:
                pass
            links = []
            for link in range(max_links):
                try:
                    active = pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED
                except Exception:  # no such link on this GPU
                    continue
                version = None
                if active:
                    try:
                        version = int(pynvml.nvmlDeviceGetNvLinkVersion(handle, link))
                    except Exception:
                        pass
                links.append(NvLink(link=link, active=active, gbytes_per_s=speed if active else None,
                                    version=version))
            gpu.nvlinks = links
    except Exception as err:
        notes.append(f"NVML query failed part-way: {type(err).__name__}: {err}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return facts


def _nvml_handle(pynvml: Any, gpu: Gpu) -> Any:
    if gpu.uuid:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid.encode())
        except Exception:
            pass
    if not os.environ.get("CUDA_VISIBLE_DEVICES"):  # only then do CUDA and NVML indices agree (same model)
        try:
            return pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
        except Exception:
            pass
    return None


def _merge_smi_links(gpus: list[Gpu], smi: list[SmiNvlinks], notes: list[str]) -> bool:
    """Links from `nvidia-smi nvlink -s` where NVML gave none; its per-link speed where NVML gave none or
    another (a note says so). True if anything was taken from it."""
    by_uuid = {s.uuid: s for s in smi if s.uuid}
    by_index = {s.index: s for s in smi}
    used = False
    for gpu in gpus:
        row = by_uuid.get(gpu.uuid or "") or (None if os.environ.get("CUDA_VISIBLE_DEVICES") else
                                              by_index.get(gpu.index))
        if row is None:
            continue
        if not gpu.nvlinks:
            gpu.nvlinks = [link.model_copy() for link in row.links]
            used = used or bool(row.links)
            continue
        smi_speed = {link.link: link.gbytes_per_s for link in row.links}
        disagree = []
        for link in gpu.nvlinks:
            other = smi_speed.get(link.link)
            if not (link.active and other) or link.gbytes_per_s == other:
                continue
            if link.gbytes_per_s is not None and abs(link.gbytes_per_s - other) > 0.01 * other:
                disagree.append(f"{link.gbytes_per_s:.3f} vs {other:.3f}")
            link.gbytes_per_s, used = other, True
        if disagree:
            notes.append(f"GPU {gpu.index}: NVML's common link speed and nvidia-smi's differ on {len(disagree)} "
                         f"links (GB/s, e.g. {disagree[0]}); taking nvidia-smi's")
    return used


def discover() -> Topology:
    """This machine's GPUs and interconnect. Cheap (about a second); safe on a CPU-only machine."""
    notes: list[str] = []
    base: dict[str, Any] = {
        "discovered_at": now(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "multicast_disabled_by_policy": multicast_disabled_by_policy(),
        "multicast_env": {key: os.environ.get(key) for key in SAFE_ENV},
    }
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        notes.append("no CUDA device is visible (CPU-only machine, or CUDA_VISIBLE_DEVICES is empty): "
                     "link, HBM and matrix ceilings are unknown here")
        return Topology(gpu_count=0, notes=notes, **base)

    gpus = [_torch_gpu(i) for i in range(count)]
    peer = [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(count)] for i in range(count)]
    facts = _nvml_probe(gpus, notes)
    nvml_links = any(g.nvlinks for g in gpus)
    smi_text = _run(["nvidia-smi", "nvlink", "-s"])
    smi_used = _merge_smi_links(gpus, parse_nvlink_status(smi_text), notes) if smi_text else False
    source: Literal["nvml", "nvidia-smi", "none"] = "nvml" if nvml_links else ("nvidia-smi" if smi_used else "none")
    if source == "none":
        notes.append("no NVLink found by NVML or nvidia-smi: GPUs talk over PCIe (or the tools are missing)")
    topo_text = _run(["nvidia-smi", "topo", "-m"])
    interconnect = parse_topo_matrix(topo_text) if topo_text else []
    if interconnect and len(interconnect) != count:
        notes.append(f"nvidia-smi shows {len(interconnect)} GPUs, torch sees {count}: interconnect rows are in "
                     "nvidia-smi order")
    for gpu in gpus:
        gpu.multicast_supported = _multicast_attribute(gpu.index)
    flags = [g.multicast_supported for g in gpus]
    multicast = None if None in flags else all(flags)
    if multicast and not base["multicast_disabled_by_policy"]:
        notes.append("the GPUs report NVLink multicast but this process does not switch it off: set "
                     + ", ".join(f"{k}={v}" for k, v in SAFE_ENV.items()))
    driver = facts.get("driver")
    if driver is None:
        out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        driver = out.splitlines()[0].strip() if out and out.strip() else None
    return Topology(gpu_count=count, gpus=gpus, driver=driver, cuda_driver=facts.get("cuda_driver"),
                    nccl=_nccl_version(), peer_access=peer, interconnect=interconnect, nvlink_source=source,
                    multicast_supported=multicast, notes=notes, **base)
