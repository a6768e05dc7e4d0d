"""The environment every process the harness starts gets, whatever else it is given."""

from __future__ import annotations

# NVLink multicast stays off on every machine this runs on (docs/design.md, "The measured machine").
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
