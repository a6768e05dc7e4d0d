"""What a sandbox allows, and the bubblewrap command line that enforces it (see harness/sandbox/__init__.py)."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.redaction import SECRET_SUFFIXES, contains_secret

# Inside every sandbox, the folder torch builds extensions in. The same path in the compile stage's
# sandbox and in the ranks' is what lets a rank reuse the compile stage's build: torch's build files
# name their folder by absolute path, and a different path means a rebuild.
EXT_MOUNT = "/tmp/pkb-torch-extensions"
SANDBOX_UID = 65534  # "nobody": no file of the machine belongs to it
OFF_REASON_VAR = "PKB_SANDBOX_OFF_BY"  # who turned the sandbox off (e.g. `pkb run --no-sandbox`), for the record

# Environment variables a sandbox keeps (exact names, then prefixes); everything else is dropped, and so
# is any name that looks like a secret whatever its prefix.
_KEEP = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TZ", "SHELL", "LD_LIBRARY_PATH",
         "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "VIRTUAL_ENV", "CONDA_PREFIX", "CC", "CXX",
         "MAX_JOBS", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS"}
_KEEP_PREFIXES = ("LC_", "CUDA_", "NCCL_", "TORCH_", "NVIDIA_", "NVSHMEM_", "GLOO_", "TRITON_", "CUPY_",
                  "OMP_", "KMP_", "MKL_", "PKB_POOL", "PKB_TEST_")
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE")


class SandboxUnavailable(RuntimeError):
    """PKB_SANDBOX=require, and no sandbox can be started here; the message says why."""


def clean_environment(env: dict[str, str], scratch: Path | None) -> dict[str, str]:
    """The environment a process that runs candidate code gets, sandboxed or not: the safe names of `env`
    (an allow-list; nothing that looks like a secret, no value of a secret under another name), caches
    pointed into the scratch."""
    secrets = {k for k in env if k.upper().endswith(SECRET_SUFFIXES)}
    kept = {k: v for k, v in env.items()
            if (k in _KEEP or k.startswith(_KEEP_PREFIXES)) and not any(w in k.upper() for w in _SECRET_WORDS)
            and not contains_secret(v, {s: env[s] for s in secrets})}  # a secret's value under another name
    if scratch is not None:
        kept.update({"TMPDIR": str(scratch / "tmp"), "XDG_CACHE_HOME": str(scratch / "cache"),
                     "TRITON_CACHE_DIR": str(scratch / "cache" / "triton"),
                     "TORCHINDUCTOR_CACHE_DIR": str(scratch / "cache" / "inductor"),
                     "CUPY_CACHE_DIR": str(scratch / "cache" / "cupy")})
    kept["PYTHONDONTWRITEBYTECODE"] = "1"  # the checkout is read-only; Python would skip the writes anyway
    return kept


@dataclass(frozen=True)
class SandboxInfo:
    """What sandbox a harness process can start; recorded in every result as integrity.sandbox."""

    backend: str  # "bwrap" or "none"
    version: str = ""
    reason: str = ""  # why "none" (empty for bwrap)

    @property
    def protections(self) -> list[str]:
        common = ["clean_environment", "rlimits:nofile,fsize,core", "output_cap", "process_count_watchdog"]
        if self.backend == "bwrap":
            return ["pid_namespace", "user_namespace:uid65534,no_capabilities", "network_namespace:loopback_only",
                    "ipc_namespace", "read_only_filesystem", "writable:scratch_only", "hidden:harness_cache",
                    "die_with_parent", *common]
        return ["own_session", "pool_marker_sweep", *common]

    def record(self) -> dict[str, object]:
        out: dict[str, object] = {"backend": self.backend, "protections": self.protections}
        if self.version:
            out["version"] = self.version
        if self.reason:
            out["weaker_fallback"] = self.reason
        return out


@functools.lru_cache(maxsize=1)
def _bwrap_works() -> tuple[str, str]:
    """(version, "") when bubblewrap starts a sandbox with every namespace here, else ("", why not)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "", "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        trial = subprocess.run(
            [exe, *SandboxPolicy(scratch=None).namespace_args(), "--ro-bind", "/", "/", "--proc", "/proc",
             "--dev", "/dev", "--", "/bin/sh", "-c", "exit 0"],
            capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return "", f"bubblewrap did not run: {err}"
    if trial.returncode != 0:
        return "", f"bubblewrap cannot make a sandbox here: {trial.stderr.strip()[:200]}"
    return version, ""


def probe() -> SandboxInfo:
    """The sandbox this process can give candidates. PKB_SANDBOX=off forces the fallback (it is then
    recorded as a choice); PKB_SANDBOX=require raises SandboxUnavailable instead of falling back."""
    setting = os.environ.get("PKB_SANDBOX", "auto").lower()
    if setting in ("off", "none", "0"):
        return SandboxInfo("none", reason=f"turned off by {os.environ.get(OFF_REASON_VAR) or 'PKB_SANDBOX=off'}")
    version, why = _bwrap_works()
    if version:
        return SandboxInfo("bwrap", version=version)
    if setting == "require":
        raise SandboxUnavailable(f"PKB_SANDBOX=require, but {why}")
    return SandboxInfo("none", reason=why)


@dataclass(frozen=True)
class SandboxPolicy:
    """One sandbox: the scratch folder (the only writable place), the extension build folder mounted at
    EXT_MOUNT, the host paths to hide, whether GPUs are visible, and folders under /tmp that must stay
    visible (read-only) although the sandbox's /tmp is its own: the candidate's folder, a checkout."""

    scratch: Path | None
    extensions: Path | None = None
    hide: tuple[Path, ...] = ()
    gpus: bool = False
    visible: tuple[Path, ...] = field(default=())

    @staticmethod
    def namespace_args() -> list[str]:
        return ["--die-with-parent", "--new-session", "--unshare-user", "--unshare-pid", "--unshare-net",
                "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--uid", str(SANDBOX_UID),
                "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]

    def bwrap_command(self, command: list[str], cwd: Path) -> list[str]:
        exe = shutil.which("bwrap") or "bwrap"
        args = [exe, *self.namespace_args(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
        if self.gpus:
            for node in sorted(set(glob.glob("/dev/nvidia*")) | set(glob.glob("/dev/nvidia-caps/*"))):
                if os.path.exists(node) and not os.path.isdir(node):
                    args += ["--dev-bind", node, node]
        shown = [folder for folder in (*self.visible, *code_folders(cwd))
                 if folder.is_dir() and any(_under(folder, Path(t)) and folder.resolve() != Path(t).resolve()
                                            for t in PRIVATE_TMP)]
        for folder in shown:
            args += ["--ro-bind", str(folder), str(folder)]
        for hidden in self.hide:
            # An empty tmpfs covers it; under /tmp it is hidden already unless a folder shown above holds it.
            if hidden.exists() and (not _under(hidden, Path("/tmp")) or any(_under(hidden, f) for f in shown)):
                args += ["--tmpfs", str(hidden)]
        if self.scratch is not None:
            args += ["--bind", str(self.scratch), str(self.scratch)]
        if self.extensions is not None:
            args += ["--bind", str(self.extensions), EXT_MOUNT]
        return [*args, "--chdir", str(cwd), "--", *command]


PRIVATE_TMP = ("/tmp", "/dev/shm")  # the sandbox's own, empty: what lies under them on the host is hidden


def code_folders(cwd: Path) -> tuple[Path, ...]:
    """What the sandbox's processes need to import the harness and its packages: the checkout (`cwd`), the
    interpreter's prefixes and every folder on sys.path. A checkout or a virtual environment under /tmp
    (a CI runner's, a scratch clone) would otherwise vanish under the private /tmp; these are mounted
    read-only again (never /tmp itself, which would show other evaluations' folders)."""
    found = [cwd, Path(sys.prefix), Path(sys.base_prefix), *(Path(p) for p in sys.path if p)]
    return tuple(dict.fromkeys(p for p in found if p.is_absolute()))


def _under(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False
