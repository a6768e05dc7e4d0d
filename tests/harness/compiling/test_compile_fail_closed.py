"""harness.compiling.compile fails closed: only a build its helper reported as a success, with exit code 0, is one;
only that is cached; paths handed to the helper are absolute; a helper that crashes, reports nothing, or
reports something its exit code contradicts is the candidate's compile_error."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from harness.common.hostile_files import Folder
from harness.compiling import compile as build
from harness.compiling.compile import cached_builds, compile_candidate, entry_for, parse_report
from harness.compiling.precompile import RESULT_MARKER
from harness.compiling.slots import BuildSlots

MARKER = "from torch.utils.cpp_extension import load_inline  # a native build: the helper runs\n"
# No torch header in either source (no_implicit_headers): the compiler's pass over torch's headers is ~20 s on
# 2 cores, and neither test is about them. The syntax error stops the compiler at once; the module that builds
# includes pybind11 alone (~5 s).
SYNTAX_ERROR = r'''from torch.utils.cpp_extension import load_inline

SOURCE = r"""
int twice(int x) { return x +; }
"""
_module = load_inline("pkb_test_cxx_syntax_error", cpp_sources=SOURCE, functions=["twice"], no_implicit_headers=True)


def solution(x):
    return x * _module.twice(1)
'''


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def test_the_result_line_is_parsed_strictly():
    good = RESULT_MARKER + '{"status": "ok", "builds": [], "import": "ok"}'
    report = parse_report(f"built x\n{good}\n\n")
    assert report is not None and report["status"] == "ok"
    for text in ("", "built x", f"{good}\nprinted after the result", RESULT_MARKER + '{"status": "ok"}',
                 RESULT_MARKER + '{"status": "fine", "builds": []}', RESULT_MARKER + '{"status": "ok", "builds": [1]}',
                 RESULT_MARKER + '{"status": "ok", "status": "ok", "builds": []}',
                 RESULT_MARKER + '{"status": "ok", "builds": []} trailing', '{"status": "ok", "builds": []}'):
        assert parse_report(text) is None, text


@pytest.mark.slow
def test_a_cxx_syntax_error_is_a_compile_error_from_any_working_directory(tmp_path, monkeypatch):
    """The runs folder is relative: run from elsewhere, a relative path once named no file in the helper (which
    works in the checkout), the import 'failed' for another reason, and the broken build came back OK."""
    _write(tmp_path / "runs" / "s" / "candidates", "000.py", SYNTAX_ERROR)
    monkeypatch.chdir(tmp_path)
    relative = Path("runs/s/candidates/000.py")
    outcome = compile_candidate(relative, 900.0, "cpu")
    assert not outcome.ok and outcome.verdict == "compile_error", outcome
    assert outcome.message == "native build failed"
    assert "main.cpp" in outcome.evidence and "error" in outcome.evidence and "x +;" in outcome.evidence
    assert cached_builds(entry_for(relative.read_bytes(), None)) is None  # nothing but success is cached


def test_a_crashing_helper_is_a_compile_error_and_nothing_is_cached(tmp_path):
    crash = _write(tmp_path, "crash.py", MARKER + "import os\nos._exit(7)\n\ndef solution(x):\n    return x\n")
    outcome = compile_candidate(crash, 300.0, "cpu")
    assert not outcome.ok and outcome.verdict == "compile_error"
    assert "exited with code 7 without reporting a result" in outcome.message
    killed = _write(tmp_path, "killed.py", MARKER + "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
                                                    "def solution(x):\n    return x\n")
    outcome = compile_candidate(killed, 300.0, "cpu")
    # bwrap reports a child killed by a signal as exit code 128 + the signal
    assert not outcome.ok and ("killed by signal 11" in outcome.message or "exited with code 139" in outcome.message)
    for path in (crash, killed):
        assert cached_builds(entry_for(path.read_bytes(), None)) is None


def test_a_result_line_on_stdout_is_only_the_candidates_log(tmp_path):
    """The helper reports on a private channel with a nonce (was: its last stdout line, which the candidate
    could print). A forged line and an early exit is a helper that reported nothing; a line printed after the
    helper's own report changes nothing."""
    forged = _write(tmp_path, "forged.py", MARKER + "import os\n"
                    f"print({RESULT_MARKER!r} + '{{\"status\": \"ok\", \"builds\": []}}', flush=True)\nos._exit(0)\n"
                    "def solution(x):\n    return x\n")
    outcome = compile_candidate(forged, 300.0, "cpu")
    assert not outcome.ok and "exited with code 0 without reporting a result" in outcome.message
    assert cached_builds(entry_for(forged.read_bytes(), None)) is None
    late = _write(tmp_path, "late.py", MARKER + "import atexit\natexit.register(print, 'after the result')\n"
                                                "def solution(x):\n    return x\n")
    outcome = compile_candidate(late, 300.0, "cpu")
    assert outcome.ok, outcome


def test_the_channel_report_needs_the_nonce_and_is_one_line():
    good = RESULT_MARKER + "ab12 " + '{"status": "ok", "builds": [], "import": "ok"}'
    report = parse_report(good + "\n", "ab12")
    assert report is not None and report["status"] == "ok"
    for text in (good, good + "\n\n", "log\n" + good + "\n", good + "\n" + good + "\n",
                 good.replace("ab12", "ab13") + "\n", good.replace("ab12 ", "") + "\n"):
        assert parse_report(text, "ab12") is None, text


def test_only_a_success_is_cached(tmp_path):
    raising = _write(tmp_path, "raising.py", MARKER + "raise ValueError('not a build')\n")
    outcome = compile_candidate(raising, 300.0, "cpu")
    assert outcome.ok and "raised ValueError" in outcome.message and not outcome.cached
    assert cached_builds(entry_for(raising.read_bytes(), None)) is None  # looked at again next time
    fine = _write(tmp_path, "fine.py", MARKER + "def solution(x):\n    return x\n")
    first = compile_candidate(fine, 300.0, "cpu")
    assert first.ok and not first.cached and cached_builds(entry_for(fine.read_bytes(), None)) == []
    second = compile_candidate(fine, 300.0, "cpu")
    assert second.ok and second.cached


def test_a_build_folder_with_a_planted_link_is_refused_not_cached(tmp_path):
    planted = _write(tmp_path, "planted.py", MARKER + "import os\n"
                     "os.symlink('/etc/shadow', os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], 'escape'))\n"
                     "def solution(x):\n    return x\n")
    outcome = compile_candidate(planted, 300.0, "cpu")
    assert not outcome.ok and "the build's output was refused" in outcome.message and "escape" in outcome.message
    assert cached_builds(entry_for(planted.read_bytes(), None)) is None


def test_a_helper_that_prints_too_much_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "HELPER_OUTPUT_CAP", 1 << 20)
    loud = _write(tmp_path, "loud.py", MARKER + "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    outcome = compile_candidate(loud, 300.0, "cpu")
    assert not outcome.ok and "printed more than 1 MiB" in outcome.message


def test_a_broken_cache_entry_is_a_miss_and_is_replaced(tmp_path):
    fine = _write(tmp_path, "entry.py", MARKER + "def solution(x):\n    return 2 * x\n")
    entry = entry_for(fine.read_bytes(), None)
    entry.mkdir(parents=True, exist_ok=True)
    os.mkfifo(entry / build.DONE)  # planted: a reader that opened it would block
    assert cached_builds(entry) is None
    outcome = compile_candidate(fine, 300.0, "cpu")
    assert outcome.ok and cached_builds(entry) == []


def test_lazy_builds_are_kept_only_when_they_are_plain_files(tmp_path):
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / build.DONE).write_text("[]")
    copy = tmp_path / "copy"
    (copy / "good").mkdir(parents=True)
    (copy / "good" / "good.so").write_bytes(b"\x7fELF")
    (copy / "bad").mkdir()
    (copy / "bad" / "bad.so").write_bytes(b"\x7fELF")
    os.symlink("/etc", copy / "bad" / "etc")
    os.symlink(tmp_path, copy / "linked")  # a link to a folder with .so files would once have been copied whole
    with Folder.open(copy) as files:
        assert build.keep_lazy_builds(files, entry) == ["good"]
    assert sorted(p.name for p in entry.iterdir()) == sorted([build.DONE, "good"])


def test_stopping_a_build_removes_only_its_own_locks(tmp_path):
    """The build folder is candidate-written: a folder linked from it leads to other builds' locks."""
    from harness.common.channel import remove_build_locks

    build_dir, elsewhere = tmp_path / "ext", tmp_path / "cache" / "other_build"
    (build_dir / "mine").mkdir(parents=True)
    elsewhere.mkdir(parents=True)
    (build_dir / "mine" / "lock").write_text("")
    (elsewhere / "lock").write_text("")
    os.symlink(elsewhere, build_dir / "linked")
    assert remove_build_locks(build_dir, 0.0) == ["mine"]
    assert (elsewhere / "lock").exists() and not (build_dir / "mine" / "lock").exists()


CORRECT_LOAD_INLINE = r'''from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <pybind11/pybind11.h>
int twice(int x) { return x * 2; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"""
_module = load_inline("pkb_test_cxx_outside_usr", cpp_sources=SOURCE, no_implicit_headers=True)


def solution(x):
    return x * _module.twice(1)
'''


@pytest.mark.slow
def test_a_compiler_installed_outside_usr_builds_in_the_sandbox(tmp_path, monkeypatch):
    """The H200 node names its compiler by path outside /usr (CXX=/opt/gcc/bin/g++): the sandbox bound only
    /usr and the interpreter, and every PKB candidate was a compile_error ("g++: not found"). The compiler's
    install prefix is bound now (harness.launch.sandbox.mounts.toolchain_folders)."""
    from harness.launch.sandbox import probe

    if probe().backend != "bwrap":
        pytest.skip("no bubblewrap here: without a sandbox every folder is visible and the case cannot arise")
    prefix = tmp_path / "opt" / "toolchain"
    (prefix / "bin").mkdir(parents=True)
    wrapper = prefix / "bin" / "g++"
    wrapper.write_text("#!/bin/sh\nexec /usr/bin/g++ \"$@\"\n")
    wrapper.chmod(0o755)
    for folder in (tmp_path, tmp_path / "opt", prefix, prefix / "bin"):
        folder.chmod(0o755)  # the sandbox's uid walks to it, as to /opt/gcc
    monkeypatch.setenv("CXX", str(wrapper))
    candidate = _write(tmp_path / "code", "outside.py", CORRECT_LOAD_INLINE)
    outcome = compile_candidate(candidate, 900.0, "cpu")
    assert outcome.ok and outcome.extensions is not None, outcome


def test_no_more_native_builds_run_at_once_than_there_are_slots_and_a_wait_is_not_build_time(tmp_path, monkeypatch):
    """Builds beyond the slots (one per core) queue before their clock starts; one that waited finds what
    another evaluation built meanwhile instead of building it again. The build itself is a stand-in that
    records how many ran at once (the real helper is tested above)."""
    import threading
    import time

    running, peak, lock = [0], [0], threading.Lock()
    built: list[str] = []
    done: dict[Path, list[Any]] = {}

    def fake_build(path, raw, entry, timeout, device, problem, limits):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
            built.append(path.name)
            done[entry] = []
        return build.CompileOutcome(True, 0.2, native=True)

    def compile_all(paths: list[Path]) -> tuple[list[threading.Thread], list[build.CompileOutcome]]:
        outcomes: list[build.CompileOutcome] = []
        threads = [threading.Thread(target=lambda p=p: outcomes.append(compile_candidate(p, 300.0, "cpu")))
                   for p in paths]
        for t in threads:
            t.start()
        return threads, outcomes

    monkeypatch.setattr(build, "_build", fake_build)
    monkeypatch.setattr(build, "cached_builds", lambda entry: done.get(entry))
    monkeypatch.setattr(build, "BUILD_SLOTS", BuildSlots(2))
    sources = [_write(tmp_path, f"c{k}.py", MARKER + f"def solution(x):\n    return x + {k}\n") for k in range(5)]
    threads, outcomes = compile_all(sources)
    for t in threads:
        t.join(30)
    assert peak[0] == 2 and len(outcomes) == 5 and all(o.ok and o.seconds == 0.2 for o in outcomes)

    # Two evaluations of one new source wait for the only slot; the second finds the first's build.
    monkeypatch.setattr(build, "BUILD_SLOTS", BuildSlots(1))
    taken = build.BUILD_SLOTS.shared()
    taken.__enter__()
    twin = [_write(tmp_path / side, "twin.py", MARKER + "def solution(x):\n    return x * 3\n")
            for side in ("a", "b")]
    threads, outcomes = compile_all(twin)
    time.sleep(0.3)  # both asked, both missed the cache, both wait
    assert outcomes == [] and "twin.py" not in built
    taken.__exit__(None, None, None)
    for t in threads:
        t.join(30)
    assert built.count("twin.py") == 1 and sorted(o.cached for o in outcomes) == [False, True]


def _overrun(seconds: float) -> build.CompileOutcome:
    return build.CompileOutcome(False, seconds, "compile_error", f"compilation did not finish within {seconds:.0f} s",
                                native=True, timed_out=True)


def test_a_build_that_overran_its_limit_beside_others_is_built_again_alone(tmp_path, monkeypatch):
    """A wall-time limit is one neighbours can make a build miss (57_ring_attention_pp, correct in three runs,
    went past 180 s beside 13 builds on the H200, 2026-12-03): the verdict that counts is the build's alone.
    Stand-in builds: the slow one overruns only while another build runs."""
    import threading
    import time

    monkeypatch.setattr(build, "BUILD_SLOTS", BuildSlots(4))
    log: list[tuple[str, int]] = []
    slow_started = threading.Event()

    def fake_build(path, raw, entry, timeout, device, problem, limits):
        beside = build.BUILD_SLOTS.running() - 1
        log.append((path.name, beside))
        if path.name == "slow.py":
            slow_started.set()
            time.sleep(0.3)
            crowded = build.BUILD_SLOTS.running() > 1  # the fast build is still running beside it
            return _overrun(timeout) if crowded else build.CompileOutcome(True, 0.3, native=True)
        slow_started.wait(10)
        time.sleep(0.5)
        return build.CompileOutcome(True, 0.5, native=True)

    monkeypatch.setattr(build, "_build", fake_build)
    monkeypatch.setattr(build, "cached_builds", lambda entry: None)
    slow = _write(tmp_path, "slow.py", MARKER + "def solution(x):\n    return x\n")
    fast = _write(tmp_path, "fast.py", MARKER + "def solution(x):\n    return x + 1\n")
    outcomes: dict[str, build.CompileOutcome] = {}
    threads = [threading.Thread(target=lambda p=p: outcomes.__setitem__(p.name, compile_candidate(p, 180.0, "cpu")))
               for p in (fast, slow)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes["fast.py"].ok and outcomes["slow.py"].ok
    assert outcomes["slow.py"].built_again_alone["beside"] == 1
    assert "did not finish" in outcomes["slow.py"].built_again_alone["message"]
    assert outcomes["slow.py"].seconds == pytest.approx(180.3)  # the compile stage took both tries
    assert [entry for entry in log if entry[0] == "slow.py"][-1] == ("slow.py", 0)  # the second try ran alone


def test_an_overrun_alone_is_the_candidates_and_is_not_built_again(tmp_path, monkeypatch):
    import threading
    import time

    monkeypatch.setattr(build, "BUILD_SLOTS", BuildSlots(4))
    calls: list[str] = []

    def fake_build(path, raw, entry, timeout, device, problem, limits):
        calls.append(path.name)
        return _overrun(timeout)

    monkeypatch.setattr(build, "_build", fake_build)
    monkeypatch.setattr(build, "cached_builds", lambda entry: None)
    hang = _write(tmp_path, "hang.py", MARKER + "def solution(x):\n    return x\n")
    outcome = compile_candidate(hang, 180.0, "cpu")
    assert calls == ["hang.py"] and not outcome.ok and outcome.verdict == "compile_error"
    assert outcome.built_again_alone == {} and outcome.message == "compilation did not finish within 180 s"

    # Beside another build it overruns twice: a compile_error that says it was tried alone too.
    with build.BUILD_SLOTS.shared():
        result: list[build.CompileOutcome] = []
        waiter = threading.Thread(target=lambda: result.append(compile_candidate(hang, 180.0, "cpu")))
        waiter.start()
        time.sleep(0.3)
    waiter.join(30)
    assert calls == ["hang.py"] * 3 and not result[0].ok
    assert "alone; it had also overrun its limit beside 1 other build(s)" in result[0].message

GREEDY = MARKER + """import os, time
try:
    os.nice(-5)
    how = "lowered"
except OSError:
    how = "refused"


def session():
    try:
        return open("/proc/self/autogroup").read().split()[-1]
    except OSError:
        return "none"


before = session()
try:  # any process may set its own session back to 0
    fd = os.open("/proc/self/autogroup", os.O_WRONLY)
    os.write(fd, b"0")
    os.close(fd)
    undone = session()
except OSError:
    undone = "refused"
time.sleep(2.5)  # the harness's watch looks once a second
print(f"niceness {os.nice(0)} {how}; session {before} {undone} {session()}", flush=True)
os._exit(5)
"""


def test_a_build_runs_nicer_than_the_harness_and_cannot_take_its_share_back(tmp_path):
    """The helper (and the compilers it starts) yields the CPU to evaluations holding a device: by its own
    nice value, which the sandboxed import cannot lower, and by its session's, which Linux's autogroups weigh
    against other sessions and which any process may set back to 0: the harness sets it again."""
    from harness.launch.priority import niced
    from harness.launch.sandbox import probe

    outcome = compile_candidate(_write(tmp_path, "greedy.py", GREEDY), 300.0, "cpu")
    assert not outcome.ok and "exited with code 5" in outcome.message, outcome
    harness_niceness = os.nice(0)
    seen = re.search(r"niceness (-?\d+) (lowered|refused); session (\S+) (\S+) (\S+)", outcome.evidence)
    assert seen is not None, outcome.evidence
    sandbox = probe()
    sandboxed = sandbox.backend == "bwrap" and (sandbox.host_uid_switch or os.geteuid() != 0)
    if sandboxed:
        assert seen[2] == "refused" and int(seen[1]) == min(19, harness_niceness + build.BUILD_NICENESS)
        assert int(seen[1]) > harness_niceness
    else:  # a root helper outside a sandbox may lower it again: the command still starts it nicer
        assert niced(["true"], build.BUILD_NICENESS)[1:3] == ["-n", str(build.BUILD_NICENESS)]
        assert build.BUILD_NICENESS > 0
    autogroups = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if autogroups.is_file() and autogroups.read_text().strip() == "1":
        assert seen[3] == str(build.BUILD_NICENESS)
        if sandboxed:  # the watch set it again
            assert seen[4] in ("0", "refused") and seen[5] == str(build.BUILD_NICENESS), seen[0]
