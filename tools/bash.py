"""`bash`: one shell command in the sample's scratch folder, in the harness's bubblewrap sandbox.

The bash condition's only tool, in the spirit of ParallelKernelBench's agent (a model with a shell and an
evaluation command): the model writes its file with the shell, and `pkb-check [FILE]` / `pkb-bench [FILE]`
(tools.specs.SHELL_HARNESS_COMMANDS) hand that file to the harness's check or bench, which run from the
trusted side like the structured tools (the file becomes candidates/NNN.py with its record). Every other
command runs in `/bin/bash -c` inside the sandbox: the scratch folder (`<sample>/shell/`) is the only
writable place and the working directory, the run's folder, the checkout (oracles, held-out shapes, expert
solutions), a PKB checkout and the harness's cache are hidden, no
network, no GPU (device work goes through pkb-check and pkb-bench, which take a device lease), a clean
environment, a time limit per command after which the whole sandbox is killed, and bounded output (the
first and last OUTPUT_KEEP bytes of what it printed, then the token budget). The same kinds of limit as a
candidate's ranks, from harness.launch.sandbox.limits.ShellSettings (shown to the model in the tool's
description, `limits_note`): memory (a cgroup, else the watch), /tmp and /dev/shm sizes, the scratch
folder's bytes and files, processes, all watched from outside (harness.launch.sandbox.watch); going over
ends the command and its output names the limit. Nothing the command starts outlives it: the sandbox's PID
namespace ends with it, and its cgroup is removed. Without bubblewrap the tool refuses to run: an
unsandboxed shell would run model-written commands with the harness's rights.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from harness.common import channel
from harness.common.hostile_files import Folder, HostileFile
from harness.common.paths import REPO_ROOT
from harness.launch.sandbox import SandboxPolicy, clean_environment, probe
from harness.launch.sandbox.limits import SandboxLimits
from harness.launch.sandbox.memory import MemoryCgroup
from harness.launch.sandbox.policy import SANDBOX_UID
from harness.launch.sandbox.private import hand_over
from harness.launch.sandbox.watch import SandboxWatch
from harness.rank.transport import TransportError, open_untrusted
from harness.records.cache_dir import cache_root
from tools.base import ToolContext, ToolInputError, ToolOutcome, bounded, save_candidate
from tools.render import Block
from tools.specs import SHELL_HARNESS_COMMANDS

SHELL_DIR = "shell"  # the scratch folder, inside the sample's folder (kept, so a resumed sample finds its files)
OUTPUT_KEEP = 16 << 10  # bytes kept from the start and from the end of a command's output
FILE_LIMIT = 1 << 20  # the largest file the harness commands (and the final scoring) take from the scratch
MAX_COMMAND_CHARS = 20_000


def scratch(ctx: ToolContext) -> Path:
    return Path(ctx.workdir) / SHELL_DIR


def prepare(ctx: ToolContext, files: dict[str, str]) -> Path:
    """The scratch folder with the files the prompt names (the reference), written once, and its `tmp`.

    The shell may have run here before (every command, and a resumed sample, comes back to it), and this
    runs as the harness's user, root on a GPU node: every name is reached through the held folder, so a
    link the shell planted is never followed and a name it took is left to it (the copy of the reference
    is a convenience, not something to fight for). Only the sandbox's user writes in the folder: it is
    handed over to that uid where the shell runs as it on the host, and stays the harness user's where a
    user namespace maps the sandbox's uid there; never writable by everyone (0755: bubblewrap enters it
    before the uid changes, without the capabilities that would let it into a private folder)."""
    folder = scratch(ctx)
    folder.mkdir(parents=True, exist_ok=True)  # the sample's folder, the trusted side's own
    with Folder.open(folder) as held:
        for rel, text in files.items():
            with contextlib.suppress(HostileFile):
                if not held.exists(rel):
                    held.write_new(rel, text.encode())
        with contextlib.suppress(HostileFile):
            held.make_dir("tmp", 0o700)
        os.fchmod(held.fd, 0o755)
    if probe().host_uid_switch:
        hand_over(folder, SANDBOX_UID)
    return folder


def read_file(folder: Path, rel: str, limit: int = FILE_LIMIT) -> tuple[str | None, str]:
    """A file the shell wrote, read as hostile: inside the scratch folder (no link leads out), a plain file,
    at most `limit` bytes. (text, "") or (None, why not)."""
    path = (folder / rel)
    try:
        inside = path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        inside = False
    if not inside:
        return None, f"{rel} is not inside the scratch folder"
    try:
        data = open_untrusted(path, limit)
    except TransportError as err:
        return None, str(err)
    return data.decode("utf-8", errors="replace"), ""


def shell_limits(ctx: ToolContext) -> SandboxLimits:
    """One command's limits: the shell's settings, and the condition's time limit."""
    return SandboxLimits.for_shell(wall_s=ctx.shell_timeout_s)


def limits_note(ctx: ToolContext) -> str:
    """The limits, as the tool's description tells the model."""
    return (f"Limits of each command (going over ends it, and its output names the limit): "
            f"{shell_limits(ctx).summary()}.")


def _rlimits(file_bytes: int) -> Any:
    def apply() -> None:  # in the child, before bwrap starts: no file it writes grows past the scratch limit
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


class _Output:
    """A command's output, drained as it comes so that the command never blocks on a full pipe, keeping the
    first and the last OUTPUT_KEEP bytes and counting the rest."""

    def __init__(self, stream: Any) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        self.thread.start()

    def _drain(self, stream: Any) -> None:
        for chunk in iter(lambda: stream.read(8192), b""):
            self.total += len(chunk)
            room = OUTPUT_KEEP - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            self.tail = (self.tail + chunk)[-OUTPUT_KEEP:]

    def text(self) -> str:
        cut = self.total - len(self.head) - len(self.tail)
        middle = f"\n[... {cut} bytes of output cut ...]\n" if cut > 0 else ""
        return (bytes(self.head).decode(errors="replace") + middle + bytes(self.tail).decode(errors="replace"))


def run_shell(ctx: ToolContext, command: str, timeout: float) -> dict[str, Any]:
    """`command` in the sandbox under the shell's limits; returns exit code, output, seconds, whether the
    time limit ended it, and the limit it went over (`limit`, None when none)."""
    info = probe()
    if info.backend != "bwrap":
        raise ToolInputError(f"the shell needs the bubblewrap sandbox, which is unavailable here ({info.reason})")
    folder = scratch(ctx)
    limits = shell_limits(ctx).with_wall(timeout)
    # Hidden besides the run's folder: the checkout (problems/ holds the oracles, the held-out shapes and the
    # expert solutions), the harness's cache, and a PKB checkout (recorded solution sets of other models).
    spec = ctx.problem.loader_spec
    checkout = [Path(spec[4:].split("::", 1)[0])] if spec.startswith("pkb:") else []
    policy = SandboxPolicy(scratch=folder, hide=(*ctx.shell_hide, REPO_ROOT, cache_root(), *checkout), limits=limits,
                           info=info)
    env = clean_environment(dict(os.environ), folder)
    env.update({"HOME": str(folder), "PWD": str(folder)})
    cmd = policy.bwrap_command(["/bin/bash", "-c", command], folder)
    cgroup = MemoryCgroup.create(f"shell-{uuid.uuid4().hex[:8]}", limits.memory_bytes)
    if cgroup is not None:
        cmd = cgroup.join_command(cmd)
    started = time.perf_counter()
    watch: SandboxWatch | None = None
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True, preexec_fn=_rlimits(limits.scratch_bytes))
        output = _Output(proc.stdout)

        def kill() -> None:  # bwrap's group; the sandbox's PID namespace dies with it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

        watch = SandboxWatch(limits, proc.pid, [folder], kill=kill, cgroup=cgroup, full_tmpfs_ends=True).start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill()
            channel.kill_session(proc.pid)
            proc.wait()
        watch.stop()
        limit = watch.breach or (watch.explain() if proc.returncode != 0 and not timed_out else None)
        output.thread.join(timeout=10)
    finally:
        if watch is not None:
            watch.stop()
        if cgroup is not None:
            cgroup.remove()  # ends anything still charged to it
    return {"exit_code": proc.returncode, "timed_out": timed_out, "seconds": round(time.perf_counter() - started, 3),
            "output": output.text(), "output_bytes": output.total, "limit": limit}


def _harness_command(ctx: ToolContext, command: str, tool: str) -> ToolOutcome:
    """pkb-check / pkb-bench [FILE]: the file (default the condition's solution file) becomes the next
    candidate and the harness's tool runs on it, from the trusted side."""
    # Deferred: each imports the harness's evaluation; a shell command needs neither.
    from tools import bench, check

    try:
        words = shlex.split(command)
    except ValueError as err:  # an unclosed quote: the model's command, not the tool, is at fault
        raise ToolInputError(f"cannot read the command's words: {err}") from None
    if len(words) > 2:
        raise ToolInputError(f"{words[0]} takes one file name at most, relative to the scratch folder")
    rel = words[1] if len(words) == 2 else ctx.shell_solution
    text, why = read_file(scratch(ctx), rel)
    if text is None:
        return ToolOutcome("bash", bounded(ctx, [f"{words[0]}: cannot read {rel}: {why}"]),
                           {"tool": "bash", "command": command, "harness": tool, "error": why})
    candidate = save_candidate(ctx, text if text.endswith("\n") else text + "\n")
    outcome = (check if tool == "check" else bench).run({}, ctx, candidate)
    data = {**outcome.data, "tool": "bash", "command": command, "harness": tool, "file": rel}
    return ToolOutcome("bash", outcome.text, data, outcome.gpu_seconds, candidate)


def run(args: dict[str, Any], ctx: ToolContext, candidate: Path | None) -> ToolOutcome:
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolInputError("bash needs `command`: one shell command line")
    if len(command) > MAX_COMMAND_CHARS:
        raise ToolInputError(f"the command is {len(command)} characters; at most {MAX_COMMAND_CHARS}: write long "
                             "files in several commands")
    first = command.split()[0]
    if first in SHELL_HARNESS_COMMANDS:
        return _harness_command(ctx, command, SHELL_HARNESS_COMMANDS[first])
    prepare(ctx, {})
    done = run_shell(ctx, command, ctx.shell_timeout_s)
    status = (f"[killed after {ctx.shell_timeout_s:.0f} s: the per-command time limit]" if done["timed_out"]
              else f"[stopped: {done['limit']}]" if done["limit"]
              else f"[exit code {done['exit_code']}, {done['seconds']:.1f} s]")
    blocks = [Block(status)]
    if done["output"].strip():
        blocks.append(Block(done["output"].rstrip(), "both"))
    data = {"tool": "bash", "command": command, **{k: v for k, v in done.items() if k != "output"}}
    return ToolOutcome("bash", bounded(ctx, blocks), data, 0.0, None)
