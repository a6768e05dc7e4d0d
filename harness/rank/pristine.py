"""What the rank's harness code uses to read a candidate's outputs and inputs, bound when the worker starts,
before any candidate exists. Rank side; torch + stdlib.

A candidate runs in the rank's process, so it can change what a name means there: rebind
`ctypes.string_at` or `torch.Tensor.clone`, or leave a TorchFunctionMode or TorchDispatchMode active that
runs its own code whenever the harness touches a tensor (the work of a call done when the harness
snapshots its output, after the clock stopped). So the code that copies, fingerprints and writes a
candidate's tensors
- calls only the functions bound here, at import (C functions and method descriptors: a later
  `setattr` on torch, ctypes, os or builtins changes nothing here; `ctypes.string_at` is itself a Python
  wrapper that looks up `ctypes._string_at` when called, so the C function object is bound instead);
- runs inside `quiet()`: torch's function modes and tensor subclasses' `__torch_function__` off
  (`DisableTorchFunction`), the Python dispatch key excluded (`_DisableTorchDispatch`: no dispatch mode,
  no `__torch_dispatch__`, including torch's own fake/proxy modes), autocast off.

This does not survive a candidate that writes into the interpreter's or torch's memory through ctypes,
nor one that rebinds the names of this module (the rank's guard watches them, and it can be silenced):
the judge outside the rank holds what is decided. `active_modes` is one of the rank's tripwires.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch

# torch: method descriptors of the tensor base class and module functions, as they are now.
clone = torch.Tensor.clone
detach = torch.Tensor.detach
to = torch.Tensor.to
contiguous = torch.Tensor.contiguous
reshape = torch.Tensor.reshape
view = torch.Tensor.view
numel = torch.Tensor.numel
element_size = torch.Tensor.element_size
data_ptr = torch.Tensor.data_ptr
coalesce = torch.Tensor.coalesce
is_coalesced = torch.Tensor.is_coalesced
indices = torch.Tensor.indices
values = torch.Tensor.values
tensor_sum = torch.Tensor.sum
mul = torch.mul
remainder = torch.remainder
tolist = torch.Tensor.tolist
narrow = torch.Tensor.narrow
# Attribute getters of the C base class (a property set on torch.Tensor later would shadow them).
_getset = torch._C.TensorBase.__dict__
shape_of = _getset["shape"].__get__
dtype_of = _getset["dtype"].__get__
layout_of = _getset["layout"].__get__
device_of = _getset["device"].__get__
copy_ = torch.Tensor.copy_
equal = torch.equal
arange = torch.arange
stack = torch.stack
cat = torch.cat
empty = torch.empty
Tensor = torch.Tensor
strided = torch.strided
sparse_coo = torch.sparse_coo
uint8 = torch.uint8
int64 = torch.int64

# ctypes: the C function behind ctypes.string_at (the Python wrapper looks this up at call time).
string_at = getattr(ctypes, "_string_at", ctypes.string_at)

# os and builtins, for writing output files.
os_open = os.open
os_write = os.write
os_close = os.close
O_WRONLY, O_CREAT, O_TRUNC, O_NOFOLLOW = os.O_WRONLY, os.O_CREAT, os.O_TRUNC, getattr(os, "O_NOFOLLOW", 0)
builtin_type = type
builtin_isinstance = isinstance
builtin_len = len
builtin_memoryview = memoryview
builtin_range = range
builtin_enumerate = enumerate
builtin_tuple: type[tuple[Any, ...]] = tuple
builtin_list: type[list[Any]] = list
# Items of a list or tuple, read through the base class: a subclass's own __iter__ or __getitem__ (candidate
# code) never runs.
_tuple_len: Callable[[tuple[Any, ...]], int] = tuple.__len__
_tuple_item: Callable[[tuple[Any, ...], int], Any] = tuple.__getitem__
_list_len: Callable[[list[Any]], int] = list.__len__
_list_item: Callable[[list[Any], int], Any] = list.__getitem__
_dict_items = dict.items

_disable_function = torch._C.DisableTorchFunction
_disable_dispatch = torch._C._DisableTorchDispatch
_disable_autocast = torch._C._DisableAutocast
_function_stack_len = torch._C._len_torch_function_stack
_function_stack_at = torch._C._get_function_stack_at
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_dispatch_stack_at = torch._C._get_dispatch_stack_at
_infra_mode = torch._C._get_dispatch_mode
_INFRA_KEYS = tuple(torch._C._TorchDispatchModeKey.__members__.values())
_DEVICE_CONTEXT: Any = None
try:  # torch's own mode behind torch.set_default_device / `with torch.device(...)`: legitimate
    from torch.utils._device import DeviceContext as _DEVICE_CONTEXT
except ImportError:  # pragma: no cover - older torch
    pass


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Torch with no Python-level interception: no function or dispatch mode, no subclass hook, no autocast."""
    with _disable_function(), _disable_dispatch(), _disable_autocast():
        yield


def active_modes() -> list[str]:
    """The torch modes active in this thread, by class name, but torch's own default-device context."""
    found = []
    for i in range(_function_stack_len()):
        mode = _function_stack_at(i)
        if _DEVICE_CONTEXT is None or builtin_type(mode) is not _DEVICE_CONTEXT:
            found.append(f"function mode {builtin_type(mode).__qualname__}")
    for i in range(_dispatch_stack_len()):
        found.append(f"dispatch mode {builtin_type(_dispatch_stack_at(i)).__qualname__}")
    for key in _INFRA_KEYS:
        mode = _infra_mode(key)
        if mode is not None:
            found.append(f"dispatch mode {builtin_type(mode).__qualname__}")
    return found


def items(value: list[Any] | tuple[Any, ...]) -> list[Any]:
    """The items of a list or tuple (of any subclass) as the base class stores them."""
    if builtin_isinstance(value, tuple):
        seq = cast("tuple[Any, ...]", value)
        return [_tuple_item(seq, i) for i in builtin_range(_tuple_len(seq))]
    lst = cast("list[Any]", value)
    return [_list_item(lst, i) for i in builtin_range(_list_len(lst))]


def dict_items(value: dict[Any, Any]) -> list[tuple[Any, Any]]:
    return builtin_list(_dict_items(value))


def host_bytes(t: torch.Tensor) -> bytes:
    """A strided tensor's bytes in row-major order, copied to the host. Call inside quiet()."""
    raw = view(reshape(contiguous(to(detach(t), "cpu")), -1), uint8)
    n = numel(raw)
    return string_at(data_ptr(raw), n) if n else b""
