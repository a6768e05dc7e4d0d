"""The machine's GPUs, how they are joined, and what they measurably do: the roofline's ceilings.

`discover()` reads what the machine says about itself (torch, NVML, `nvidia-smi`). It creates nothing on
a GPU beyond torch's own context; NVLink multicast is read as a device attribute only, never exercised.
`calibrate()` measures peer copy, HBM copy and the bf16 matrix rate in this process, and the NCCL
all-reduce curve in one process per GPU (`python -m harness.measure.calibrate_worker`, timed with the harness's
own protocol). `save()` / `load()` keep both as one JSON document in the cache; `ceilings()` gives the
roofline its three numbers, each marked measured or datasheet.

Parent-side only (pydantic). Parsers of `nvidia-smi` text are pure functions, tested on canned output.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field, ValidationError

from harness.common import hostile_files
from harness.common.paths import REPO_ROOT
from harness.config import TimingConfig
from harness.launch.pool import SAFE_ENV, worker_env
from harness.measure.hardware import datasheet
from harness.records.cache_dir import cache_root
from harness.records.environment import hardware_key
from harness.records.results import TimingStats

SCHEMA_VERSION = 1
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
ALL_REDUCE_SIZES = tuple(64 * KiB * 4**k for k in range(8))  # 64 KiB, 256 KiB, ..., 1 GiB
CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 132  # cuda.h; read with cuDeviceGetAttribute, nothing created
NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON = 90  # nvml.h: common speed of the active links, in MB/s

Source = Literal["measured", "datasheet", "unavailable"]


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


class PeerCopy(BaseModel):
    src: int
    dst: int
    median_ms: float
    bytes_per_s: float = Field(description="one direction")


class AllReducePoint(BaseModel):
    bytes: int
    median_us: float
    p10_us: float
    p90_us: float
    cv: float
    host_median_us: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float = Field(description="algbw * 2(W-1)/W, as nccl-tests reports it")


class Calibration(BaseModel):
    measured_at: str
    world_size: int
    copy_bytes: int
    peer_copy: list[PeerCopy] = Field(description="one direction at a time, copy engine, CUDA events")
    peer_copy_bidir: list[PeerCopy] = Field(description="each direction's rate while both run, host clock")
    hbm_copy_bytes_per_s: list[float] = Field(description="per GPU, device-to-device copy, read + write counted")
    matmul_n: int
    matmul_bf16_flops_per_s: list[float] = Field(description="per GPU, n^3 bf16 matmul on random data")
    all_reduce_dtype: str = "bfloat16"
    all_reduce: list[AllReducePoint]
    protocol: dict[str, Any] = Field(default_factory=dict)

    @property
    def link_bytes_per_s(self) -> float | None:
        return max((p.bytes_per_s for p in self.peer_copy), default=None)


class Profile(BaseModel):
    """What the cache holds: the topology, the calibration if one was run, and the hardware key."""

    schema_version: int = SCHEMA_VERSION
    hardware_key: str | None = None
    topology: Topology
    calibration: Calibration | None = None


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
    """True when every multicast switch of harness.launch.pool.SAFE_ENV is set to its off value."""
    env = os.environ if env is None else env
    return all(env.get(key) == value for key, value in SAFE_ENV.items())


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth: the bytes each rank must move, 2(W-1)/W of the buffer, over the time."""
    return nbytes * 2 * (world_size - 1) / world_size / seconds


# -- discovery -------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
        "discovered_at": _now(),
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


# -- calibration -----------------------------------------------------------------------------------


def _sync(devices: Sequence[int]) -> None:
    for d in devices:
        torch.cuda.synchronize(d)


def _event_times_ms(fn: Callable[[], object], device: int, devices: Sequence[int], warmup: int,
                    iters: int) -> list[float]:
    """Each call bracketed by CUDA events on `device`'s current stream (where fn's work is queued)."""
    stream = torch.cuda.current_stream(device)
    for _ in range(warmup):
        fn()
    _sync(devices)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record(stream)
        fn()
        end.record(stream)
    _sync(devices)
    return [start.elapsed_time(end) for start, end in events]


def _random_bytes(nbytes: int, device: int) -> torch.Tensor:
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=f"cuda:{device}")


def peer_copy(src: int, dst: int, nbytes: int = GiB, warmup: int = 3, iters: int = 10) -> PeerCopy:
    """One direction: `dst_tensor.copy_(src_tensor)`, which torch queues on the source GPU's current stream
    as a peer cudaMemcpyAsync (a copy engine)."""
    a = _random_bytes(nbytes, src)
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
    times = _event_times_ms(lambda: b.copy_(a), src, (src, dst), warmup, iters)
    if not torch.equal(a[:4096].cpu(), b[:4096].cpu()):
        raise TopologyError(f"peer copy {src}->{dst} produced wrong bytes")
    median = statistics.median(times)
    return PeerCopy(src=src, dst=dst, median_ms=median, bytes_per_s=nbytes / (median / 1e3))


def peer_copy_bidir(i: int, j: int, nbytes: int = GiB, warmup: int = 3, iters: int = 10) -> list[PeerCopy]:
    """Both directions at once on four private streams (torch's cross-device copy joins the source and
    destination current streams, so sharing them would serialise the two copies). Host clock around
    each synchronised pair of copies; each direction moves `nbytes` in that time."""
    x_i, x_j = _random_bytes(nbytes, i), _random_bytes(nbytes, j)
    y_i = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}")
    y_j = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{j}")
    s_ij_src, s_ij_dst = torch.cuda.Stream(i), torch.cuda.Stream(j)
    s_ji_src, s_ji_dst = torch.cuda.Stream(j), torch.cuda.Stream(i)
    _sync((i, j))

    def both() -> None:
        with torch.cuda.stream(s_ij_src), torch.cuda.stream(s_ij_dst):
            y_j.copy_(x_i)
        with torch.cuda.stream(s_ji_src), torch.cuda.stream(s_ji_dst):
            y_i.copy_(x_j)

    for _ in range(warmup):
        both()
    _sync((i, j))
    times = []
    for _ in range(iters):
        started = time.perf_counter()
        both()
        _sync((i, j))
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    return [PeerCopy(src=s, dst=d, median_ms=median * 1e3, bytes_per_s=nbytes / median) for s, d in ((i, j), (j, i))]


def hbm_copy(device: int, nbytes: int = GiB, warmup: int = 3, iters: int = 10) -> float:
    """Bytes per second through HBM for a device-to-device copy, counting the read and the write."""
    a = _random_bytes(nbytes, device)
    b = torch.empty_like(a)
    times = _event_times_ms(lambda: b.copy_(a), device, (device,), warmup, iters)
    return 2 * nbytes / (statistics.median(times) / 1e3)


def matmul_rate(device: int, n: int = 8192, warmup: int = 10, iters: int = 20) -> float:
    """Dense bf16 FLOP/s of an n x n x n matmul on random data (2 n^3 FLOPs per call), median call."""
    gen = torch.Generator(device=f"cuda:{device}")
    gen.manual_seed(device)
    a = torch.randn(n, n, dtype=torch.bfloat16, device=f"cuda:{device}", generator=gen)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=f"cuda:{device}", generator=gen)
    c = torch.empty_like(a)
    times = _event_times_ms(lambda: torch.mm(a, b, out=c), device, (device,), warmup, iters)
    return 2 * n**3 / (statistics.median(times) / 1e3)


def all_reduce_curve(world_size: int, sizes: Sequence[int] = ALL_REDUCE_SIZES, *,
                     timing: TimingConfig | None = None, timeout_s: float = 600.0,
                     device: Literal["cuda", "cpu"] = "cuda") -> list[AllReducePoint]:
    """NCCL all-reduce (bf16, sum) over `sizes` bytes, one process per GPU, timed with harness.timing's
    protocol (L2 flush, device spin, device barrier, events); per iteration the slowest rank counts.
    `device="cpu"` runs the same plumbing under gloo with host clocks (tests only: no measurement)."""
    config = (timing or TimingConfig()).model_dump()
    sizes_list = list(sizes)
    with tempfile.TemporaryDirectory(prefix="pkb-calibrate-") as tmp:
        folder = Path(tmp)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(world_size):
                with open(folder / f"rank{rank}.log", "wb") as log:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "harness.measure.calibrate_worker", "--rank", str(rank), "--world-size",
                         str(world_size), "--init-file", str(folder / "rendezvous"), "--out", str(folder),
                         "--sizes", ",".join(map(str, sizes)), "--config", json.dumps(config), "--device", device],
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=worker_env(device),
                        cwd=str(REPO_ROOT), start_new_session=True))
            _wait_all(procs, folder, timeout_s)
        finally:
            _kill_groups(procs)
        try:  # every rank exited 0 (_wait_all) and wrote its results, strictly parsed: nothing less counts
            ranks = [hostile_files.read_json(folder / f"rank{r}.json", 64 << 20)["sizes"] for r in range(world_size)]
            if any(not isinstance(sizes, list) or len(sizes) != len(sizes_list) for sizes in ranks):
                raise ValueError("a rank's results do not cover every size")
        except (OSError, ValueError, KeyError, TypeError, hostile_files.HostileFile) as err:
            raise TopologyError(f"all-reduce calibration wrote no usable results ({err})\n"
                                f"{_log_tail(folder, 0)}") from None
    points = []
    for k, nbytes in enumerate(sizes):
        stats = TimingStats.from_rank_loops([ranks[r][k] for r in range(world_size)],
                                       "cuda_events" if device == "cuda" else "host")
        seconds = stats.median_ms / 1e3
        points.append(AllReducePoint(
            bytes=nbytes, median_us=stats.median_ms * 1e3, p10_us=stats.p10_ms * 1e3, p90_us=stats.p90_ms * 1e3,
            cv=stats.cv, host_median_us=stats.host_median_ms * 1e3, algbw_bytes_per_s=nbytes / seconds,
            busbw_bytes_per_s=bus_bandwidth(nbytes, seconds, world_size)))
    return points


def _log_tail(folder: Path, rank: int, limit: int = 2000) -> str:
    try:
        return hostile_files.read_tail(folder / f"rank{rank}.log", limit).decode(errors="replace")
    except (OSError, hostile_files.HostileFile):
        return ""


def _wait_all(procs: list[subprocess.Popen[bytes]], folder: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            r = failed[0]
            raise TopologyError(f"all-reduce calibration: rank {r} exited with code {codes[r]}\n"
                                f"{_log_tail(folder, r)}")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            waiting = [r for r, code in enumerate(codes) if code is None]
            raise TopologyError(f"all-reduce calibration: ranks {waiting} did not finish within {timeout_s:.0f} s\n"
                                f"{_log_tail(folder, waiting[0])}")
        time.sleep(0.2)


def _kill_groups(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def calibrate(world_size: int | None = None, *, copy_bytes: int = GiB, matmul_n: int = 8192,
              all_reduce_sizes: Sequence[int] = ALL_REDUCE_SIZES, timing: TimingConfig | None = None,
              timeout_s: float = 600.0) -> Calibration:
    """Measure this machine's ceilings on GPUs 0..world_size-1 (default: every visible GPU). About a
    minute on two H200s. Raises TopologyError where fewer than two GPUs are visible."""
    os.environ.update(SAFE_ENV)  # this process and the ranks it starts keep NVLink multicast off
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        raise TopologyError(f"calibration needs at least 2 CUDA GPUs; this machine has {count}")
    world_size = count if world_size is None else world_size
    if not 2 <= world_size <= count:
        raise TopologyError(f"calibration world size must be between 2 and {count} (the visible GPUs), "
                            f"got {world_size}")
    devices = range(world_size)
    peer = [peer_copy(s, d, copy_bytes) for s in devices for d in devices if s != d]
    bidir = [p for i, j in itertools.combinations(devices, 2) for p in peer_copy_bidir(i, j, copy_bytes)]
    hbm = [hbm_copy(d, copy_bytes) for d in devices]
    mm = [matmul_rate(d, matmul_n) for d in devices]
    torch.cuda.empty_cache()
    timing = timing or TimingConfig()
    curve = all_reduce_curve(world_size, all_reduce_sizes, timing=timing, timeout_s=timeout_s)
    return Calibration(
        measured_at=_now(), world_size=world_size, copy_bytes=copy_bytes, peer_copy=peer, peer_copy_bidir=bidir,
        hbm_copy_bytes_per_s=hbm, matmul_n=matmul_n, matmul_bf16_flops_per_s=mm, all_reduce=curve,
        protocol={
            "peer_copy": "dst.copy_(src) across GPUs (copy engine), CUDA events on the source stream, "
                         "3 warm-up, median of 10",
            "peer_copy_bidir": "both directions on private streams at once, host clock per synchronised pair, "
                               "3 warm-up, median of 10",
            "hbm_copy": "same-GPU dst.copy_(src), 2 x bytes per call, CUDA events, 3 warm-up, median of 10",
            "matmul": f"torch.mm bf16 {matmul_n}^3 on randn, CUDA events, 10 warm-up, median of 20",
            "all_reduce": "harness.timing protocol, one process per GPU (NCCL, device_id), "
                          "max over ranks per iteration, median",
            "timing_config": timing.model_dump(),
        },
    )


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
