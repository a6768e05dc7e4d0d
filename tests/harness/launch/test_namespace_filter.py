"""The sandbox's namespace filter (harness.launch.sandbox.nsfilter): no process of a sandbox makes or enters
a namespace; ordinary forks, threads and programs still work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.common.paths import REPO_ROOT
from harness.launch.sandbox import SandboxPolicy, nsfilter, probe

# Inside the sandbox: every way into a new namespace, then what honest code does (threads, fork, a program).
_PROBE = r"""
import ctypes, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
for name, call in (("unshare_user", lambda: libc.unshare(0x10000000)),
                   ("unshare_net", lambda: libc.unshare(0x40000000)),
                   ("clone_newuser", lambda: libc.syscall(56 if os.uname().machine == "x86_64" else 220,
                                                            0x10000000 | 17, 0, 0, 0, 0)),
                   ("setns", lambda: libc.setns(os.open("/proc/self/ns/net", os.O_RDONLY), 0))):
    rc = call()
    if rc == 0:
        os._exit(0)  # a child made by the raw clone, or a namespace made: report from the parent only
    print(name, rc, ctypes.get_errno())
t = threading.Thread(target=print, args=("thread",)); t.start(); t.join()
print(subprocess.run(["/bin/echo", "program"], capture_output=True, text=True).stdout.strip())
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_the_filter_has_a_program_for_the_known_machines():
    for machine in ("x86_64", "aarch64"):
        code = nsfilter.program(machine)
        assert code is not None and len(code) % 8 == 0
    assert nsfilter.program("riscv64") is None


def test_no_process_of_a_sandbox_makes_or_enters_a_namespace():
    if probe().backend != "bwrap":
        pytest.skip(f"no sandbox here: {probe().reason}")
    command = SandboxPolicy(scratch=None).bwrap_command([sys.executable, "-c", _PROBE], REPO_ROOT)
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name in ("unshare_user", "unshare_net", "clone_newuser", "setns"):
        assert f"{name} -1 1" in lines, done.stdout  # EPERM
    assert ["thread", "program", "fork 7"] == lines[-3:]
    assert nsfilter.PROTECTION in probe().protections
