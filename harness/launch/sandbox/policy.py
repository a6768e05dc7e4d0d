"""What a sandbox allows, and the bubblewrap command line that enforces it (see harness/launch/sandbox/__init__.py)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.common.paths import REPO_ROOT
from harness.launch.sandbox import mounts, nsfilter
from harness.launch.sandbox.drop import NSFILTER_NAME
from harness.launch.sandbox.limits import SandboxLimits
from harness.records.redaction import SECRET_SUFFIXES, contains_secret

# Inside every sandbox, the folder torch builds extensions in. The same path in the compile stage's
# sandbox and in the ranks' is what lets a rank reuse the compile stage's build: torch's build files
# name their folder by absolute path, and a different path means a rebuild.
EXT_MOUNT = "/tmp/pkb-torch-extensions"
SANDBOX_UID = 65534  # "nobody": no file of the machine belongs to it
OFF_REASON_VAR = "PKB_SANDBOX_OFF_BY"  # who turned the sandbox off (e.g. `pkb run --no-sandbox`), for the record

# Environment variables a sandbox keeps (exact names, then prefixes); everything else is dropped, and so
# is any name that looks like a secret whatever its prefix.
# The toolchain's own names (mounts.TOOLCHAIN_VARS) are kept: a machine whose compiler lives outside /usr
# (the H200 node's CC=/opt/gcc/bin/gcc) builds nothing without them.
_KEEP = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TERM", "TZ", "SHELL", "LD_LIBRARY_PATH",
         "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "VIRTUAL_ENV", "CONDA_PREFIX",
         "MAX_JOBS", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", *mounts.TOOLCHAIN_VARS}
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
        # HOME too: the real one is not in the sandbox, and nothing may look for a config or a key there.
        kept.update({"HOME": str(scratch / "home"), "TMPDIR": str(scratch / "tmp"),
                     "XDG_CACHE_HOME": str(scratch / "cache"), "TRITON_CACHE_DIR": str(scratch / "cache" / "triton"),
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
    options: frozenset[str] = frozenset()  # the bubblewrap options this version has, of those used if present

    @property
    def host_uid_switch(self) -> bool:
        """Whether ranks run as SANDBOX_UID on the host: the harness is root, and bubblewrap can make the
        folders on the way to a mount point walkable by that uid (--perms)."""
        return self.backend == "bwrap" and os.geteuid() == 0 and "--perms" in self.options

    @property
    def protections(self) -> list[str]:
        common = ["clean_environment", "rlimits:nofile,fsize,core", "output_cap", "process_count_watchdog"]
        if self.backend == "bwrap":
            uid = (f"host_uid:{SANDBOX_UID},no_capabilities" if self.host_uid_switch
                   else f"user_namespace:uid{SANDBOX_UID}_is_harness_uid{os.geteuid()},no_capabilities")
            return ["pid_namespace", uid, "network_namespace:loopback_only", nsfilter.PROTECTION, "ipc_namespace",
                    "bound:only_what_ranks_need", "writable:scratch_only", "hidden:home,caches,tmpdir",
                    "limits:memory,tmpfs,scratch", "die_with_parent", *common]
        return ["own_session", "pool_marker_sweep", *common]

    def record(self) -> dict[str, object]:
        out: dict[str, object] = {"backend": self.backend, "protections": self.protections}
        if self.version:
            out["version"] = self.version
        if self.reason:
            out["weaker_fallback"] = self.reason
        if self.backend == "bwrap" and os.geteuid() == 0 and not self.host_uid_switch:
            out["weaker_fallback"] = ("the harness runs as root and this bubblewrap lacks --perms: ranks are "
                                      "root on the host, mapped to uid 65534 inside")
        if self.backend == "bwrap" and "--size" not in self.options:
            out["tmpfs_unbounded"] = "this bubblewrap lacks --size: /tmp and /dev/shm have no size limit"
        return out


# Options used where the installed bubblewrap has them (0.5 added --perms, 0.7 --size).
_OPTIONAL = ("--perms", "--size")


@functools.lru_cache(maxsize=1)
def _bwrap_works() -> tuple[str, str, frozenset[str]]:
    """(version, "", options) when bubblewrap starts a sandbox with every namespace, the uid model and the
    mounts used for ranks, else ("", why not, options)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "", "bubblewrap (bwrap) is not installed: apt-get install bubblewrap", frozenset()
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        usage = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10)
        options = frozenset(o for o in _OPTIONAL if o in usage.stdout + usage.stderr)
        info = SandboxInfo("bwrap", version=version, options=options)
        # The interpreter runs and the checkout reads as the sandbox's uid (a checkout in a folder only its
        # owner may read would fail every rank, for a reason better said once, here).
        check = [sys.executable, "-I", "-S", "-c", f"open({str(REPO_ROOT / 'harness' / '__init__.py')!r}).close()"]
        trial = subprocess.run(SandboxPolicy(scratch=None, info=info).bwrap_command(check, REPO_ROOT),
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return "", f"bubblewrap did not run: {err}", frozenset()
    if trial.returncode != 0:
        hint = (f"; ranks run as uid {SANDBOX_UID}: the checkout, the interpreter and its packages must be "
                f"readable by others (chmod -R o+rX)") if info.host_uid_switch and "Permission" in trial.stderr else ""
        return "", f"bubblewrap cannot make a sandbox here: {trial.stderr.strip()[-300:]}{hint}", options
    return version, "", options


def probe() -> SandboxInfo:
    """The sandbox this process can give candidates. PKB_SANDBOX=off forces the fallback (it is then
    recorded as a choice); PKB_SANDBOX=require raises SandboxUnavailable instead of falling back."""
    setting = os.environ.get("PKB_SANDBOX", "auto").lower()
    if setting in ("off", "none", "0"):
        return SandboxInfo("none", reason=f"turned off by {os.environ.get(OFF_REASON_VAR) or 'PKB_SANDBOX=off'}")
    version, why, options = _bwrap_works()
    if version:
        return SandboxInfo("bwrap", version=version, options=options)
    if setting == "require":
        raise SandboxUnavailable(f"PKB_SANDBOX=require, but {why}")
    return SandboxInfo("none", reason=why)


_DROP = Path(__file__).with_name("drop.py")
_NSFILTER = Path(__file__).with_name(NSFILTER_NAME)
# Where drop.py and the namespace filter it loads are bound inside every sandbox: a folder of their own,
# because the checkout that holds them may be hidden (the bash condition's shell hides it: problems/ holds
# the oracles).
DROP_FOLDER = "/.pkb-sandbox"
DROP_MOUNT = f"{DROP_FOLDER}/drop.py"


@dataclass(frozen=True)
class SandboxPolicy:
    """One sandbox: the scratch folder (the only writable place besides the extension build folder mounted at
    EXT_MOUNT), paths to hide although a code folder holds them, whether GPUs are visible, what else it
    must see read-only (a problem's file or checkout, the candidate's copy: harness.launch.sandbox.mounts), the
    sizes of its /tmp and /dev/shm, the sandbox this process can make (`info`, probed when None), and
    folders bound read-only at paths of their own (`read_only`: a compile stage's object cache)."""

    scratch: Path | None
    extensions: Path | None = None
    hide: tuple[Path, ...] = ()
    gpus: bool = False
    visible: tuple[Path, ...] = field(default=())
    limits: SandboxLimits | None = None
    info: SandboxInfo | None = None
    read_only: tuple[tuple[Path, str], ...] = ()  # (host folder, path inside): mounts.plan's `read_only`

    def _info(self) -> SandboxInfo:
        return self.info if self.info is not None else probe()

    def namespace_args(self) -> list[str]:
        common = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
                  "--unshare-uts", "--unshare-cgroup-try"]
        if self._info().host_uid_switch:
            # No user namespace (root's would map the ranks to root): only what drop.py needs to leave uid 0.
            return [*common, "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                    "--cap-add", "CAP_SETPCAP"]
        return [*common, "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]

    def layout(self, cwd: Path) -> mounts.Layout:
        return mounts.plan(cwd=cwd, visible=self.visible, hide=self.hide, scratch=self.scratch,
                           extensions=self.extensions, ext_mount=EXT_MOUNT, gpus=self.gpus,
                           tmp_bytes=self.limits.tmp_bytes if self.limits else None,
                           shm_bytes=self.limits.shm_bytes if self.limits else None, read_only=self.read_only)

    def bwrap_command(self, command: list[str], cwd: Path) -> list[str]:
        info = self._info()
        exe = shutil.which("bwrap") or "bwrap"
        binds = mounts.bwrap_args(self.layout(cwd), perms="--perms" in info.options, sizes="--size" in info.options)
        # Every sandbox's first program is drop.py: it loads the namespace filter and, as root, leaves uid 0.
        binds += [*(["--perms", "0755"] if "--perms" in info.options else []), "--dir", DROP_FOLDER,
                  "--ro-bind", str(_DROP), DROP_MOUNT, "--ro-bind", str(_NSFILTER), f"{DROP_FOLDER}/{NSFILTER_NAME}"]
        ids = [str(SANDBOX_UID), str(SANDBOX_UID)] if info.host_uid_switch else ["-", "-"]
        command = [sys.executable, "-I", "-S", DROP_MOUNT, *ids, *command]
        return [exe, *self.namespace_args(), *binds, "--chdir", str(cwd), "--", *command]

    def record(self, cwd: Path) -> dict[str, object]:
        """integrity.sandbox: the protections, the uid model, what was bound and the limits."""
        info = self._info()
        out = info.record()
        if info.backend != "bwrap":
            return out
        out["uid"] = ({"host": SANDBOX_UID, "inside": SANDBOX_UID, "how": "no user namespace; the sandbox's first "
                       "program drops to this uid on the host, with no capability (harness/launch/sandbox/drop.py)"}
                      if info.host_uid_switch else
                      {"host": os.geteuid(), "inside": SANDBOX_UID, "how": "a user namespace maps the inside uid to "
                       "the harness's own: no more than that user may"})
        out["mounts"] = self.layout(cwd).record()
        if self.limits is not None:
            out["limits"] = self.limits.record()
        return out
