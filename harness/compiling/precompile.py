"""Build a candidate's native code once, outside any process group, so the rank workers find it cached.

    python -m harness.compiling.precompile CANDIDATE [--problem LOADER_SPEC] [--report-fd FD] [--object-cache DIR]

The problem is loaded first, as the rank worker does: for a PKB checkout that puts its `utils` package
on the import path, which PKB solutions import before anything else. Then the candidate is imported
(builds at its top level happen then), and the builds its functions would make on their first call
(harness.compiling.builds: load_inline, cpp_extension.load, PKB's compile_cuda_extension, CuPy) are made now, with
the same arguments, so the extension lands in the cache under the same name and source hash.

Every torch extension build here goes through the split build (harness.compiling.split_build): the binding
unit's object comes from `--object-cache` (the read-only scope of objects the trusted side stored for this
candidate's folder, harness.compiling.binding_store; absent: none), the other units are compiled, and a stamp
tells the rank's first call that nothing is left to build (harness.rank.prebuilt). Each build entry carries
what the split build reported (`extension`, `binding_cache`, `split_seconds`); builds made while the module
was imported are entries of kind "at_import". These marks are this process's own account: informational,
they decide nothing.

Output: a line per build on stdout (the candidate's log: nothing there is believed), and one result:
    {"status": "ok" | "build_failed" | "import_failed",
     "builds": [{"name", "kind", "function", "line", "seconds", "ok", ["skipped"], ["error"],
                 ["extension", "binding_cache", "split_seconds"]}],
     "undiscovered": N, "not_made": [{"kind", "function", "line", "reason"}], "import": "ok" | "..."}
`ok` is null for a build skipped (a CUDA build where torch has no CUDA). Exit 3 with "build_failed" when a
build failed in the compiler; 0 with "ok", or with "import_failed" when the import raised something other
than a build failure (the workers judge that; nothing is cached).

Started by the compile stage (`--report-fd N`), the result travels on a private channel: a socket whose
other end the compile stage holds, which first gives this process a per-evaluation nonce. The candidate is
imported in a child process that zeroes its copy of the nonce and closes the channel before anything of
the candidate runs (report_privately); this process, which runs no candidate code, writes
`PKB_PRECOMPILE_RESULT <nonce> <result JSON>` there, once, when the child's exit code goes with its
result. A line the candidate prints is only log (it once forged the whole report: an invented build in
the record and the cache marked done). Anything else (no result, another exit code, a wrong nonce) is a
failure of the candidate's import: harness.compiling.compile fails closed. Run by hand (no --report-fd),
everything happens in one process and the result line, without a nonce, is printed last.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.common.failures import COMPILE_ERROR
from harness.common.hostile_files import HostileFile, strict_json
from harness.compiling import split_build
from harness.compiling.build_cache import ObjectCache
from harness.compiling.builds import BuildOutcome, Undiscovered, build_ahead, split_fields
from harness.compiling.source_text import SourceEncodingError, source_text
from harness.emulation.build_hook import rewrite_builds_of
from harness.problems.problem import import_file, module_name_for
from harness.problems.registry import load_problem_spec
from harness.rank.candidate import classify_load_error, trimmed_traceback

BUILD_FAILED = 3
RESULT_MARKER = "PKB_PRECOMPILE_RESULT "
OK_STATUS, BUILD_FAILED_STATUS, IMPORT_FAILED_STATUS = "ok", "build_failed", "import_failed"
STATUS_EXIT = {OK_STATUS: 0, BUILD_FAILED_STATUS: BUILD_FAILED, IMPORT_FAILED_STATUS: 0}
NONCE_BYTES = 16  # per evaluation, from the compile stage over the report channel
RESULT_CAP = 4 << 20  # bytes of the child's result this process reads
PR_SET_DUMPABLE = 4


def summary(outcomes: list[BuildOutcome], undiscovered: list[Undiscovered], imported: str,
            status: str, at_import: Sequence[split_build.BuildReport] = ()) -> dict[str, Any]:
    return {"status": status, "builds": [*map(_at_import, at_import), *(o.as_dict() for o in outcomes)],
            "undiscovered": len(undiscovered), "not_made": [vars(u) for u in undiscovered], "import": imported}


def _at_import(report: split_build.BuildReport) -> dict[str, Any]:
    """A build entry for an extension the module built while it was imported."""
    return {"name": report.extension, "kind": "at_import", "function": "<module>", "line": 0,
            "seconds": round(sum(report.seconds.values()), 3), "ok": True, **split_fields(report.as_dict())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pkb-agent precompile (started by harness.compiling.compile)")
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--problem", default=None, help="the problem's loader spec")
    parser.add_argument("--report-fd", type=int, default=None,
                        help="the private channel: the nonce is read from it, the result written to it")
    parser.add_argument("--object-cache", type=Path, default=None,
                        help="the read-only object cache of this candidate's scope (binding units)")
    args = parser.parse_args(argv)
    cache = ObjectCache(args.object_cache) if args.object_cache is not None else None
    if not args.candidate.is_absolute() or not args.candidate.is_file():
        print(f"precompile: {args.candidate} is not an absolute path to a file")  # no result line: a failure
        return 2
    if args.problem:
        try:
            load_problem_spec(args.problem)
        except Exception as exc:
            print(f"the problem did not load ({type(exc).__name__}: {exc}); importing the candidate anyway")
    if args.report_fd is None:  # by hand: everything in this process, the result line last on stdout
        result = import_and_build(args.candidate, cache)
        if result is None:
            return 2
        print(RESULT_MARKER + json.dumps(result, default=str), flush=True)
        return STATUS_EXIT[result["status"]]
    return report_privately(args.candidate, args.report_fd, cache)


def import_and_build(candidate: Path, cache: ObjectCache | None = None) -> dict[str, Any] | None:
    """Import the candidate and make its builds, printing a line for each; the result (None: the source
    could not be read). Candidate code runs here."""
    # Multimem is rewritten into unicast accesses before torch builds it, as in emulated ranks (docs/emulation.md):
    # the rewrite is in torch's source writer, the split build in its ninja runner, which runs after it.
    rewrite_builds_of(candidate.read_text(errors="replace"))
    split_build.install(cache, writable=False)  # this process runs candidate code: it never writes the cache
    first = len(split_build.REPORTS)
    try:
        module = import_file(candidate, module_name_for(candidate, "pkb_precompile"))
    except BaseException as exc:
        if classify_load_error(exc) == COMPILE_ERROR:
            print(trimmed_traceback(exc))
            return summary([], [], "a build at import failed", BUILD_FAILED_STATUS)
        print(f"import raised {type(exc).__name__} (not a build failure; left to the rank workers)")
        return summary([], [], f"raised {type(exc).__name__}", IMPORT_FAILED_STATUS)
    at_import = split_build.REPORTS[first:]
    try:
        source = source_text(candidate.read_bytes())  # the compile stage refused any other encoding
    except SourceEncodingError as err:
        print(f"precompile: {err}")
        return None
    outcomes, undiscovered = build_ahead(module, source)
    failed = False
    for o in outcomes:
        if o.ok:
            print(f"built {o.name} ({o.kind}, called in {o.function} line {o.line}) in {o.seconds:.1f} s")
        elif o.ok is None:
            print(f"skipped {o.name} ({o.kind}, called in {o.function} line {o.line}): {o.skipped}")
        elif o.exception is not None and classify_load_error(o.exception) == COMPILE_ERROR:
            failed = True
            print(f"build of {o.name} ({o.kind}, called in {o.function} line {o.line}) failed after "
                  f"{o.seconds:.1f} s:\n{o.error}")
        else:  # not the compiler: the first call would raise the same, and the workers judge that
            print(f"calling {o.kind} for {o.name} (in {o.function} line {o.line}) raised, not in the compiler: "
                  f"{o.error.splitlines()[0] if o.error else ''}")
    for u in undiscovered:
        print(f"not built ahead: {u.kind} in {u.function} line {u.line}: {u.reason}")
    return summary(outcomes, undiscovered, "ok", BUILD_FAILED_STATUS if failed else OK_STATUS, at_import)


def _set_dumpable(on: bool) -> None:
    """prctl(PR_SET_DUMPABLE): a process that is not dumpable cannot be traced, and its /proc/<pid>/fd and
    memory cannot be opened, by another process of its uid without CAP_SYS_PTRACE."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def report_privately(candidate: Path, report_fd: int, cache: ObjectCache | None = None) -> int:
    """The candidate imported and built in a child process that never holds the report channel; this
    process (which runs no candidate code) writes the child's result, with the nonce, to the channel.

    The nonce is read from the channel, into a buffer that the child zeroes before it imports anything;
    the child then closes the channel, so nothing the candidate prints or writes reaches it. This process is
    made undumpable first, so the child (same uid) can neither open its descriptors through /proc nor
    trace it. The child hands its result over a pipe: a candidate that writes that pipe itself (knowing this
    protocol) still chooses the builds listed; it cannot make a line of its output count as the report."""
    nonce = bytearray(NONCE_BYTES)
    got = os.readv(report_fd, [nonce])
    if got != NONCE_BYTES:
        print("precompile: the report channel gave no nonce")
        return 2
    _set_dumpable(False)
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the child: candidate code runs here, without the channel or the nonce
        code = 2
        try:
            nonce[:] = bytes(NONCE_BYTES)
            os.close(report_fd)
            os.close(read_end)
            _set_dumpable(True)
            result = import_and_build(candidate, cache)
            if result is not None:
                _write_all(write_end, json.dumps(result, default=str).encode())
                code = STATUS_EXIT[result["status"]]
        finally:
            sys.stdout.flush()
            os._exit(code)
    os.close(write_end)
    data = _read_capped(read_end, RESULT_CAP)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    result = _checked_result(data, code)
    if result is not None:
        line = RESULT_MARKER.encode() + bytes(nonce).hex().encode() + b" " + json.dumps(result).encode() + b"\n"
        _write_all(report_fd, line)
    os.close(report_fd)
    return code if code >= 0 else 128 - code  # killed by a signal: as a shell says it


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_capped(fd: int, cap: int) -> bytes:
    """Everything written to the pipe `fd` until every writer closed it; more than `cap` bytes is nothing."""
    chunks, total = [], 0
    while chunk := os.read(fd, 1 << 16):
        total += len(chunk)
        if total <= cap:
            chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks) if total <= cap else b""


def _checked_result(data: bytes, code: int) -> dict[str, Any] | None:
    """The child's result, parsed strictly, when its exit code is the one its status goes with; else None."""
    try:
        result = strict_json(data, "the build's result")
    except HostileFile:
        return None
    if not isinstance(result, dict) or result.get("status") not in STATUS_EXIT or code != STATUS_EXIT[result["status"]]:
        return None
    return result

if __name__ == "__main__":
    sys.exit(main())
