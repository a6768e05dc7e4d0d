"""The first program of every sandbox: it takes away what the command must not have, then runs it. Standard
library only; run as a script (`python -I -S drop.py UID GID CMD...`), so nothing but the standard library is
imported while it still holds privileges.

Always: the namespace filter (nsfilter.py, bound beside this file and loaded by path) is loaded, so no
process of the sandbox makes a user or network namespace of its own or enters another (exit 126 if it
cannot be loaded). As root (UID and GID given; "-" for both keeps the ids, as in a user namespace), it
first becomes an unprivileged uid for good, as follows.

As root, bubblewrap cannot map the sandbox's uid to anyone but root (a user namespace made by root maps
uid 65534 inside to uid 0 outside, and root-only files stay readable). So the sandbox is made without a
user namespace, keeping only the capabilities this step needs (CAP_SETUID, CAP_SETGID, CAP_SETPCAP), and
this step drops them: the bounding set emptied, no_new_privs set (no setuid binary or file capability can
give any back), supplementary groups cleared, real, effective and saved gid and uid set. It checks the
result and refuses to run the command (exit 126) if any capability or id is left.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys

PR_CAPBSET_DROP = 24  # linux/prctl.h
PR_SET_NO_NEW_PRIVS = 38
LAST_CAP = 63  # above the kernel's last capability, PR_CAPBSET_DROP fails with EINVAL: harmless
CAP_VERSION_3 = 0x20080522
FAILED = 126
NSFILTER_NAME = "nsfilter.py"  # bound beside this file in every sandbox (harness.launch.sandbox.policy)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def capabilities() -> dict[str, int]:
    """This process's capability sets (CapInh, CapPrm, CapEff, CapBnd, CapAmb) from /proc."""
    with open("/proc/self/status") as f:
        return {k: int(v, 16) for k, _, v in (line.partition(":") for line in f) if k.startswith("Cap")}


def drop(uid: int, gid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(LAST_CAP + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # leaving uid 0 clears the permitted, effective and ambient sets
    empty = (_CapData * 2)()
    if libc.capset(ctypes.byref(_CapHeader(CAP_VERSION_3, 0)), empty) != 0:  # the inheritable set too
        raise OSError(ctypes.get_errno(), "capset failed")
    left = {k: v for k, v in capabilities().items() if v}
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups() or left:
        raise OSError(f"privileges left after the drop: uids {os.getresuid()}, gids {os.getresgid()}, "
                      f"groups {os.getgroups()}, capabilities {left}")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise OSError("uid 0 could be taken back after the drop")


def namespace_filter() -> None:
    """nsfilter.install, from the file beside this one (no package to import it from inside a sandbox)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), NSFILTER_NAME)
    spec = importlib.util.spec_from_file_location("pkb_nsfilter", path)
    if spec is None or spec.loader is None:
        raise OSError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install()


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: drop.py UID|- GID|- COMMAND [ARG...]", file=sys.stderr)
        return FAILED
    try:
        if argv[0] != "-":
            drop(int(argv[0]), int(argv[1]))
        namespace_filter()
        os.execvp(argv[2], argv[2:])
    except (OSError, ValueError, ImportError) as err:
        print(f"sandbox: could not drop privileges (uid {argv[0]}, namespace filter): {err}", file=sys.stderr)
    return FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
