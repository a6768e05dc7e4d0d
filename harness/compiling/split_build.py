"""A load_inline build split in two: the binding unit from a cache, only the CUDA unit compiled again.

torch's load_inline writes `main.cpp` (torch/extension.h, the cpp_sources and the PYBIND11 module it
generates) and `cuda.cu` (the cuda_sources) into the extension's build folder, then a `build.ninja`, then
runs ninja: both units compiled, then linked. In an agent's loop the CUDA unit changes at every edit and the
binding unit almost never, yet both are compiled each time, each a host pass over torch's headers.

`install(cache)` replaces torch's `_run_ninja_build` (looked up by name at call time, so every caller goes
through it) with `build`, which reads the `build.ninja` torch just wrote and:
- takes the binding unit's object from `cache` (harness.compiling.build_cache) under `unit_key`: the
  unit's bytes, its full compile command (compiler, every flag, include paths; the build folder's own path
  written as a placeholder) and the compiler's version text; the cache checks the headers the object was
  built from. A miss compiles it (beside the CUDA unit, not after it) and, where the cache is writable,
  stores it;
- compiles every other unit as ninja would (nvcc with `-t` where the command names several architectures);
- links, and writes a stamp of what was built (harness.rank.prebuilt), so a later call with the same folder
  (the rank's own first call after the precompile, which installs prebuilt's check) builds nothing.
The commands are ninja's own (`/bin/sh -c`, in the build folder), so a build behaves as torch's does; a
unit whose command ninja's file does not spell as torch writes it makes the whole build fall back to
ninja. Multimem is rewritten before this runs: harness.emulation.build_hook rewrites `cuda.cu` as torch
writes it, and this module compiles what is on disk.

Trust: the cache is only ever written by a process no candidate code shares (the benchmark, the trusted
binding store: harness.compiling.binding_store); build processes that import a candidate get a read-only
cache or none (`writable=False`). What `REPORTS` says is the candidate process's own account: informational.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache as memoized
from pathlib import Path
from typing import Any

from harness.compiling.build_cache import ObjectCache, digest, input_digests
from harness.rank import prebuilt

BUILD_DIR_MARK = "<build>"
BINDING_SOURCE = "main.cpp"
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) = ?(.*)$")
_BUILD = re.compile(r"^build (\S+): (\w+) (.+)$")
_RULE_COMMANDS = {  # torch's rules, as its versions write them
    "compile": ("$cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags",),
    # A CPU build of torch writes the first; a CUDA build (torch.version.cuda set) asks nvcc for a depfile,
    # as 2.1x writes it (the second; the one-GPU edit benchmark of 2026-12-07 fell back to ninja on every
    # build until it was listed) or as older versions did (the third).
    "cuda_compile": ("$nvcc $cuda_cflags -c $in -o $out $cuda_post_cflags",
                     "$nvcc -MD -MF $out.d $cuda_cflags -c $in -o $out $cuda_post_cflags",
                     "$nvcc --generate-dependencies-with-compile --dependency-output $out.d $cuda_cflags -c $in "
                     "-o $out $cuda_post_cflags"),
    "link": ("$cxx $in $ldflags -o $out",),
}


class SplitUnavailable(Exception):
    """The build.ninja is not one this module reads: ninja builds it instead."""


@dataclass
class Unit:
    """One object to build: its output, rule and input (absolute), and the command ninja would run."""

    output: str
    rule: str
    source: str
    command: str


@dataclass
class Plan:
    units: list[Unit]
    link: Unit  # `source`: the objects, space separated
    library: str


@dataclass
class BuildReport:
    """What one split build did: seconds per step, and whether the binding unit came from the cache."""

    binding: str = "none"  # "hit", "miss", "none" (no binding unit), "up_to_date"
    seconds: dict[str, float] = field(default_factory=dict)
    stored: bool = False
    extension: str = ""  # the build folder's name (torch names it after the extension)

    def as_dict(self) -> dict[str, Any]:
        return {"extension": self.extension, "binding_cache": self.binding, "stored": self.stored,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}}


REPORTS: list[BuildReport] = []  # this process's split builds, in order (the precompile's record reads them)


def _expand(template: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), ""), template)


def plan(build_directory: Path) -> Plan:
    """torch's build.ninja, read: the units and the link. SplitUnavailable for anything else."""
    return parse((build_directory / "build.ninja").read_text())


def parse(text: str) -> Plan:
    """A build.ninja's text, read as `plan` reads it (the trusted side reads the file itself, as hostile)."""
    variables: dict[str, str] = {}
    rules: dict[str, str] = {}
    edges: list[tuple[str, str, str]] = []
    current_rule: str | None = None
    for line in text.splitlines():
        if line.startswith("rule "):
            current_rule = line[5:].strip()
            continue
        if line.startswith("  ") and current_rule is not None:
            if line.strip().startswith("command = "):
                rules[current_rule] = line.strip()[len("command = "):]
            continue
        current_rule = None
        if match := _BUILD.match(line):
            edges.append((match.group(1), match.group(2), match.group(3)))
        elif match := _ASSIGN.match(line):
            variables[match.group(1)] = match.group(2)
    for rule, command in rules.items():
        if " ".join(command.split()) not in _RULE_COMMANDS.get(rule, ()):
            raise SplitUnavailable(f"rule {rule!r} is not torch's")
    units: list[Unit] = []
    link: Unit | None = None
    for output, rule, inputs in edges:
        if rule not in rules or "|" in inputs:
            raise SplitUnavailable(f"build {output}: {rule} is not one this module runs")
        command = _expand(rules[rule], {**variables, "in": inputs, "out": output})
        unit = Unit(output, rule, inputs, command)
        if rule == "link":
            if link is not None:
                raise SplitUnavailable("two links")
            link = unit
        else:
            units.append(unit)
    if link is None:
        raise SplitUnavailable("no link")
    return Plan(units, link, link.output)


@memoized
def compiler_identity(command_word: str) -> str:
    """The compiler's `--version` text (part of every key: another compiler, another object)."""
    try:
        out = subprocess.run([command_word, "--version"], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.decode(errors="replace") if out.returncode == 0 else ""


def _torch_identity() -> str:
    import torch

    return f"{torch.__version__} {torch.version.git_version} {torch.version.cuda}"


def _toolkit_identity() -> str:
    """The CUDA toolkit's version text: its headers come in through -isystem, which a depfile leaves out."""
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    return compiler_identity(os.path.join(home, "bin", "nvcc")) if home else ""


def unit_key(unit: Unit, build_directory: Path, source: bytes) -> str | None:
    """The cache key of a unit: its source bytes (`source`: read by the caller, from the build folder or,
    on the trusted side, from the stored snapshot), its command (the build folder as a placeholder), the
    compiler's version, torch's and the CUDA toolkit's (their headers are -isystem ones, which the depfile
    the cache checks leaves out); None when the compiler's version cannot be read (nothing is cached)."""
    words = shlex.split(unit.command)
    identity = compiler_identity(words[0]) if words else ""
    if not identity:
        return None
    # The folder's path where it stands whole (followed by "/" or a space): "/x/b" is no part of "/x/bin".
    command = re.sub(re.escape(str(build_directory)) + r"(?=/|\s|$)", BUILD_DIR_MARK, unit.command)
    return digest(b"split-build-unit-1", source, command.encode(), identity.encode(), _torch_identity().encode(),
                  _toolkit_identity().encode())


def _threads(command: str) -> str:
    """nvcc's `-t` where the command builds for several architectures and sets no thread count."""
    archs = len(re.findall(r"-gencode[= ]", command))
    if archs < 2 or re.search(r"(^| )(-t|--threads)[= ]?\d", command):
        return command
    return f"{command} -t {min(archs, os.cpu_count() or 1)}"


def _run(command: str, cwd: Path) -> tuple[int, str, float]:
    started = time.perf_counter()
    proc = subprocess.run(["/bin/sh", "-c", command], cwd=cwd, capture_output=True, check=False)
    text = (proc.stdout + proc.stderr).decode(errors="replace")
    return proc.returncode, text, time.perf_counter() - started


def _depfile_inputs(depfile: Path, source: str) -> list[str] | None:
    """The files a compile read besides its source, from its make-style depfile."""
    try:
        text = depfile.read_text()
    except OSError:
        return None
    body = text.split(":", 1)[1] if ":" in text else ""
    paths = shlex.split(body.replace("\\\n", " "))
    return sorted({os.path.abspath(p) for p in paths if os.path.abspath(p) != os.path.abspath(source)})


def _stamp_files(build_directory: Path, built: Plan) -> list[Path]:
    """What a build depended on, build.ninja first: harness.rank.prebuilt hashes them into its stamp."""
    return [build_directory / "build.ninja", *(Path(u.source) for u in built.units), build_directory / built.library]


def build(build_directory: Path, cache: ObjectCache | None, *, writable: bool) -> BuildReport:
    """Build the extension torch described in `build_directory`; RuntimeError with the compiler's output
    when a step fails (as torch's own ninja runner raises)."""
    built = plan(build_directory)
    report = BuildReport(extension=build_directory.name)
    if prebuilt.up_to_date(build_directory):
        report.binding = "up_to_date"
        return report
    binding = next((u for u in built.units if u.rule == "compile" and Path(u.source).name == BINDING_SOURCE), None)
    jobs: dict[str, Callable[[], tuple[int, str, float]]] = {}
    key: str | None = None
    if binding is not None:
        key = unit_key(binding, build_directory, Path(binding.source).read_bytes()) if cache is not None else None
        hit = cache.lookup(key) if cache is not None and key is not None else None
        if hit is not None:
            started = time.perf_counter()
            (build_directory / binding.output).write_bytes(hit.read_bytes())
            report.binding, report.seconds[binding.output] = "hit", time.perf_counter() - started
        else:
            report.binding = "miss"
            jobs[binding.output] = functools.partial(_run, binding.command, build_directory)
    for unit in built.units:
        if unit is not binding:
            command = _threads(unit.command) if unit.rule == "cuda_compile" else unit.command
            jobs[unit.output] = functools.partial(_run, command, build_directory)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        results = {name: pool.submit(job) for name, job in jobs.items()}
        for name, future in results.items():
            code, text, seconds = future.result()
            report.seconds[name] = seconds
            if code != 0:
                raise RuntimeError(f"Error building extension: {name} failed\n{text}")
    if binding is not None and report.binding == "miss" and cache is not None and writable and key is not None:
        inputs = _depfile_inputs(build_directory / f"{binding.output}.d", binding.source)
        digests = input_digests(inputs) if inputs is not None else None
        if digests is not None:
            report.stored = cache.store(key, build_directory / binding.output, digests)
    code, text, seconds = _run(built.link.command, build_directory)
    report.seconds[built.link.output] = seconds
    if code != 0:
        raise RuntimeError(f"Error building extension: link failed\n{text}")
    prebuilt.write_stamp(build_directory, _stamp_files(build_directory, built))
    return report


_saved: dict[str, Any] = {}


def install(cache: ObjectCache | None, *, writable: bool) -> None:
    """Replace torch's ninja runner in this process with the split build; idempotent. A build.ninja this
    module does not read is built by torch's own runner."""
    if _saved:
        return
    from torch.utils import cpp_extension

    original: Callable[..., None] = cpp_extension._run_ninja_build

    def run_ninja_build(build_directory: str, verbose: bool, error_prefix: str) -> None:
        try:
            REPORTS.append(build(Path(build_directory), cache, writable=writable))
        except SplitUnavailable:
            original(build_directory, verbose, error_prefix)
        except RuntimeError as err:
            raise RuntimeError(f"{error_prefix}: {err}") from None

    _saved["_run_ninja_build"] = original
    cpp_extension._run_ninja_build = run_ninja_build


def uninstall() -> None:
    """Put torch's runner back (tests and the benchmark)."""
    from torch.utils import cpp_extension

    for name, value in _saved.items():
        setattr(cpp_extension, name, value)
    _saved.clear()
