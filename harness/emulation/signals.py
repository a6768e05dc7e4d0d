"""Device-side barrier and one-sided signals on the signal pads, with the semantics of torch's handle.

torch's CUDA backend (CUDASymmetricMemory, kernels in CUDASymmetricMemory-inl.cuh) uses CAS flags:
word `world * channel + r` of rank q's pad is rank r's slot for channel `channel` on q.
- put (rank r to q): spin until compare-and-swap 0 -> 1 succeeds on q's slot r, release, system scope;
- wait (rank r for q): spin until compare-and-swap 1 -> 0 succeeds on r's own slot q, acquire, system
  scope (the slot is consumed, so the pads return to zero and the barrier is reusable);
- barrier(channel): one block, thread t < W (t != rank) puts to t, then waits for t;
- timeout_ms = 0 waits forever; otherwise a late put or wait traps, killing the context, as torch's does.
wait_signal ends with a system-scope fence by every thread, as torch's kernel does.

The kernels are PTX written here (the driver compiles it for the GPU on load), so no compiler beyond
the driver is needed and nothing is built at run time.
"""

from __future__ import annotations

import ctypes
import functools

from harness.emulation import driver

BARRIER = "pkb_emu_barrier"
PUT_SIGNAL = "pkb_emu_put_signal"
WAIT_SIGNAL = "pkb_emu_wait_signal"
WARP = 32


def _spin_cas(tag: str, addr: str, compare: int, value: int, sem: str) -> str:
    """Spin until CAS(compare -> value) at `addr` succeeds; trap past the deadline when one is set."""
    return f"""
    mov.u64 %rd_now, %globaltimer;
    add.u64 %rd_deadline, %rd_now, %rd_timeout;
{tag}_TRY:
    atom.{sem}.sys.global.cas.b32 %r_old, [{addr}], {compare}, {value};
    setp.eq.u32 %p_ok, %r_old, {compare};
    @%p_ok bra {tag}_DONE;
    setp.eq.u64 %p_forever, %rd_timeout, 0;
    @%p_forever bra {tag}_TRY;
    mov.u64 %rd_now, %globaltimer;
    setp.gt.u64 %p_late, %rd_now, %rd_deadline;
    @%p_late trap;
    bra.uni {tag}_TRY;
{tag}_DONE:"""


_REGISTERS = """
    .reg .pred %p_skip, %p_ok, %p_forever, %p_late;
    .reg .b32 %r_tid, %r_peer, %r_channel, %r_rank, %r_world, %r_base, %r_slot, %r_old;
    .reg .b64 %rd_pads, %rd_entry, %rd_remote, %rd_local, %rd_put, %rd_wait, %rd_off, %rd_timeout, %rd_deadline,
              %rd_now;"""


def _pad(dst: str, rank_reg: str) -> str:
    """dst = global address of pads[rank_reg] (pads: the device array of pad pointers)."""
    return f"""
    mul.wide.u32 %rd_off, {rank_reg}, 8;
    add.s64 %rd_entry, %rd_pads, %rd_off;
    ld.global.u64 {dst}, [%rd_entry];
    cvta.to.global.u64 {dst}, {dst};"""


def _slot(dst: str, pad: str, owner_reg: str) -> str:
    """dst = address of word world * channel + owner in `pad`."""
    return f"""
    mul.lo.u32 %r_base, %r_world, %r_channel;
    add.u32 %r_slot, %r_base, {owner_reg};
    mul.wide.u32 %rd_off, %r_slot, 4;
    add.s64 {dst}, {pad}, %rd_off;"""


def _params(extra: str = "") -> str:
    return f"""(
    .param .u64 pads_param,{extra}
    .param .u32 channel_param,
    .param .u32 rank_param,
    .param .u32 world_param,
    .param .u64 timeout_param)"""


_LOAD_COMMON = """
    ld.param.u64 %rd_pads, [pads_param];
    ld.param.u32 %r_channel, [channel_param];
    ld.param.u32 %r_rank, [rank_param];
    ld.param.u32 %r_world, [world_param];
    ld.param.u64 %rd_timeout, [timeout_param];
    mul.lo.u64 %rd_timeout, %rd_timeout, 1000000;
    cvta.to.global.u64 %rd_pads, %rd_pads;
    mov.u32 %r_tid, %tid.x;"""


PTX = f"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry {BARRIER}{_params()}
{{{_REGISTERS}
{_LOAD_COMMON}
    setp.ge.u32 %p_skip, %r_tid, %r_world;
    @%p_skip bra EXIT;
    setp.eq.u32 %p_skip, %r_tid, %r_rank;
    @%p_skip bra EXIT;
{_pad("%rd_remote", "%r_tid")}
{_pad("%rd_local", "%r_rank")}
{_slot("%rd_put", "%rd_remote", "%r_rank")}
{_slot("%rd_wait", "%rd_local", "%r_tid")}
{_spin_cas("PUT", "%rd_put", 0, 1, "release")}
{_spin_cas("WAIT", "%rd_wait", 1, 0, "acquire")}
EXIT:
    ret;
}}

.visible .entry {PUT_SIGNAL}{_params(chr(10) + "    .param .u32 peer_param,")}
{{{_REGISTERS}
{_LOAD_COMMON}
    ld.param.u32 %r_peer, [peer_param];
    setp.ne.u32 %p_skip, %r_tid, 0;
    @%p_skip bra EXIT;
{_pad("%rd_remote", "%r_peer")}
{_slot("%rd_put", "%rd_remote", "%r_rank")}
{_spin_cas("PUT", "%rd_put", 0, 1, "release")}
EXIT:
    ret;
}}

.visible .entry {WAIT_SIGNAL}{_params(chr(10) + "    .param .u32 peer_param,")}
{{{_REGISTERS}
{_LOAD_COMMON}
    ld.param.u32 %r_peer, [peer_param];
    setp.ne.u32 %p_skip, %r_tid, 0;
    @%p_skip bra FENCE;
{_pad("%rd_local", "%r_rank")}
{_slot("%rd_wait", "%rd_local", "%r_peer")}
{_spin_cas("WAIT", "%rd_wait", 1, 0, "acquire")}
FENCE:
    membar.sys;
    ret;
}}
"""


@functools.cache
def kernels(ordinal: int) -> driver.Kernels:
    return driver.Kernels(ordinal, PTX, (BARRIER, PUT_SIGNAL, WAIT_SIGNAL))


def _common(pads_dev: int, channel: int, rank: int, world: int, timeout_ms: int) -> list[object]:
    return [ctypes.c_uint64(pads_dev), ctypes.c_uint32(channel), ctypes.c_uint32(rank), ctypes.c_uint32(world),
            ctypes.c_uint64(timeout_ms)]


def barrier(ordinal: int, stream: int, pads_dev: int, channel: int, rank: int, world: int, timeout_ms: int) -> None:
    kernels(ordinal).launch(BARRIER, max(WARP, world), stream, _common(pads_dev, channel, rank, world, timeout_ms))


def put_signal(ordinal: int, stream: int, pads_dev: int, dst: int, channel: int, rank: int, world: int,
               timeout_ms: int) -> None:
    args = _common(pads_dev, channel, rank, world, timeout_ms)
    kernels(ordinal).launch(PUT_SIGNAL, WARP, stream, args[:1] + [ctypes.c_uint32(dst)] + args[1:])


def wait_signal(ordinal: int, stream: int, pads_dev: int, src: int, channel: int, rank: int, world: int,
                timeout_ms: int) -> None:
    args = _common(pads_dev, channel, rank, world, timeout_ms)
    kernels(ordinal).launch(WAIT_SIGNAL, WARP, stream, args[:1] + [ctypes.c_uint32(src)] + args[1:])
