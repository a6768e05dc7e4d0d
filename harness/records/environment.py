"""The environment an evaluation ran in: what a reader needs to compare two numbers."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from functools import lru_cache
from typing import Any

import torch


def _nvidia_smi(query: str) -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


@lru_cache(maxsize=1)
def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        "multicast_env": {k: os.environ.get(k) for k in
                          ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")},
    }
    if torch.cuda.is_available():
        env["cuda"] = torch.version.cuda
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["gpu_count"] = torch.cuda.device_count()
        try:
            env["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # NCCL missing from this build
            env["nccl"] = None
        drivers = _nvidia_smi("driver_version")
        env["driver"] = drivers[0] if drivers else None
    return env


def hardware_key(env: dict[str, Any] | None = None) -> str:
    """A short hash of what changes timings: GPUs, driver, CUDA, NCCL, torch (not the host name)."""
    env = env or environment()
    keys = ("torch", "cuda", "gpus", "driver", "nccl", "cpu_count", "platform")
    blob = json.dumps({k: env.get(k) for k in keys}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


