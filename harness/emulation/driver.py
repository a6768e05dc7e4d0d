"""The few CUDA driver calls the emulation needs, through ctypes on libcuda (torch and stdlib only).

Why the driver and not torch: torch has no public call that exports one allocation with CUDA IPC and
maps a peer's export into this process, nor one that loads a kernel from PTX. libcuda.so.1 is the one
driver every CUDA process shares, so the pointers made here are valid in torch's kernels (every call
runs inside the device's primary context, the one torch uses).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

IPC_HANDLE_BYTES = 64
_LAZY_ENABLE_PEER_ACCESS = 0x1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: a peer's memory on another GPU
_SUCCESS = 0


class DriverError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's own error text."""


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


@functools.cache
def _lib() -> Any:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        raise DriverError(f"the CUDA driver (libcuda.so.1) cannot be loaded: {err}") from None
    u64p, vp = ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p
    signatures: dict[str, list[Any]] = {
        "cuInit": [ctypes.c_uint],
        "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
        "cuDeviceGetUuid": [ctypes.c_char_p, ctypes.c_int],
        "cuDevicePrimaryCtxRetain": [ctypes.POINTER(vp), ctypes.c_int],
        "cuCtxPushCurrent_v2": [vp],
        "cuCtxPopCurrent_v2": [ctypes.POINTER(vp)],
        "cuCtxSynchronize": [],
        "cuMemAlloc_v2": [u64p, ctypes.c_size_t],
        "cuMemAddressReserve": [u64p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_ulonglong],
        "cuMemsetD8_v2": [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t],
        "cuIpcGetMemHandle": [ctypes.POINTER(IpcHandle), ctypes.c_uint64],
        "cuIpcOpenMemHandle_v2": [u64p, IpcHandle, ctypes.c_uint],
        "cuModuleLoadData": [ctypes.POINTER(vp), ctypes.c_char_p],
        "cuModuleGetFunction": [ctypes.POINTER(vp), vp, ctypes.c_char_p],
        "cuLaunchKernel": [vp, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                           ctypes.c_uint, ctypes.c_uint, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)],
        "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name, None)
        if fn is None:
            continue  # a driver without it: the call that needs it says so
        fn.argtypes = args
        fn.restype = ctypes.c_int
    return lib


def _fn(name: str) -> Any:
    fn = getattr(_lib(), name, None)
    if fn is None or fn.argtypes is None:
        raise DriverError(f"the CUDA driver has no {name}")
    return fn


def _check(result: int, call: str) -> None:
    if result == _SUCCESS:
        return
    text = ctypes.c_char_p()
    _fn("cuGetErrorString")(result, ctypes.byref(text))
    raise DriverError(f"{call} failed: CUDA driver error {result} ({(text.value or b'?').decode()})")


_init_lock = threading.Lock()
_devices: dict[int, ctypes.c_int] = {}
_contexts: dict[int, ctypes.c_void_p] = {}


def _primary_context(ordinal: int) -> ctypes.c_void_p:
    with _init_lock:
        if ordinal not in _contexts:
            _check(_fn("cuInit")(0), "cuInit")
            device = ctypes.c_int()
            _check(_fn("cuDeviceGet")(ctypes.byref(device), ordinal), f"cuDeviceGet({ordinal})")
            ctx = ctypes.c_void_p()
            _check(_fn("cuDevicePrimaryCtxRetain")(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
            _devices[ordinal] = device
            _contexts[ordinal] = ctx
        return _contexts[ordinal]


@contextmanager
def on_device(ordinal: int) -> Iterator[None]:
    """Driver calls inside run in the primary context of device `ordinal` (torch's context)."""
    _check(_fn("cuCtxPushCurrent_v2")(_primary_context(ordinal)), "cuCtxPushCurrent")
    try:
        yield
    finally:
        popped = ctypes.c_void_p()
        _check(_fn("cuCtxPopCurrent_v2")(ctypes.byref(popped)), "cuCtxPopCurrent")


def device_uuid(ordinal: int) -> str:
    _primary_context(ordinal)
    raw = ctypes.create_string_buffer(16)
    _check(_fn("cuDeviceGetUuid")(raw, _devices[ordinal]), "cuDeviceGetUuid")
    return raw.raw.hex()


def alloc(ordinal: int, nbytes: int) -> int:
    """A plain device allocation (cudaMalloc-like, exportable with IPC). Never freed: peers may map it
    until their process ends, and every rank process ends with its evaluation."""
    ptr = ctypes.c_uint64()
    with on_device(ordinal):
        _check(_fn("cuMemAlloc_v2")(ctypes.byref(ptr), max(nbytes, 1)), f"cuMemAlloc({nbytes})")
    return int(ptr.value)


def reserve_address(ordinal: int, nbytes: int, alignment: int) -> int:
    """A range of device virtual addresses with nothing mapped behind it: an access there faults. The
    emulated multicast windows (harness.emulation.multicast_windows); never mapped, never freed."""
    ptr = ctypes.c_uint64()
    with on_device(ordinal):
        _check(_fn("cuMemAddressReserve")(ctypes.byref(ptr), nbytes, alignment, 0, 0),
               f"cuMemAddressReserve({nbytes})")
    return int(ptr.value)


def memset_zero(ordinal: int, ptr: int, nbytes: int) -> None:
    """Zero `nbytes` at `ptr` and wait for it: the pads must be zero before any peer sees them."""
    with on_device(ordinal):
        _check(_fn("cuMemsetD8_v2")(ptr, 0, nbytes), "cuMemsetD8")
        _check(_fn("cuCtxSynchronize")(), "cuCtxSynchronize")


def handle_bytes(handle: IpcHandle) -> bytes:
    return ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_BYTES)  # .reserved would stop at a NUL


def handle_from_bytes(raw: bytes) -> IpcHandle:
    if len(raw) != IPC_HANDLE_BYTES:
        raise ValueError(f"an IPC handle has {IPC_HANDLE_BYTES} bytes, got {len(raw)}")
    handle = IpcHandle()
    ctypes.memmove(ctypes.addressof(handle), raw, IPC_HANDLE_BYTES)
    return handle


def ipc_export(ordinal: int, ptr: int) -> bytes:
    handle = IpcHandle()
    with on_device(ordinal):
        _check(_fn("cuIpcGetMemHandle")(ctypes.byref(handle), ptr), "cuIpcGetMemHandle")
    return handle_bytes(handle)


def ipc_open(ordinal: int, raw: bytes) -> int:
    """Map a peer process's exported allocation into this process, on device `ordinal`."""
    handle = handle_from_bytes(raw)
    ptr = ctypes.c_uint64()
    with on_device(ordinal):
        _check(_fn("cuIpcOpenMemHandle_v2")(ctypes.byref(ptr), handle, _LAZY_ENABLE_PEER_ACCESS),
               "cuIpcOpenMemHandle")
    return int(ptr.value)


class Kernels:
    """Functions of one PTX module, loaded once per device."""

    def __init__(self, ordinal: int, ptx: str, names: tuple[str, ...]) -> None:
        self.ordinal = ordinal
        module = ctypes.c_void_p()
        with on_device(ordinal):
            _check(_fn("cuModuleLoadData")(ctypes.byref(module), ptx.encode() + b"\0"), "cuModuleLoadData")
            self.functions: dict[str, ctypes.c_void_p] = {}
            for name in names:
                fn = ctypes.c_void_p()
                _check(_fn("cuModuleGetFunction")(ctypes.byref(fn), module, name.encode()),
                       f"cuModuleGetFunction({name})")
                self.functions[name] = fn
        self.module = module

    def launch(self, name: str, threads: int, stream: int, args: list[Any]) -> None:
        """One block of `threads` threads on `stream` (a CUstream handle: torch's cuda_stream)."""
        holders = list(args)  # ctypes values; kept alive until the launch call returns (it copies them)
        params = (ctypes.c_void_p * len(holders))(*(ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in holders))
        with on_device(self.ordinal):
            _check(_fn("cuLaunchKernel")(self.functions[name], 1, 1, 1, threads, 1, 1, 0,
                                         ctypes.c_void_p(stream), params, None), f"cuLaunchKernel({name})")
