"""Topology: nvidia-smi parsers on canned output, CPU-only discovery, the cached profile, the ceilings'
fallback rules and `pkb topology`. GPU tests (marked) run discovery and a short calibration."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from agent import cli
from agent.cli import topology as cli_topology
from harness.common.safe_env import SAFE_ENV
from harness.config import TimingConfig
from harness.measure import discovery
from harness.measure.calibration import (
    AllReducePoint,
    Calibration,
    GiB,
    MiB,
    PeerCopy,
    all_reduce_curve,
    bus_bandwidth,
    calibrate,
)
from harness.measure.discovery import (
    Gpu,
    NvLink,
    Topology,
    TopologyError,
    discover,
    multicast_disabled_by_policy,
    nvlink_count,
    nvml_field_number,
    parse_nvlink_status,
    parse_topo_matrix,
)
from harness.measure.hardware import datasheet
from harness.measure.topology import Profile, cache_path, ceilings, load, save
from harness.records.environment import hardware_key
from tests.conftest import live_children

UUID0 = "GPU-3a1e4c52-8f7b-2d9a-6c05-b1e9f0d47a21"
UUID1 = "GPU-c7d2915e-04ab-7f31-9e68-2b5fa0c3d819"

# `nvidia-smi topo -m` on the 2 x H200 machine (driver 580): the header is underlined with ANSI codes even
# when piped; NIC rows and two legends follow.
TOPO_H200 = (
    "\t\x1b[4mGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tPXB\tSYS\t0-47,96-143\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\tPXB\t48-95,144-191\t1\t\tN/A\n"
    "NIC0\tPXB\tSYS\t X \tSYS\t\t\t\t\n"
    "NIC1\tSYS\tPXB\tSYS\t X \t\t\t\t\n"
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
    "\n"
    "NIC Legend:\n"
    "\n"
    "  NIC0: mlx5_0\n"
    "  NIC1: mlx5_1\n"
)

# Two PCIe GPUs behind one host bridge, no NVLink, no NICs, no ANSI codes.
TOPO_PCIE = (
    "        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
    "GPU0     X      PHB     0-31    0               N/A\n"
    "GPU1    PHB      X      0-31    0               N/A\n"
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
)


def nvlink_status(uuid: str, index: int, inactive: tuple[int, ...] = ()) -> str:
    lines = [f"GPU {index}: NVIDIA H200 (UUID: {uuid})"]
    lines += [f"\t Link {k}: " + ("<inactive>" if k in inactive else "26.562 GB/s") for k in range(18)]
    return "\n".join(lines) + "\n"


NVLINK_H200 = nvlink_status(UUID0, 0) + nvlink_status(UUID1, 1)


def h200_topology(with_links: bool = True) -> Topology:
    links = [NvLink(link=k, active=True, gbytes_per_s=26.562, version=6) for k in range(18)] if with_links else []
    gpus = [Gpu(index=i, name="NVIDIA H200", uuid=u, memory_bytes=150_754_820_096, sm_count=132,
                l2_bytes=62_914_560, compute_capability="9.0", nvlinks=[x.model_copy() for x in links],
                multicast_supported=True) for i, u in enumerate((UUID0, UUID1))]
    return Topology(discovered_at="2026-01-01T00:00:00+00:00", gpu_count=2, gpus=gpus, torch="2.11.0",
                    cuda="13.0", cuda_driver="13.0", driver="580.95.05", nccl="2.28.3",
                    peer_access=[[True, True], [True, True]], interconnect=[["X", "NV18"], ["NV18", "X"]],
                    nvlink_source="nvml" if with_links else "none", multicast_supported=True,
                    multicast_disabled_by_policy=True, multicast_env=dict(SAFE_ENV))


def h200_calibration() -> Calibration:
    points = [AllReducePoint(bytes=n, median_us=us, p10_us=us * 0.98, p90_us=us * 1.03, cv=0.02,
                             host_median_us=us + 30, algbw_bytes_per_s=n / (us / 1e6),
                             busbw_bytes_per_s=bus_bandwidth(n, us / 1e6, 2))
              for n, us in ((64 * 1024, 11.5), (MiB, 27.0), (GiB, 3234.0))]
    return Calibration(
        measured_at="2026-01-01T00:00:00+00:00", world_size=2, copy_bytes=GiB,
        peer_copy=[PeerCopy(src=0, dst=1, median_ms=2.725, bytes_per_s=394e9),
                   PeerCopy(src=1, dst=0, median_ms=2.731, bytes_per_s=393e9)],
        peer_copy_bidir=[PeerCopy(src=0, dst=1, median_ms=2.9, bytes_per_s=370e9),
                         PeerCopy(src=1, dst=0, median_ms=2.9, bytes_per_s=370e9)],
        hbm_copy_bytes_per_s=[4.28e12, 4.27e12], matmul_n=8192, matmul_bf16_flops_per_s=[7.9e14, 7.85e14],
        all_reduce=points)


# -- parsers ---------------------------------------------------------------------------------------


def test_topo_matrix_of_the_h200_pair():
    cells = parse_topo_matrix(TOPO_H200)
    assert cells == [["X", "NV18"], ["NV18", "X"]]
    assert [nvlink_count(c) for c in cells[0]] == [0, 18]


def test_topo_matrix_over_pcie_has_no_nvlink():
    cells = parse_topo_matrix(TOPO_PCIE)
    assert cells == [["X", "PHB"], ["PHB", "X"]]
    assert nvlink_count(cells[0][1]) == 0


def test_topo_matrix_of_nonsense_is_empty():
    assert parse_topo_matrix("") == []
    assert parse_topo_matrix("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.") == []


def test_nvlink_status_lists_18_links_at_26_562():
    gpus = parse_nvlink_status(NVLINK_H200)
    assert [(g.index, g.name, g.uuid) for g in gpus] == [(0, "NVIDIA H200", UUID0), (1, "NVIDIA H200", UUID1)]
    for g in gpus:
        assert len(g.links) == 18 and all(link.active and link.gbytes_per_s == 26.562 for link in g.links)
        assert sum(link.gbytes_per_s or 0.0 for link in g.links) == pytest.approx(478.1, abs=0.1)  # DESIGN: 478 GB/s


def test_nvlink_status_marks_inactive_links():
    [gpu] = parse_nvlink_status(nvlink_status(UUID0, 0, inactive=(3, 17)))
    down = [link.link for link in gpu.links if not link.active]
    assert down == [3, 17]
    assert all(link.gbytes_per_s is None for link in gpu.links if not link.active)


def test_nvml_field_values_by_type():
    ok = SimpleNamespace(nvmlReturn=0, valueType=1, value=SimpleNamespace(uiVal=26562))
    assert nvml_field_number(ok) == 26562.0
    as_long = SimpleNamespace(nvmlReturn=0, valueType=3, value=SimpleNamespace(ullVal=7))
    assert nvml_field_number(as_long) == 7.0
    assert nvml_field_number(SimpleNamespace(nvmlReturn=3, valueType=1, value=SimpleNamespace(uiVal=1))) is None
    assert nvml_field_number(SimpleNamespace(nvmlReturn=0, valueType=99, value=None)) is None


def test_multicast_policy_needs_every_switch_off():
    assert multicast_disabled_by_policy(dict(SAFE_ENV))
    assert not multicast_disabled_by_policy({})
    assert not multicast_disabled_by_policy({**SAFE_ENV, "NCCL_NVLS_ENABLE": "1"})


def test_datasheet_matches_specific_names_first():
    assert datasheet("NVIDIA H200") == (4.8e12, 989.4e12)
    assert (datasheet("NVIDIA H100 PCIe") or (0.0,))[0] == 2.0e12
    assert (datasheet("NVIDIA H100 80GB HBM3") or (0.0,))[0] == 3.35e12
    assert datasheet("Tesla T4") is None


def test_bus_bandwidth_follows_nccl_tests():
    # DESIGN: 1 MiB all-reduce in 27 µs on two GPUs is 39 GB/s of bus bandwidth.
    assert bus_bandwidth(MiB, 27e-6, 2) / 1e9 == pytest.approx(38.8, abs=0.1)
    assert bus_bandwidth(MiB, 1.0, 8) == MiB * 2 * 7 / 8


# -- discovery, cache, ceilings ------------------------------------------------------------------


def test_cpu_only_discovery_says_so(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    for key, value in SAFE_ENV.items():
        monkeypatch.setenv(key, value)
    topo = discover()
    assert topo.gpu_count == 0 and topo.gpus == [] and topo.nvlink_source == "none"
    assert topo.multicast_disabled_by_policy and topo.multicast_supported is None
    assert any("no CUDA device" in note for note in topo.notes)
    assert topo.link_spec_bytes_per_s is None


def test_profile_json_round_trip(tmp_path):
    profile = Profile(hardware_key="abc", topology=h200_topology(), calibration=h200_calibration())
    path = save(profile, tmp_path / "sub" / "topology.json")
    assert load(path) == profile
    assert json.loads(path.read_text())["topology"]["interconnect"][0][1] == "NV18"


def test_load_missing_is_none_and_malformed_raises(tmp_path):
    assert load(tmp_path / "none.json") is None
    bad = tmp_path / "bad.json"
    bad.write_text('{"topology": 3}')
    with pytest.raises(TopologyError, match="not a topology profile"):
        load(bad)


def test_ceilings_fall_back_to_the_nvlink_spec_and_datasheet():
    c = ceilings(Profile(topology=h200_topology()))
    assert c["link_source"] == "datasheet" and c["link_bytes_per_s"] == pytest.approx(18 * 26.562e9)
    assert c["link_spec_bytes_per_s"] == pytest.approx(18 * 26.562e9)
    assert (c["hbm_bytes_per_s"], c["hbm_source"]) == (4.8e12, "datasheet")
    assert (c["matmul_flops_per_s"], c["matmul_source"]) == (989.4e12, "datasheet")
    assert c["source"] == "datasheet"
    assert any("not measured" in note for note in c["notes"])


def test_ceilings_prefer_measurements():
    c = ceilings(Profile(topology=h200_topology(), calibration=h200_calibration()))
    assert (c["link_bytes_per_s"], c["link_source"]) == (394e9, "measured")
    assert (c["hbm_bytes_per_s"], c["matmul_flops_per_s"]) == (4.28e12, 7.9e14)
    assert c["source"] == "measured" and c["calibrated_at"] == "2026-01-01T00:00:00+00:00"


def test_ceilings_without_links_or_gpus():
    c = ceilings(Profile(topology=h200_topology(with_links=False)))
    assert (c["link_bytes_per_s"], c["link_source"]) == (None, "unavailable")
    assert c["hbm_source"] == "datasheet" and c["source"] == "mixed"
    empty = Topology(discovered_at="x", gpu_count=0, torch="2.13.0", multicast_disabled_by_policy=False)
    c = ceilings(Profile(topology=empty))
    assert c["source"] == "unavailable" and c["link_bytes_per_s"] is None and c["hbm_bytes_per_s"] is None


def test_ceilings_read_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_CACHE_DIR", str(tmp_path))
    save(Profile(topology=h200_topology(), calibration=h200_calibration()))
    assert cache_path() == tmp_path / "topology.json"
    assert ceilings()["link_source"] == "measured"
    cache_path().write_text("not json")
    c = ceilings()  # an unreadable cache is ignored, not fatal
    assert any("ignored the cache" in note for note in c["notes"])


# -- the CLI ---------------------------------------------------------------------------------------


@pytest.fixture
def pkb(monkeypatch):
    if cli_topology not in cli.COMMAND_MODULES:  # until agent/cli.py registers the command
        monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, cli_topology))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    return cli.main


def test_cli_json_on_cpu(pkb, capsys, tmp_path):
    out = tmp_path / "profile.json"
    assert pkb(["topology", "--json", "--out", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["topology"]["gpu_count"] == 0 and data["calibration"] is None
    assert data["ceilings"]["source"] == "unavailable"
    assert Profile.model_validate_json(out.read_text()).topology.gpu_count == 0


def test_cli_table_on_cpu(pkb, capsys):
    assert pkb(["topology"]) == 0
    out = capsys.readouterr().out
    assert "no GPU" in out and "NVLink multicast" in out and "roofline ceilings" in out


def test_cli_calibrate_on_cpu_is_one_line(pkb, capsys):
    assert pkb(["topology", "--calibrate"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--calibrate needs at least 2 CUDA GPUs; this machine has 0" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_calibrate_refuses_without_two_gpus(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(TopologyError, match="at least 2 CUDA GPUs"):
        calibrate()


# -- on the GPUs -----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_discover_on_gpus():
    topo = discover()
    assert topo.gpu_count >= 2 and topo.driver and topo.nccl
    for g in topo.gpus:
        assert g.memory_bytes > 0 and g.sm_count > 0 and g.l2_bytes > 0
    assert all(topo.peer_access[i][i] for i in range(topo.gpu_count))
    assert Topology.model_validate_json(topo.model_dump_json()) == topo
    if all("H200" in g.name for g in topo.gpus):  # the reference machine (docs/design.md)
        assert topo.interconnect[0][1] == "NV18"
        assert all(g.active_links == 18 for g in topo.gpus)
        assert topo.link_spec_bytes_per_s == pytest.approx(478e9, rel=0.01)
        assert topo.peer_access[0][1] and topo.peer_access[1][0]


@pytest.mark.gpu
def test_short_calibration_on_gpus():
    cal = calibrate(2, copy_bytes=64 * MiB, matmul_n=2048, all_reduce_sizes=(64 * 1024, MiB),
                    timing=TimingConfig(warmup=3, iters=10, host_iters=2), timeout_s=300)
    assert {(p.src, p.dst) for p in cal.peer_copy} == {(0, 1), (1, 0)}
    assert all(p.bytes_per_s > 1e9 for p in cal.peer_copy + cal.peer_copy_bidir)
    assert all(v > 1e11 for v in cal.hbm_copy_bytes_per_s) and all(v > 1e12 for v in cal.matmul_bf16_flops_per_s)
    assert [p.bytes for p in cal.all_reduce] == [64 * 1024, MiB]
    assert all(p.busbw_bytes_per_s > 0 and p.p10_us <= p.median_us <= p.p90_us for p in cal.all_reduce)
    c = ceilings(Profile(topology=discover(), calibration=cal))
    assert c["link_source"] == c["hbm_source"] == c["matmul_source"] == "measured"


# -- the GPU code paths, driven on CPU with stand-ins ------------------------------------------------


def test_all_reduce_plumbing_on_cpu():
    # The same worker, rendezvous, result files and max-over-ranks statistics as on the GPUs, under gloo.
    points = all_reduce_curve(2, (4096, 64 * 1024), device="cpu", timeout_s=120,
                              timing=TimingConfig(warmup=1, iters=4, host_iters=1))
    assert [p.bytes for p in points] == [4096, 64 * 1024]
    for p in points:
        assert 0 < p.p10_us <= p.median_us <= p.p90_us
        assert p.busbw_bytes_per_s == pytest.approx(bus_bandwidth(p.bytes, p.median_us / 1e6, 2))
    assert live_children() == []


def test_all_reduce_failure_is_reported_with_the_log(monkeypatch):
    with pytest.raises(TopologyError, match=r"rank \d exited with code") as err:
        all_reduce_curve(2, (-8,), device="cpu", timeout_s=120, timing=TimingConfig(warmup=1, iters=2, host_iters=1))
    assert "Error" in str(err.value)  # the rank's traceback tail travels with the message
    assert live_children() == []


class FakeNvml:
    """Enough of pynvml for discover(): two H200s, 18 active links each, speed from the common field."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON = 90

    class NVMLError(Exception):
        pass

    def __init__(self, speed_mbps: int | None = 26562) -> None:
        self.speed_mbps = speed_mbps
        self.shut = False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.95.05"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> str:
        assert isinstance(uuid, bytes)
        return uuid.decode()

    def nvmlDeviceGetFieldValues(self, handle: str, fields: list[int]) -> list[SimpleNamespace]:
        assert fields == [90]
        ok = self.speed_mbps is not None
        return [SimpleNamespace(nvmlReturn=0 if ok else 3, valueType=1, value=SimpleNamespace(uiVal=self.speed_mbps))]

    def nvmlDeviceGetNvLinkState(self, handle: str, link: int) -> int:
        if link >= 18:
            raise self.NVMLError("Invalid Argument")
        return 1

    def nvmlDeviceGetNvLinkVersion(self, handle: str, link: int) -> int:
        return 6


def fake_gpu_machine(monkeypatch, nvml: FakeNvml | None, smi: dict[str, str | None]) -> None:
    props = [SimpleNamespace(name="NVIDIA H200", uuid=u.removeprefix("GPU-"), total_memory=150_754_820_096,
                             multi_processor_count=132, L2_cache_size=62_914_560, major=9, minor=0)
             for u in (UUID0, UUID1)]
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    monkeypatch.setattr("torch.cuda.get_device_properties", lambda i: props[i])
    monkeypatch.setattr("torch.cuda.can_device_access_peer", lambda i, j: True)
    monkeypatch.setattr("torch.cuda.nccl.version", lambda: (2, 28, 3))
    monkeypatch.setattr(discovery, "_multicast_attribute", lambda i: True)
    monkeypatch.setattr(discovery, "_run", lambda argv: smi.get(" ".join(argv[1:3])))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for key, value in SAFE_ENV.items():
        monkeypatch.setenv(key, value)


def test_discover_reads_nvml(monkeypatch):
    nvml = FakeNvml()
    fake_gpu_machine(monkeypatch, nvml, {"topo -m": TOPO_H200, "nvlink -s": NVLINK_H200})
    topo = discover()
    assert nvml.shut and topo.nvlink_source == "nvml" and topo.notes == []
    assert (topo.gpu_count, topo.driver, topo.cuda_driver, topo.nccl) == (2, "580.95.05", "13.0", "2.28.3")
    assert [g.uuid for g in topo.gpus] == [UUID0, UUID1]
    assert all(g.active_links == 18 and g.nvlinks[0].version == 6 for g in topo.gpus)
    assert topo.link_spec_bytes_per_s == pytest.approx(18 * 26.562e9)
    assert topo.interconnect == [["X", "NV18"], ["NV18", "X"]] and topo.peer_access == [[True, True], [True, True]]
    assert topo.multicast_supported and topo.multicast_disabled_by_policy


def test_discover_takes_speeds_from_nvidia_smi_when_nvml_has_none(monkeypatch):
    fake_gpu_machine(monkeypatch, FakeNvml(speed_mbps=None), {"topo -m": TOPO_H200, "nvlink -s": NVLINK_H200})
    topo = discover()
    assert topo.link_spec_bytes_per_s == pytest.approx(18 * 26.562e9)


def test_discover_without_pynvml_uses_nvidia_smi(monkeypatch):
    fake_gpu_machine(monkeypatch, None, {"topo -m": TOPO_H200, "nvlink -s": NVLINK_H200,
                                         "--query-gpu=driver_version --format=csv,noheader": "580.95.05\n"})
    monkeypatch.setattr(discovery, "_run", lambda argv: {"topo": TOPO_H200, "nvlink": NVLINK_H200}.get(
        argv[1], "580.95.05\n"))
    topo = discover()
    assert topo.nvlink_source == "nvidia-smi" and topo.driver == "580.95.05"
    assert all(g.active_links == 18 for g in topo.gpus)
    assert any("pynvml" in note for note in topo.notes)


def test_discover_without_any_nvlink_says_so(monkeypatch):
    fake_gpu_machine(monkeypatch, None, {})
    monkeypatch.setattr(discovery, "_run", lambda argv: TOPO_PCIE if argv[1] == "topo" else None)
    topo = discover()
    assert topo.nvlink_source == "none" and topo.link_spec_bytes_per_s is None
    assert topo.interconnect == [["X", "PHB"], ["PHB", "X"]]
    assert any("no NVLink" in note for note in topo.notes)


def test_discover_prefers_nvidia_smi_speed_when_nvml_disagrees(monkeypatch):
    fake_gpu_machine(monkeypatch, FakeNvml(speed_mbps=25000), {"topo -m": TOPO_H200, "nvlink -s": NVLINK_H200})
    topo = discover()
    assert topo.link_spec_bytes_per_s == pytest.approx(18 * 26.562e9)
    assert any("taking nvidia-smi's" in note for note in topo.notes)


def test_cli_shows_the_cached_calibration_of_this_environment(pkb, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("harness.measure.discovery.discover", h200_topology)
    save(Profile(hardware_key=hardware_key(), topology=h200_topology(), calibration=h200_calibration()))
    assert pkb(["topology"]) == 0
    out = capsys.readouterr().out
    assert "2 x NVIDIA H200" in out and "NV18 / P2P" in out and "disabled by policy" in out
    assert "394.0 GB/s" in out and "478.1 GB/s" in out and "NCCL all-reduce" in out
    save(Profile(hardware_key="elsewhere", topology=h200_topology(), calibration=h200_calibration()))
    assert pkb(["topology", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["calibration"] is None and data["ceilings"]["link_source"] == "datasheet"
