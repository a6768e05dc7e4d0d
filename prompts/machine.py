"""The machine a task prompt describes: a short summary of the `pkb topology` profile, and the target."""

from __future__ import annotations

import json
from typing import Any


def _gib(n: Any) -> str | None:
    return f"{n / 2**30:.0f} GiB" if isinstance(n, (int, float)) else None


def topology_summary(topology: dict[str, Any]) -> dict[str, Any]:
    """What the model needs from a topology record: GPUs, links, measured ceilings, multicast.

    Takes a harness.measure.topology Profile dump ({"topology": ..., "calibration": ...}, optionally with the
    roofline's "ceilings"), or a bare Topology dump; anything else is passed through as it is."""
    topo = topology.get("topology", topology)
    if not isinstance(topo, dict) or "gpus" not in topo:
        return dict(topology)
    cal = topology.get("calibration") or {}
    gpus = topo.get("gpus") or []
    first = gpus[0] if gpus else {}
    links = [link for link in first.get("nvlinks", []) if link.get("active")]
    summary: dict[str, Any] = {
        "gpus": {"count": topo.get("gpu_count", len(gpus)), "name": first.get("name"),
                 "compute_capability": first.get("compute_capability"), "sms": first.get("sm_count"),
                 "memory": _gib(first.get("memory_bytes")),
                 "l2_mib": round(first["l2_bytes"] / 2**20, 1) if first.get("l2_bytes") else None},
        "interconnect": topo.get("interconnect") or None,
        "nvlinks_per_gpu": len(links) or None,
        "nvlink_gbytes_per_s_per_link": links[0].get("gbytes_per_s") if links else None,
        "peer_access": topo.get("peer_access") or None,
        "versions": {k: topo.get(k) for k in ("torch", "cuda", "driver", "nccl") if topo.get(k)},
    }
    measured: dict[str, Any] = {}
    if cal.get("peer_copy"):
        measured["peer_copy_gbytes_per_s_one_way"] = round(max(p["bytes_per_s"] for p in cal["peer_copy"]) / 1e9, 1)
    if cal.get("peer_copy_bidir"):
        measured["peer_copy_gbytes_per_s_each_way_bidirectional"] = round(
            min(p["bytes_per_s"] for p in cal["peer_copy_bidir"]) / 1e9, 1)
    if cal.get("hbm_copy_bytes_per_s"):
        measured["hbm_copy_tbytes_per_s_read_plus_write"] = round(max(cal["hbm_copy_bytes_per_s"]) / 1e12, 2)
    if cal.get("matmul_bf16_flops_per_s"):
        measured["bf16_matmul_tflops"] = round(max(cal["matmul_bf16_flops_per_s"]) / 1e12)
    if cal.get("all_reduce"):
        measured["nccl_all_reduce_bf16"] = [
            {"bytes": p["bytes"], "median_us": round(p["median_us"], 1),
             "busbw_gbytes_per_s": round(p["busbw_bytes_per_s"] / 1e9, 1)} for p in cal["all_reduce"]]
    if measured:
        summary["measured"] = measured
    if topology.get("ceilings"):
        summary["roofline_ceilings"] = topology["ceilings"]
    summary["multicast"] = {"hardware_supported": topo.get("multicast_supported"), "allowed": False,
                            "disabled_by_policy": topo.get("multicast_disabled_by_policy", True)}
    return {k: v for k, v in summary.items() if v not in (None, {}, [])}


def topology_text(topology: dict[str, Any] | None) -> str:
    if not topology:
        return ("No topology was measured for this run. NVLink multicast is disabled on these machines and "
                "must not be used.")
    summary = topology_summary(topology)
    multicast = summary.get("multicast", {}) if isinstance(summary.get("multicast"), dict) else {}
    exists = multicast.get("hardware_supported")
    said = {True: "reports multicast support", False: "reports no multicast support",
            None: "multicast support unknown"}.get(exists, "multicast support unknown")
    return (f"```json\n{json.dumps(summary, indent=1)}\n```\n\nMulticast: the hardware {said}; NVLink multicast "
            "is disabled on these machines and must not be used.")


def target(topology: dict[str, Any] | None) -> str:
    summary = topology_summary(topology) if topology else {}
    gpus = summary.get("gpus") if isinstance(summary.get("gpus"), dict) else None
    if gpus and gpus.get("compute_capability"):
        arch = "sm_" + str(gpus["compute_capability"]).replace(".", "")
        return f"{gpus.get('count')} x {gpus.get('name')} ({arch})"
    return "NVIDIA GPUs (the scoring machines are H200, sm_90)"
