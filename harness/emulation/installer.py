"""Swap the emulation in for torch's symmetric memory, and refuse what cannot be emulated, before any
candidate is imported.

What `install` changes in this process (and `uninstall` puts back, for tests):
- torch.distributed._symmetric_memory: `empty`, `rendezvous`, `is_symm_mem_tensor`, the signal-pad size,
  backend queries and `get_symm_mem_workspace` are the emulation's; every other public function of the
  module (NCCL one-sided signals, memory pools, ...) refuses;
- torch._C._distributed_c10d._SymmetricMemory: its static `rendezvous` and `empty_strided_p2p` are the
  emulation's too (a candidate that calls the low-level class gets the same memory);
- torch.ops.symm_mem.*: every operator except memset32_ and stream_write_value32_ (which need no
  symmetric memory) refuses, on CUDA and CPU tensors, through the dispatcher, so no import path escapes;
- NCCL: new_group / new_subgroups with an NCCL backend, torch.distributed.ProcessGroupNCCL and
  torch.cuda.nccl's collectives refuse;
- torch's inline-extension builds rewrite multimem instructions into unicast accesses, scan what was
  built and bind it to the emulated multicast windows (harness.emulation.build_hook);
- the environment keeps NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
  NVSHMEM_DISABLE_NVLS=1) for anything the rank starts.
Refusals raise harness.emulation.errors.NotAvailableInEmulation.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, cast

import torch
import torch.distributed as dist

from harness.common.safe_env import SAFE_ENV
from harness.emulation import api, build_hook
from harness.emulation.errors import NotAvailableInEmulation

# torch.ops.symm_mem operators that touch a plain tensor only: torch's own kernels serve them.
SERVED_OPS = frozenset({"memset32_", "stream_write_value32_"})

_installed: dict[str, Any] = {}  # what install() replaced: restored by uninstall()


def install(store: Any = None) -> api.Emulation:
    """Put the emulation in place in this rank process; idempotent. Call after
    dist.init_process_group (gloo) and torch.cuda.set_device, before the candidate is imported.
    `store`: the store ranks exchange IPC handles in (default: the default group's store)."""
    if "emulation" in _installed:
        return cast(api.Emulation, _installed["emulation"])  # written below, the key's only writer
    import torch.distributed._symmetric_memory as symm_mem

    os.environ.update(SAFE_ENV)
    emulation = api.Emulation(store)
    _installed["emulation"] = emulation
    _patch_module(symm_mem, emulation)
    _patch_low_level_class(emulation)
    _refuse_operators()
    _refuse_nccl()
    build_hook.install(strict=True, bind=emulation.multicast.bind)
    return emulation


def installed() -> api.Emulation | None:
    return _installed.get("emulation")


def uninstall() -> None:
    """Restore what install() replaced (tests only: a rank process never goes back)."""
    for (owner, name), value in _installed.pop("attributes", {}).items():
        setattr(owner, name, value)
    build_hook.uninstall()
    library = _installed.pop("library", None)
    if library is not None:
        library._destroy()
    _installed.clear()


def _replace(owner: Any, name: str, value: Any) -> None:
    saved = _installed.setdefault("attributes", {})
    if (owner, name) not in saved:
        saved[(owner, name)] = getattr(owner, name)
    setattr(owner, name, value)


# Pure tensor helpers of the module (layout of a matmul's operand): they touch no symmetric memory.
PURE_HELPERS = frozenset({"make_contiguous_for_perm", "restride_A_shard_for_fused_all_gather_matmul",
                          "restride_A_for_fused_matmul_reduce_scatter"})


# What the module's own functions become; anything public and callable not named here refuses.
def _module_table(emulation: api.Emulation) -> dict[str, Any]:
    return {
        "empty": emulation.empty,
        "rendezvous": emulation.rendezvous,
        "is_symm_mem_tensor": emulation.is_symm_mem_tensor,
        "get_symm_mem_workspace": emulation.get_symm_mem_workspace,
        "set_signal_pad_size": emulation.set_signal_pad_size,
        "get_signal_pad_size": emulation.get_signal_pad_size,
        "set_backend": api.set_backend,
        "get_backend": api.get_backend,
        "is_nvshmem_available": api.is_nvshmem_available,
        "enable_symm_mem_for_group": api.enable_symm_mem_for_group,
        "is_symm_mem_enabled_for_group": api.is_symm_mem_enabled_for_group,
    }


def _patch_module(symm_mem: Any, emulation: api.Emulation) -> None:
    table = _module_table(emulation)
    for name, value in table.items():
        if hasattr(symm_mem, name):
            _replace(symm_mem, name, value)
    for name, value in list(vars(symm_mem).items()):
        if name.startswith("_") or name in table or name in PURE_HELPERS or not inspect.isfunction(value):
            continue
        if value.__module__ != symm_mem.__name__:
            continue  # imported helpers (overload, contextmanager, ...), not the module's API
        _replace(symm_mem, name, api.refusing("symm_mem_api", f"symm_mem.{name}",
                                              "needs torch's own symmetric-memory backend"))


def _patch_low_level_class(emulation: api.Emulation) -> None:
    from torch._C._distributed_c10d import _SymmetricMemory

    def empty_strided_p2p(size: Any, stride: Any, dtype: torch.dtype, device: Any, *args: Any,
                          **kwargs: Any) -> torch.Tensor:
        out = emulation.empty(tuple(size), dtype=dtype, device=device)
        if tuple(stride) != tuple(out.stride()):
            raise NotAvailableInEmulation("symm_mem_api", "_SymmetricMemory.empty_strided_p2p",
                                          "only contiguous strides are emulated")
        return out

    def rendezvous(tensor: torch.Tensor, group_name: str | None = None) -> Any:
        if group_name is None:
            group_name = dist.group.WORLD.group_name  # type: ignore[union-attr]
        return emulation.rendezvous(tensor, group_name)

    replacements = {
        "empty_strided_p2p": staticmethod(empty_strided_p2p),
        "rendezvous": staticmethod(rendezvous),
        "has_multicast_support": staticmethod(lambda *args, **kwargs: False),
        "is_symm_mem_tensor": staticmethod(emulation.is_symm_mem_tensor),
        "get_mempool_allocator": staticmethod(api.refusing("symm_mem_api", "_SymmetricMemory.get_mempool_allocator",
                                                           "torch's symmetric allocator is not emulated")),
        "set_group_info": staticmethod(lambda *args, **kwargs: None),
    }
    for name, value in replacements.items():
        try:
            _replace(_SymmetricMemory, name, value)
        except (AttributeError, TypeError):  # a build whose class refuses new attributes keeps its own
            continue


def _refuse_operators() -> None:
    """A refusing kernel for every torch.ops.symm_mem operator, on the CUDA and CPU keys."""
    import warnings

    names = sorted({n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
                    if n.startswith("symm_mem::")})
    library = torch.library.Library("symm_mem", "IMPL")
    _installed["library"] = library
    for name in names:
        base = name.split(".", 1)[0]
        if base in SERVED_OPS:
            continue
        refused = api.refusing("symm_mem_op", f"torch.ops.symm_mem.{base}",
                               "torch's symm_mem operators need torch's own symmetric memory")
        for key in ("CUDA", "CPU"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
                _impl_overriding(library, name, refused, key)


def _impl_overriding(library: Any, name: str, fn: Any, key: str) -> None:
    """library.impl over a kernel that torch's own Python code registered (fused_all_gather_matmul, ...):
    newer torch takes allow_override, older torch refuses a second Python kernel unless its bookkeeping
    forgets the first. The dispatcher keeps the earlier kernel and serves it again once ours is removed."""
    if "allow_override" in inspect.signature(library.impl).parameters:
        library.impl(name, fn, key, allow_override=True)
        return
    torch.library._impls.discard(f"symm_mem/{name}/{key}")
    library.impl(name, fn, key)


def _is_nccl(backend: Any) -> bool:
    return backend is not None and "nccl" in str(backend).lower()


def _refuse_nccl() -> None:
    from torch.distributed import distributed_c10d as c10d

    def guarded(fn: Any, api_name: str) -> Any:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                backend = signature.bind_partial(*args, **kwargs).arguments.get("backend")
            except TypeError:
                backend = kwargs.get("backend")
            if _is_nccl(backend):
                raise NotAvailableInEmulation("nccl", f"{api_name}(backend={backend!r})", "ranks share one GPU, "
                                              "which NCCL refuses; collectives use the host backend")
            return fn(*args, **kwargs)

        call.__pkb_emulation_guard__ = True  # type: ignore[attr-defined]
        return call

    for name in ("new_group", "new_subgroups", "new_subgroups_by_enumeration"):
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapped = guarded(original, f"torch.distributed.{name}")
        for owner in (c10d, dist):
            if getattr(owner, name, None) is original:
                _replace(owner, name, wrapped)
    if hasattr(dist, "ProcessGroupNCCL"):
        _replace(dist, "ProcessGroupNCCL", _refused_nccl_class(dist.ProcessGroupNCCL))
    import torch.cuda.nccl as cuda_nccl

    for name in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "init_rank", "unique_id"):
        if hasattr(cuda_nccl, name):
            _replace(cuda_nccl, name, api.refusing("nccl", f"torch.cuda.nccl.{name}",
                                                   "ranks share one GPU, which NCCL refuses"))


def _refused_nccl_class(original: type) -> type:
    """A stand-in for ProcessGroupNCCL: keeps its nested names (Options, ...) for torch's own
    isinstance checks and attribute reads, refuses construction."""

    class ProcessGroupNCCL(original):  # type: ignore[misc]  # a base known at run time only
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise NotAvailableInEmulation("nccl", "torch.distributed.ProcessGroupNCCL",
                                          "ranks share one GPU, which NCCL refuses; collectives use the host backend")

    ProcessGroupNCCL.__qualname__ = original.__qualname__
    ProcessGroupNCCL.__module__ = original.__module__
    return ProcessGroupNCCL
