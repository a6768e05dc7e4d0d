"""`pkb topology [--calibrate] [--json] [--out FILE]`: this machine's GPUs, links and ceilings."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from agent.cli.common import CliError, console, err_console, escape, plain
from agent.rundir import write_out_text

if TYPE_CHECKING:
    from harness.measure.calibration import Calibration
    from harness.measure.discovery import Topology
    from harness.measure.topology import Profile


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("topology", help="GPUs, NVLink, peer access, multicast policy and measured ceilings")
    p.add_argument("--calibrate", action="store_true",
                   help="measure peer copy, HBM copy, bf16 matmul and the NCCL all-reduce curve (>= 2 GPUs, "
                        "about a minute) and cache them for the roofline")
    p.add_argument("--json", action="store_true", help="print the profile and ceilings as JSON")
    p.add_argument("--out", default=None, help="also write the profile JSON to this file (default: not written)")
    p.set_defaults(handler=cmd_topology)


def cmd_topology(args: argparse.Namespace) -> int:
    # Deferred: discovery and calibration import torch (and CUDA), which the parser does not need.
    from harness.common.safe_env import SAFE_ENV
    from harness.measure import calibration, discovery, topology
    from harness.records.environment import hardware_key

    if args.calibrate:
        os.environ.update(SAFE_ENV)  # before any CUDA work here: NVLink multicast stays off
    topo = discovery.discover()
    if args.calibrate and topo.gpu_count < 2:
        raise CliError(f"--calibrate needs at least 2 CUDA GPUs; this machine has {topo.gpu_count}")
    key = hardware_key()
    if args.calibrate:
        try:
            with console.status("calibrating: peer copy, HBM, matmul, NCCL all-reduce ...", spinner="dots"):
                measured = calibration.calibrate()
        except discovery.TopologyError as err:
            err_console.print(plain(f"pkb: calibration failed: {err}"))
            return 1
        profile = topology.Profile(hardware_key=key, topology=topo, calibration=measured)
        path = topology.save(profile)
        if not args.json:
            console.print(plain(f"calibration cached in {path}"))
    else:
        profile = topology.Profile(hardware_key=key, topology=topo, calibration=_cached_calibration(key))
    if args.out:
        try:
            write_out_text(Path(args.out), profile.model_dump_json(indent=1))
        except OSError as err:
            raise CliError(f"cannot write {args.out}: {err.strerror or err}") from None
    ceilings = topology.ceilings(profile)
    if args.json:
        print(json.dumps({**profile.model_dump(mode="json"), "ceilings": ceilings}, indent=1))
        return 0
    render(profile, ceilings, SAFE_ENV)
    return 0


def _cached_calibration(key: str) -> Calibration | None:
    """The cached calibration when it was measured in this environment; else None."""
    from harness.measure import discovery, topology  # deferred with cmd_topology's imports (torch)

    try:
        cached = topology.load()
    except discovery.TopologyError as err:
        err_console.print(plain(f"pkb: warning: {err}; ignoring it"))
        return None
    return cached.calibration if cached is not None and cached.hardware_key == key else None


def _gb(value: float | None, scale: float = 1e9, unit: str = "GB/s") -> str:
    digits = 2 if unit == "TB/s" else 1
    return "—" if value is None else f"{value / scale:,.{digits}f} {unit}"


def render(profile: Profile, ceilings: Mapping[str, Any], safe_env: Mapping[str, str]) -> None:
    """The profile as tables; `ceilings` is topology.ceilings(profile), `safe_env` harness.common.safe_env.SAFE_ENV."""
    topo = profile.topology
    console.print(_summary(topo))
    if topo.gpus:
        console.print(_gpu_table(topo))
        console.print(_link_matrix(topo))
    console.print(_multicast_line(topo, safe_env))
    console.print(_ceiling_table(ceilings))
    if profile.calibration is not None:
        _render_calibration(profile)
    for note in topo.notes:
        console.print(f"[dim]note: {escape(note)}[/dim]")


def _summary(topo: Topology) -> str:
    names = sorted({g.name for g in topo.gpus})
    gpus = f"{topo.gpu_count} x {', '.join(names)}" if names else "no GPU"
    facts = [f"driver {topo.driver}" if topo.driver else None,
             f"CUDA {topo.cuda}" + (f" (driver supports {topo.cuda_driver})" if topo.cuda_driver else "")
             if topo.cuda else None,
             f"NCCL {topo.nccl}" if topo.nccl else None, f"torch {topo.torch}"]
    return f"[bold]{escape(gpus)}[/bold]   " + escape("   ".join(f for f in facts if f))


def _gpu_table(topo: Topology) -> Table:
    table = Table(title=f"GPUs (NVLink from {topo.nvlink_source})")
    for col in ("GPU", "name", "memory", "SMs", "L2", "CC", "NVLinks", "per link", "links per direction",
                "multicast attr"):
        table.add_column(col, justify="left" if col == "name" else "right")
    for g in topo.gpus:
        speeds = sorted({link.gbytes_per_s for link in g.nvlinks if link.active and link.gbytes_per_s})
        per_link = ", ".join(f"{s:.3f} GB/s" for s in speeds) or "—"
        multicast = "—" if g.multicast_supported is None else ("yes" if g.multicast_supported else "no")
        table.add_row(str(g.index), plain(g.name), f"{g.memory_bytes / 2**30:.0f} GiB", str(g.sm_count),
                      f"{g.l2_bytes / 2**20:.0f} MiB", g.compute_capability, f"{g.active_links}/{len(g.nvlinks)}",
                      per_link, _gb(g.link_spec_bytes_per_s), multicast)
    return table


def _link_matrix(topo: Topology) -> Table:
    table = Table(title="GPU to GPU: link / peer access")
    table.add_column("")
    for j in range(topo.gpu_count):
        table.add_column(f"GPU{j}", justify="center")
    for i in range(topo.gpu_count):
        cells = []
        for j in range(topo.gpu_count):
            label = topo.interconnect[i][j] if i < len(topo.interconnect) and j < len(topo.interconnect[i]) else "?"
            peer = topo.peer_access[i][j] if i < len(topo.peer_access) else False
            cells.append("X" if i == j else f"{label} / {'P2P' if peer else 'no P2P'}")
        table.add_row(f"GPU{i}", *cells)
    return table


def _multicast_line(topo: Topology, safe_env: Mapping[str, str]) -> str:
    attr = {True: "the GPUs report it supported", False: "not supported by the GPUs",
            None: "support unknown"}[topo.multicast_supported]
    env = ", ".join(f"{k}={topo.multicast_env.get(k)}" for k in safe_env)
    policy = "[green]disabled by policy[/green]" if topo.multicast_disabled_by_policy else "[red]NOT disabled[/red]"
    return f"NVLink multicast: {attr}; {policy} ({escape(env)})"


def _ceiling_table(c: Mapping[str, Any]) -> Table:
    table = Table(title=f"roofline ceilings ({c['source']})")
    for col in ("ceiling", "value", "source"):
        table.add_column(col, justify="right" if col == "value" else "left")
    table.add_row("link, per direction", _gb(c["link_bytes_per_s"]), c["link_source"])
    table.add_row("NVLink spec, per direction", _gb(c["link_spec_bytes_per_s"]), "links x speed")
    table.add_row("HBM (read + write)", _gb(c["hbm_bytes_per_s"], 1e12, "TB/s"), c["hbm_source"])
    table.add_row("bf16 matmul", _gb(c["matmul_flops_per_s"], 1e12, "TFLOP/s"), c["matmul_source"])
    for note in c["notes"]:
        table.caption = (table.caption + "; " if table.caption else "") + escape(note)
    return table


def _render_calibration(profile: Profile) -> None:
    cal = profile.calibration
    assert cal is not None
    table = Table(title=f"measured {cal.measured_at} on {cal.world_size} GPUs ({cal.copy_bytes / 2**30:g} GiB copies)")
    for col in ("measurement", "value"):
        table.add_column(col, justify="right" if col == "value" else "left")
    for p in cal.peer_copy:
        table.add_row(f"peer copy {p.src} -> {p.dst}", _gb(p.bytes_per_s))
    for p in cal.peer_copy_bidir:
        table.add_row(f"peer copy {p.src} -> {p.dst}, both directions at once", _gb(p.bytes_per_s))
    for d, v in enumerate(cal.hbm_copy_bytes_per_s):
        table.add_row(f"HBM copy GPU {d} (read + write)", _gb(v, 1e12, "TB/s"))
    for d, v in enumerate(cal.matmul_bf16_flops_per_s):
        table.add_row(f"bf16 matmul {cal.matmul_n}^3 GPU {d}", _gb(v, 1e12, "TFLOP/s"))
    console.print(table)
    curve = Table(title=f"NCCL all-reduce ({cal.all_reduce_dtype}, sum, W={cal.world_size})")
    for col in ("size", "median µs", "p10 µs", "p90 µs", "CV", "host µs", "algbw GB/s", "busbw GB/s"):
        curve.add_column(col, justify="right")
    for pt in cal.all_reduce:
        curve.add_row(_size(pt.bytes), f"{pt.median_us:.1f}", f"{pt.p10_us:.1f}", f"{pt.p90_us:.1f}", f"{pt.cv:.3f}",
                      f"{pt.host_median_us:.1f}", f"{pt.algbw_bytes_per_s / 1e9:.1f}",
                      f"{pt.busbw_bytes_per_s / 1e9:.1f}")
    console.print(curve)


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"
