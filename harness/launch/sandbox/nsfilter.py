"""A seccomp filter that refuses new namespaces inside a sandbox: unshare() and clone() with a namespace flag,
and setns(), fail with EPERM; clone3() fails with ENOSYS (its flags sit in memory a filter cannot read; the C
library then falls back to clone(), which the filter reads). Standard library only, and no import of the
harness: drop.py loads this file by path as the sandbox's first program.

Why: a sandbox's network namespace is the one whose loopback the harness counts from outside (a rank's
collective over sockets shows there). A process of the sandbox that made a user namespace of its own could
make a network namespace inside it, bring its loopback up and talk there unseen. bubblewrap's own
`--disable-userns` needs a user namespace of the sandbox's, which the root model (drop.py) does not have;
this filter serves both models alike. A filter, once loaded, binds every descendant and cannot be removed.

Architectures: x86-64 (the x32 and i386 entry points refused whole) and aarch64; elsewhere `program`
returns None and the sandbox's record says the protection is missing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

# linux/audit.h, asm/unistd.h: (audit arch, clone, unshare, setns, clone3) per machine
_ARCH = {"x86_64": (0xC000003E, 56, 272, 308, 435), "aarch64": (0xC00000B7, 220, 97, 268, 435)}
X32_BIT = 0x40000000  # x86-64 syscall numbers with this bit are the x32 ABI's
CLONE_NEWTIME = 0x80  # unshare only: in clone()'s flags the low byte is the exit signal
NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
EPERM, ENOSYS = 1, 38
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
# classic BPF opcodes
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_NR, _ARCH_OFF, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0's low word: little-endian)
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
PROTECTION = "no_new_namespaces:seccomp"


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (default this one) as struct sock_filter entries, or None where unknown."""
    found = _ARCH.get(machine or platform.machine())
    if found is None:
        return None
    arch, clone, unshare, setns, clone3 = found
    deny, nosys = RET_ERRNO | EPERM, RET_ERRNO | ENOSYS
    # Jumps are relative: jt/jf skip that many instructions after the current one.
    return b"".join([
        _op(_LD_W_ABS, _ARCH_OFF),                 # 0
        _op(_JEQ_K, arch, 1, 0),                   # 1: another ABI (i386 on x86-64): refuse everything
        _op(_RET_K, deny),                         # 2
        _op(_LD_W_ABS, _NR),                       # 3
        _op(_JGE_K, X32_BIT, 0, 1),                # 4: x32
        _op(_RET_K, deny),                         # 5
        _op(_JEQ_K, clone3, 0, 1),                 # 6
        _op(_RET_K, nosys),                        # 7
        _op(_JEQ_K, setns, 0, 1),                  # 8
        _op(_RET_K, deny),                         # 9
        _op(_JEQ_K, unshare, 3, 0),                # 10 -> 14
        _op(_JEQ_K, clone, 0, 5),                  # 11 -> 17 (allow)
        _op(_LD_W_ABS, _ARG0),                     # 12: clone's flags
        _op(_JSET_K, NAMESPACE_FLAGS, 2, 3),       # 13 -> 16 (deny) / 17 (allow)
        _op(_LD_W_ABS, _ARG0),                     # 14: unshare's flags
        _op(_JSET_K, NAMESPACE_FLAGS | CLONE_NEWTIME, 0, 1),  # 15 -> 16 / 17
        _op(_RET_K, deny),                         # 16
        _op(_RET_K, RET_ALLOW),                    # 17
    ])


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> None:
    """Load the filter into this process (no_new_privs set first, as the kernel requires of an unprivileged
    caller). Raises OSError where it cannot: a sandbox that should have it must not start without it."""
    code = program()
    if code is None:
        raise OSError(f"no namespace filter for this machine ({platform.machine()})")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.addressof(buffer))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"loading the namespace filter failed: {os.strerror(ctypes.get_errno())}")
