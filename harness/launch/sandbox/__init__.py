"""The sandbox candidate code runs in: every process that imports a candidate (its rank workers, the
compile stage's import) starts inside one, and everything started inside it ends with it.

Backend: bubblewrap (`bwrap`, Debian's `bubblewrap` package), as root or as an ordinary user. What one
sandbox gets (harness.launch.sandbox.policy.SandboxPolicy; the modules named below do one part each):

- its own PID namespace: the harness and every other process of the machine are invisible; no signal
  or ptrace reaches them. Its own network namespace (loopback only: the W ranks of one sandbox talk
  gloo/NCCL bootstrap over it, and nothing else is reachable), IPC and UTS namespaces.
- an unprivileged uid on the host. As root, bubblewrap makes the sandbox without a user namespace (root's
  would map uid 65534 inside to root outside) and the sandbox's first program (drop.py) becomes uid
  65534 with no capability, no_new_privs and an empty bounding set: root-only files stay unreadable. As an
  ordinary user, a user namespace maps uid 65534 inside to that user: never more than the user has.
- only what it needs, read-only (mounts.py): system programs and libraries, a few /etc files, /sys, the
  interpreter's prefixes and sys.path, the checkout (its runs/ masked), the problem's file or checkout,
  the evaluation's copy of the candidate; writable: its scratch and extension folder; fresh /tmp and
  /dev/shm of a fixed size; a minimal /dev (GPU nodes on CUDA). Never the home folder, the caches,
  TMPDIR or the private root holding every evaluation's folders (private.py).
- limits (limits.py, the one definition for ranks, shells and profiles; a rank's budget from its problem
  and shape, budget.py, capped by the integrity settings and the host): memory (memory.py: a cgroup where
  one can be made, else a watchdog), /tmp and /dev/shm sizes, scratch bytes and files, processes (watch.py,
  from outside); going over ends the sandbox and is the candidate's runtime_error, naming the limit.
- no new namespaces: the sandbox's first program (drop.py) loads a seccomp filter (nsfilter.py) that
  refuses unshare, clone with a namespace flag and setns to every process of the sandbox.
- an environment rebuilt from a list of safe names: API keys and other secrets of the harness's
  environment never reach a candidate; HOME, TMPDIR and caches point into the scratch.
- resource limits set by the launcher before any candidate code runs (open files, file size, core
  dumps; processes through the harness's watchdog, because RLIMIT_NPROC does not bind root).
- `--die-with-parent`: when the harness or the bwrap process dies, the kernel kills the sandbox's init
  and with it the whole PID namespace, including what called setsid with a scrubbed environment.

Where bubblewrap is missing or refuses to start (a kernel without user namespaces), the fallback is
"none": ranks run as the harness's user in sessions of their own, without the limits above. Never
silently: every result records `integrity.sandbox` (backend, protections in force, the uid model, what
was bound, the limits, why a fallback was taken), and `PKB_SANDBOX=require` turns the fallback into an
error.
"""

from harness.launch.sandbox.policy import (
    EXT_MOUNT,
    OFF_REASON_VAR,
    SandboxInfo,
    SandboxPolicy,
    SandboxUnavailable,
    clean_environment,
    probe,
)

__all__ = ["EXT_MOUNT", "OFF_REASON_VAR", "SandboxInfo", "SandboxPolicy", "SandboxUnavailable", "clean_environment",
           "probe"]
