"""The sandbox candidate code runs in: every process that imports a candidate (its rank workers, the
compile stage's import) starts inside one, and everything started inside it ends with it.

Backend: bubblewrap (`bwrap`, Debian's `bubblewrap` package), as root or as an ordinary user. What one
sandbox gets (harness.sandbox.policy.SandboxPolicy):

- its own PID namespace: the harness and every other process of the machine are invisible; no signal
  or ptrace reaches them. Its own user namespace with a non-zero uid and no capabilities, so nothing
  can be remounted writable. Its own network namespace (loopback only: the W ranks of one sandbox talk
  gloo/NCCL bootstrap over it, and nothing else is reachable), IPC and UTS namespaces.
- a read-only view of the whole filesystem (checkout, site-packages, home), a fresh /tmp and /dev/shm
  (code folders that lie under them, such as a checkout cloned into /tmp, mounted again read-only), the
  harness's cache folder hidden, and one writable scratch folder, bound at the same path inside.
  GPU device nodes are bound where the evaluation runs on CUDA.
- an environment rebuilt from a list of safe names: API keys and other secrets of the harness's
  environment never reach a candidate.
- resource limits set by the launcher before any candidate code runs (open files, file size, core
  dumps; processes through the harness's watchdog, because RLIMIT_NPROC does not bind root).
- `--die-with-parent`: when the harness or the bwrap process dies, the kernel kills the sandbox's init
  and with it the whole PID namespace, including what called setsid with a scrubbed environment.

Where bubblewrap is missing or refuses to start (a kernel without user namespaces), the fallback is
"none": ranks run as the harness's user in sessions of their own, exactly as before this module
existed. Never silently: every result records `integrity.sandbox` (backend, protections in force,
why a fallback was taken), and `PKB_SANDBOX=require` turns the fallback into an error.
"""

from harness.sandbox.policy import (
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
