"""Isolation: the sandbox (what a candidate's rank can see, write and signal), the reply channel a
candidate cannot forge, the rank's tripwire, clean recovery after crashes, hangs and builds that never
end, nothing left behind (grandchildren in process groups or sessions of their own, with or without the
sandbox), and validate's handling of a one-rank failure (CPU, gloo, W=2)."""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

import harness.rank.calls
from harness.common import integrity
from harness.common.channel import ReplySealer, open_sealed
from harness.common.paths import REPO_ROOT
from harness.compiling.compile import compile_candidate, extensions_dir
from harness.config import EvalConfig, Limits, TimingConfig
from harness.evaluate import evaluate
from harness.launch.leftovers import LEGACY_AGE_S, process_identity, reap_stale_folders
from harness.launch.pool import Hang, RankPool
from harness.launch.sandbox import SandboxPolicy, probe
from harness.launch.sandbox.memory import memory_cgroup_parent
from harness.launch.sandbox.private import stage_file
from harness.problems.problem import load_problem
from harness.problems.registry import get, load_suite
from harness.rank.tripwires import Guard
from harness.validate import validate_problems
from tests.conftest import TESTS, failure_of, live_children, pid_alive, processes_mentioning

EXPLOITS = TESTS / "exploits"


@pytest.fixture(scope="module")
def all_reduce():
    return get(load_suite(), "all_reduce")


def test_sealed_replies_open_only_with_their_key_and_nonce():
    key = os.urandom(32)
    sealed = ReplySealer(key).seal({"ok": True, "rank": 0, "times_ms": [1.5, float("nan")]}, "n1")
    reply = open_sealed(sealed, key, "n1")
    assert reply is not None and reply["ok"] is True and reply["times_ms"][0] == 1.5
    assert open_sealed(sealed, os.urandom(32), "n1") is None  # another key
    assert open_sealed(sealed, key, "n2") is None  # a replayed reply to an earlier request
    assert open_sealed(sealed.replace(b"true", b"1234"), key, "n1") is None  # a changed body
    assert open_sealed(sealed[:10], key, "n1") is None
    assert open_sealed(pickle.dumps({"ok": True}), key, "n1") is None  # never unpickled


def _reply_fd(pool: RankPool, rank: int) -> int:
    """The rank's reply descriptor: the one of its process's descriptors that is the pipe the harness reads the
    rank's replies from (however the rank was started: by a launcher, forked from one, or from a fork server)."""
    pipe = os.readlink(f"/proc/self/fd/{pool.ranks[rank].replies.fileno()}")
    pid = pool.pids()[rank]
    held = [int(name) for name in os.listdir(f"/proc/{pid}/fd") if os.readlink(f"/proc/{pid}/fd/{name}") == pipe]
    assert len(held) == 1, held
    return held[0]


def _write_into_reply_pipe(pool: RankPool, rank: int, data: bytes) -> None:
    """What a candidate in that rank could do: write straight onto the worker's reply pipe."""
    fd = os.open(f"/proc/{pool.pids()[rank]}/fd/{_reply_fd(pool, rank)}", os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def test_reply_channel_rejects_forged_replayed_and_partial_messages():
    pool = RankPool(2, "cpu").start()  # every pool is sealed: profiling's and validation's too
    try:
        assert pool.sealed
        keys = pool._keys
        assert keys is not None and len(set(keys.values())) == 2  # one key per rank
        for rank, pid in enumerate(pool.pids()):
            # The keys never pass through what a candidate can read about its own process.
            for what in ("environ", "cmdline"):
                text = Path(f"/proc/{pid}/{what}").read_bytes()
                assert keys[rank] not in text and keys[rank].hex().encode() not in text
        assert all(r["ok"] for r in pool.request({"op": "ping"}, timeout=30))

        forged = pickle.dumps({"ok": True, "rank": 0, "verdict": "correct"})
        _write_into_reply_pipe(pool, 0, struct.pack("!i", len(forged)) + forged)
        first = pool.request({"op": "ping"}, timeout=30)
        assert integrity.TAMPERING in first[0]["flags"] and "failed authentication" in first[0]["message"]
        assert first[1]["ok"]
        # Rank 0's genuine reply to that request is still queued: signed for the old nonce, it is refused.
        second = pool.request({"op": "ping"}, timeout=30)
        assert integrity.TAMPERING in second[0]["flags"]

        # A header announcing more bytes than ever come: the reader gives up at the deadline instead of
        # blocking forever inside a read.
        _write_into_reply_pipe(pool, 1, struct.pack("!i", 1 << 20))
        with pytest.raises(Hang) as hang:
            pool.request({"op": "ping"}, timeout=2, grace=1)
        assert 1 in hang.value.missing
    finally:
        pool.kill()
    assert live_children() == []


def test_a_dead_rank_is_named_as_the_root_failure(all_reduce):
    with RankPool(2, "cpu") as pool:
        os.kill(pool.pids()[1], signal.SIGKILL)
        replies = pool.request({"op": "ping"}, timeout=30)
        assert replies[0]["ok"] and not replies[1]["ok"]
        assert replies[1]["died"] is True and "killed by signal 9" in replies[1]["message"]
    assert live_children() == []


def test_ranks_end_with_their_launcher():
    # Whoever kills the launcher alone (Ray kills a dead worker's direct children, and the launcher is one)
    # must not leave its ranks orphaned, holding their GPUs.
    pool = RankPool(2, "cpu").start()
    try:
        ranks = pool.pids()
        assert pool.proc is not None and all(pid_alive(p) for p in ranks)
        os.kill(pool.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(pid_alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(pid_alive(p) for p in ranks)
    finally:
        pool.kill()
    assert live_children() == []


# How a grandchild leaves its rank: a process group of its own (ninja does that for every compiler; a
# group kill misses it, the session sweep does not), a session of its own (setsid; the session sweep
# misses it, the pool's marker in its inherited environment does not), or a session of its own with an
# empty environment (only the sandbox's PID namespace ends it).
ESCAPES = {
    "process_group": "process_group=0",
    "session": "start_new_session=True",
    "session_without_environment": "start_new_session=True, env={}",
}
needs_sandbox = pytest.mark.skipif(probe().backend != "bwrap", reason=f"no sandbox here: {probe().reason}")


def _spawning_candidate(folder: Path, token: str, popen_argument: str) -> Path:
    candidate = folder / "spawns_a_sleeper.py"
    candidate.write_text(textwrap.dedent(f"""
        import subprocess
        import sys
        import torch.distributed as dist

        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # {token}"], {popen_argument})

        def solution(x):
            out = x.clone()
            dist.all_reduce(out)
            return out
    """))
    return candidate


def _staged(candidate: Path) -> Path:
    """The candidate as an evaluation hands it to its ranks: a read-only copy in a folder of its own (the
    test's tmp_path is 0700, closed to the ranks' uid when the harness runs as root)."""
    return stage_file(candidate.read_bytes(), candidate.name, candidate.parent / "staged")


def _load(pool: RankPool, problem, candidate: Path) -> None:
    assert all(r["ok"] for r in pool.request({"op": "setup", "problem": problem.loader_spec}, timeout=60))
    replies = pool.request({"op": "load_candidate", "candidate": str(candidate), "params": 1}, timeout=60)
    assert all(r["ok"] for r in replies), replies


@pytest.mark.parametrize("sandboxed", [pytest.param(True, marks=needs_sandbox), False])
@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_killing_a_pool_ends_what_its_candidate_started_outside_its_ranks(all_reduce, tmp_path, escape, sandboxed,
                                                                         monkeypatch):
    if not sandboxed:
        if escape == "session_without_environment":
            pytest.skip("without a sandbox, a process with a new session and no environment escapes "
                        "(tests/exploits/README.md): that is what the sandbox is for")
        monkeypatch.setenv("PKB_SANDBOX", "off")
    token = f"pkb-test-sleeper-{os.getpid()}-{escape}"
    candidate = _staged(_spawning_candidate(tmp_path, token, ESCAPES[escape]))
    pool = RankPool(2, "cpu", role="candidate", visible=(candidate.parent,)).start()
    try:
        assert pool.sandboxed == sandboxed
        _load(pool, all_reduce, candidate)
        deadline = time.monotonic() + 20
        while len(processes_mentioning(token, wait_s=0)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(processes_mentioning(token, wait_s=0)) == 2  # one per rank, alive
    finally:
        pool.kill()
    assert processes_mentioning(token, wait_s=10) == []


@needs_sandbox
def test_a_sandboxed_rank_sees_only_its_sandbox(all_reduce, tmp_path):
    """What a candidate's rank can reach: no harness process, no writable file outside its scratch, no
    secret from the harness's environment, no network but its own loopback, no capability."""
    report = tmp_path / "report.txt"
    candidate = tmp_path / "looks_around.py"
    candidate.write_text(textwrap.dedent("""
        import json, os, socket, sys
        from pathlib import Path

        scratch = Path(sys.argv[sys.argv.index("--init-file") + 1]).parent
        seen = {"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                "env": sorted(k for k in os.environ if "KEY" in k or "TOKEN" in k),
                "uid": os.getuid(), "interfaces": [n for _, n in socket.if_nameindex()],
                "caps": [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1]}
        writable = []
        for target in (Path(__file__).parent / "planted.txt", Path(os.__file__).parent / "planted.txt",
                       Path.home() / "planted.txt", scratch / "planted.txt"):
            try:
                target.write_text("x")
                writable.append(str(target))
            except OSError:
                pass
        seen["writable"] = writable
        (scratch / "seen.json").write_text(json.dumps(seen))

        def solution(x):
            return x.clone()
    """))
    os.environ["PKB_TEST_SECRET_API_KEY"] = "sk-not-for-candidates"
    try:
        staged = _staged(candidate)
        pool = RankPool(2, "cpu", role="candidate", visible=(staged.parent,)).start()
        try:
            _load(pool, all_reduce, staged)
            assert pool.scratch is not None
            seen = __import__("json").loads((pool.scratch / "seen.json").read_text())
        finally:
            pool.kill()
    finally:
        del os.environ["PKB_TEST_SECRET_API_KEY"]
    assert os.getpid() not in seen["pids"] and max(seen["pids"]) < 100  # its own PID namespace only
    assert seen["env"] == []  # the harness's secrets stay outside
    assert seen["uid"] != 0 and int(seen["caps"], 16) == 0
    assert seen["interfaces"] == ["lo"]
    # Only the scratch, where HOME points too; never the candidate's folder, torch, or the real home.
    assert len(seen["writable"]) == 2 and all("/scratch/" in p for p in seen["writable"]), seen["writable"]
    assert not (staged.parent / "planted.txt").exists() and not (Path.home() / "planted.txt").exists()
    assert not report.exists()


def _native_candidate(folder: Path, name: str, source: str, stuck: bool = False) -> Path:
    """A candidate whose import builds `source` as extension `name` (a plain shared library: quick to
    build, no Python module or torch headers needed). The source is written at import into the
    candidate's own temporary folder: its sandbox sees only its copy of the candidate file, nothing beside
    it. `stuck`: the source first includes a FIFO nobody ever writes, so the compiler blocks for good."""
    path = folder / f"{name}_{len(list(folder.iterdir()))}.py"
    path.write_text(textwrap.dedent(f"""
        import os, tempfile
        from torch.utils.cpp_extension import load

        _cpp = os.path.join(tempfile.gettempdir(), {name + ".cpp"!r})
        _header = ""
        if {stuck!r}:
            _fifo = os.path.join(tempfile.gettempdir(), "never.h")
            os.mkfifo(_fifo)
            _header = '#include "' + _fifo + '"\\n'
        with open(_cpp, "w") as _f:
            _f.write(_header + {source!r})
        load(name={name!r}, sources=[_cpp], is_python_module=False)

        def solution(x):
            return x.clone()
    """))
    return path


@pytest.mark.skipif(not (shutil.which("c++") and shutil.which("ninja")), reason="needs a C++ compiler and ninja")
@pytest.mark.slow
@pytest.mark.serial  # its 15 s limit must find the compiler running: at load 10-14 it did not (2026-12-07)
def test_a_build_that_never_ends_is_stopped_whole_and_the_next_build_of_that_name_works(tmp_path):
    """The compiler blocks on an #include of a FIFO that never delivers: a compile that never ends. At
    the limit its whole session dies (ninja gave the compiler a process group of its own) and torch's
    build lock goes; without that, the next build of an extension with that name waits on the lock
    until it, too, times out."""
    name = f"pkb_test_stopped_build_{os.getpid()}"  # machine-wide process scans below: no other session's build
    stuck = _native_candidate(tmp_path, name, 'extern "C" int answer() { return 1; }\n', stuck=True)
    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.update(a=compile_candidate(stuck, 15.0, "cpu")))
    worker.start()
    compiling = False  # the compiler itself was seen running on the source (not a build that failed early)
    while worker.is_alive():
        for pid in processes_mentioning(f"{name}.cpp", wait_s=0):
            with contextlib.suppress(OSError):
                compiling = compiling or b"ninja" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        time.sleep(0.2)
    worker.join()
    assert compiling, "the build ended before the compiler ran"
    stopped = outcome["a"]
    assert not stopped.ok and stopped.native and "did not finish within 15 s" in stopped.message
    assert name in stopped.cleanup["locks_removed"] and stopped.cleanup["processes_killed"] >= 1
    assert not (extensions_dir() / name / "lock").exists()
    assert processes_mentioning(name) == []  # the compiler, ninja, the precompile process

    quick = _native_candidate(tmp_path, name, 'extern "C" int answer() { return 2; }\n')
    built = compile_candidate(quick, 300.0, "cpu")
    assert built.ok and built.native and not built.cleanup, built


def test_guard_sees_replaced_functions_code_and_trace_hooks(monkeypatch):
    guard = Guard()
    guard.capture()
    assert guard.violations() == []
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    assert "time.perf_counter" in guard.violations()
    monkeypatch.undo()
    original = harness.rank.calls.same_bytes.__code__
    try:
        harness.rank.calls.same_bytes.__code__ = (lambda a, b: True).__code__
        assert "harness.rank.calls.same_bytes (code)" in guard.violations()
    finally:
        harness.rank.calls.same_bytes.__code__ = original
    previous = sys.gettrace()
    sys.settrace(lambda *args: None)
    try:
        assert "sys.settrace hook" in guard.violations()
    finally:
        sys.settrace(previous)
    assert guard.violations() == []


@pytest.mark.slow
def test_after_a_hang_and_a_crash_the_next_evaluation_works(all_reduce, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    config = EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"), limits=Limits(check_s=3, grace_s=1))
    hang = evaluate(all_reduce, EXPLOITS / "hang_forever.py", world_size=2, config=config)
    assert hang.verdict == "timeout"
    crash = evaluate(all_reduce, EXPLOITS / "segfault_rank1.py", world_size=2, config=config)
    assert crash.verdict == "runtime_error" and failure_of(crash).rank == 1
    good = evaluate(all_reduce, EXPLOITS / "nccl_all_reduce.py", world_size=2,
                    config=EvalConfig(trials=2, timing=TimingConfig.for_device("cpu")))
    assert good.verdict == "correct" and good.timings is not None
    assert live_children() == []
    assert list(tmp_path.iterdir()) == []  # pools' folders, the evaluations' private folders: all removed


def test_a_candidate_finds_no_answer_and_no_other_input_anywhere_it_can_look(all_reduce, tmp_path):
    """Inputs reach a candidate's ranks one call at a time; expected outputs, other calls' inputs and the
    seed never do. (The ranks of one evaluation share a scratch folder, as they share device memory through
    symmetric memory: a rank may read its peers' inputs of the current call, data it could fetch over
    NVLink anyway.) The candidate lists its scratch folder at import and in every call; the kept rank logs
    carry the listings out."""
    candidate = tmp_path / "looks_for_answers.py"
    candidate.write_text(textwrap.dedent("""
        import os, sys
        from pathlib import Path
        import torch.distributed as dist

        scratch = Path(sys.argv[sys.argv.index("--init-file") + 1]).parent

        def listing(when):
            files = sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*") if p.is_file())
            print(f"LISTING {when}: {' '.join(files)}", file=sys.stderr, flush=True)

        listing("import")

        def solution(x):
            listing("call")
            out = x.clone()
            dist.all_reduce(out)
            return out
    """))
    logs = tmp_path / "logs"
    result = evaluate(all_reduce, candidate, world_size=2, log_dir=logs,
                      config=EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"), skip_timing=True))
    assert result.verdict == "correct", result.failure
    for rank in (0, 1):
        lines = [line for line in (logs / f"rank{rank}.log").read_text().splitlines() if line.startswith("LISTING")]
        assert lines[0].startswith("LISTING import") and ".pt" not in lines[0] and ".bin" not in lines[0]
        calls = [line for line in lines if line.startswith("LISTING call")]
        assert len(calls) == len(result.integrity["order"])
        for line in calls:
            inputs = [f for f in line.split()[2:] if f.endswith("-in.pt")]
            assert len(inputs) == 2 and len({f.split("-r")[0] for f in inputs}) == 1  # this call's, no other
            assert not [f for f in line.split()[2:] if f.startswith(("exp-", "reference")) or "exp-" in f]


def _problem_file(folder: Path, name: str, body: str) -> Path:
    path = folder / "collective" / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(f'''
        import torch
        import torch.distributed as dist

        PROBLEM = {{"name": "{name}", "category": "collective",
                   "source": {{"codebase": "tests", "path": "tests/harness/launch/test_isolation.py",
                              "symbol": "{name}"}},
                   "summary": "A deliberately broken reference.", "dtype": "float32",
                   "shapes": {{"default": {{"n": 8}}, "small": {{"n": 8}}}}, "world_sizes": [2],
                   "held_out": {{"default": {{"n": 12}}, "small": {{"n": 12}}}},
                   "tolerance": {{"atol": 1e-5, "rtol": 1e-5}}}}

        def make_inputs(shape, rank, world_size, generator, device):
            return (torch.randn(shape["n"], generator=generator, device=device),)

        def oracle(shape, world_size, inputs_by_rank):
            total = sum(inputs[0] for inputs in inputs_by_rank)
            return [total.clone() for _ in range(world_size)]
    ''') + textwrap.dedent(body))
    return path


def test_validate_reports_a_one_rank_failure_not_a_deadlock(tmp_path):
    wrong = load_problem(_problem_file(tmp_path, "wrong_on_rank1", """
        def solution(x):
            out = x.clone()
            dist.all_reduce(out)
            return out + 1.0 if dist.get_rank() == 1 else out
    """))
    raises = load_problem(_problem_file(tmp_path, "raises_on_rank1", """
        def solution(x):
            if dist.get_rank() == 1:
                raise ValueError("rank one gave up")
            out = x.clone()
            dist.all_reduce(out)
            return out
    """))
    rows = validate_problems([wrong, raises], [2], trials=3, timeout=60)
    results = {v.problem: v for v in rows if v.shape == "small"}
    # Before: rank 1 stopped after its first bad trial while rank 0 waited in the next trial's
    # collective, and the pair read as a deadlock.
    assert results["wrong_on_rank1"].verdict == "output_mismatch"
    assert "rank 1" in results["wrong_on_rank1"].message
    assert results["raises_on_rank1"].verdict == "infra_error"
    assert "rank one gave up" in results["raises_on_rank1"].message
    assert live_children() == []


KILLED_HARNESS = """
import os, signal, sys
from harness.launch.pool import RankPool
pool = RankPool(2, "cpu").start()
print(" ".join(str(pid) for pid in pool.pids()), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # what `kill -9` of a pkb run does: no cleanup runs
"""


def test_the_folder_of_a_harness_killed_mid_run_is_removed_by_the_next_pool(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", KILLED_HARNESS], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    rank_pids = [int(p) for p in done.stdout.split()]
    private = tmp_path / f"pkb-{os.geteuid()}"  # the private root in that TMPDIR (harness.launch.sandbox.private)
    left = list(private.glob("pkb-pool-*"))
    assert len(left) == 1 and (left[0] / "owner").read_text().split()[0].isdigit()
    deadline = time.monotonic() + 30
    while any(pid_alive(p) for p in rank_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in rank_pids), "ranks outlived their killed harness"
    assert reap_stale_folders(private) == left
    assert not left[0].exists()


def test_only_pool_folders_whose_owner_is_gone_are_reaped(tmp_path):
    def folder(name: str, owner: str | None) -> Path:
        path = tmp_path / f"pkb-pool-{name}"
        path.mkdir()
        if owner is not None:
            (path / "owner").write_text(owner)
        return path

    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone_identity = process_identity(gone.pid)
    gone.kill()
    gone.wait()
    mine = process_identity(os.getpid())
    assert gone_identity and mine
    dead = folder("dead", gone_identity)
    live = folder("live", mine)
    recycled = folder("recycled", f"{os.getpid()} 1")  # this pid, another start time: a reused pid
    young_legacy = folder("young", None)
    unrelated = tmp_path / "not-a-pool"
    unrelated.mkdir()
    assert sorted(reap_stale_folders(tmp_path)) == sorted([dead, recycled])
    assert live.exists() and young_legacy.exists() and unrelated.exists()
    assert reap_stale_folders(tmp_path, now=time.time() + LEGACY_AGE_S + 1) == [young_legacy]


def test_a_reaped_folder_ends_what_its_ranks_left_and_only_that(tmp_path):
    """A harness killed with SIGKILL cannot sweep: the next pool's reaper ends the processes carrying the
    dead pool's marker, and never acts on a marker line that is not one (the folder is writable by
    candidates)."""
    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead_owner = process_identity(gone.pid)
    gone.kill()
    gone.wait()
    marker = "PKB_POOL=" + "ab" * 12
    left_behind = subprocess.Popen(["sleep", "600"], start_new_session=True,
                                   env={**os.environ, "PKB_POOL": marker.split("=", 1)[1]})
    # A forged line naming a variable only the bystander has: were it obeyed, only the bystander would
    # die (a line such as PATH=... would name every process of this user, this test's runner included).
    decoy = f"PKB_DECOY={os.getpid()}"
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True,
                                 env={**os.environ, "PKB_DECOY": decoy.split("=", 1)[1]})
    try:
        for name, line in (("marked", marker), ("forged", decoy)):
            folder = tmp_path / f"pkb-pool-{name}"
            folder.mkdir()
            (folder / "owner").write_text(f"{dead_owner}\n{line}\n")
        assert len(reap_stale_folders(tmp_path)) == 2
        assert left_behind.wait(timeout=10) == -signal.SIGKILL
        assert bystander.poll() is None
    finally:
        for proc in (left_behind, bystander):
            proc.kill()
            proc.wait()


def test_namespace_sweeps_never_reach_the_harness_namespace():
    """A pool sweeps the processes of its sandbox's PID namespace; asked about a process that lives in the
    harness's own namespace (bwrap after its sandbox died), it must answer with nothing, not with every
    process of the machine."""
    from harness.launch.sandbox.namespace import pid_namespace_members, sandbox_init

    assert pid_namespace_members(os.getpid()) == []
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert sandbox_init(os.getpid()) is None  # its child lives in this namespace
    finally:
        sleeper.kill()
        sleeper.wait()


@needs_sandbox
def test_a_checkout_under_tmp_stays_importable_and_read_only_in_the_sandbox():
    # A CI runner or a scratch clone may keep the checkout under /tmp, which the sandbox replaces with an
    # empty one of its own: the code folders are mounted again, read-only, and /tmp's other folders stay hidden.
    with tempfile.TemporaryDirectory(dir="/tmp") as checkout, tempfile.TemporaryDirectory(dir="/tmp") as other:
        os.chmod(checkout, 0o755)  # as a clone's folder is: ranks may run as another uid than the harness
        (Path(checkout) / "probe_module.py").write_text("VALUE = 42\n")
        (Path(other) / "secret.txt").write_text("another evaluation's file")
        script = textwrap.dedent(f"""
            import os, sys
            sys.path.insert(0, {checkout!r})
            import probe_module
            assert probe_module.VALUE == 42
            assert not os.path.exists({other!r})
            try:
                open(os.path.join({checkout!r}, "written.txt"), "w")
            except OSError:
                print("read-only")
        """)
        command = SandboxPolicy(scratch=None).bwrap_command([sys.executable, "-c", script], Path(checkout))
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "read-only"
        assert not (Path(checkout) / "written.txt").exists()


# -- what a rank can read, and its limits (issue 31) ------------------------------------------------
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the ranks' host uid differs from the harness's only "
                                                          "when the harness runs as root")


def _rank_log(logs: Path, rank: int = 0) -> str:
    return (logs / f"rank{rank}.log").read_text(errors="replace")


@needs_sandbox
@needs_root
def test_root_only_files_are_unreadable_from_a_rank(all_reduce, tmp_path, monkeypatch):
    """A 0600 file in the harness user's home and /etc/shadow: a user namespace made by root would map the
    rank to root and both would be readable; the rank runs as uid 65534 on the host, and the home is not
    even in its sandbox."""
    secret = Path.home() / f".pkb-test-private-{os.getpid()}"
    secret.write_text("not for candidates")
    os.chmod(secret, 0o600)
    monkeypatch.setenv("PKB_TEST_PRIVATE_FILE", str(secret))
    try:
        logs = tmp_path / "logs"
        result = evaluate(all_reduce, EXPLOITS / "read_root_files.py", world_size=2, log_dir=logs,
                          config=EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"), skip_timing=True))
    finally:
        secret.unlink()
    assert result.verdict == "correct", result.failure  # it answers wrong when any read works
    assert str(secret) in _rank_log(logs) and "read: []" in _rank_log(logs)  # it tried, and failed
    assert result.integrity["sandbox"]["uid"]["host"] == 65534
    bound = result.integrity["sandbox"]["mounts"]["read_only"]
    assert not [p for p in bound if Path.home() == Path(p) or Path(p) in Path.home().parents]  # home not bound


@needs_sandbox
@needs_root
def test_a_root_only_file_bound_into_a_sandbox_is_still_unreadable():
    """The uid alone, without the bind list's help: the 0600 file is bound on purpose, and the rank, uid
    65534 on the host with no capability, cannot open it (a user namespace made by root could)."""
    secret = Path.home() / f".pkb-test-private-{os.getpid()}"
    secret.write_text("not for candidates")
    os.chmod(secret, 0o600)
    try:
        policy = SandboxPolicy(scratch=None, visible=(secret,))
        script = f"import os\ntry:\n    open({str(secret)!r}).read()\nexcept OSError as e:\n    print(e.strerror)\n" \
                 "print(os.getresuid())"
        done = subprocess.run(policy.bwrap_command([sys.executable, "-c", script], Path.cwd()), capture_output=True,
                              text=True, timeout=60)
    finally:
        secret.unlink()
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["Permission denied", "(65534, 65534, 65534)"], done.stdout


@needs_sandbox
@pytest.mark.parametrize("where", ["tmpdir_elsewhere", "candidate_inside_tmpdir", "tmpdir_inside_the_checkout"])
def test_reference_outputs_are_out_of_a_rank_s_sight_whatever_tmpdir_is(all_reduce, tmp_path, monkeypatch, where):
    """TMPDIR outside /tmp (the sandbox's /tmp is its own, so /tmp alone proves nothing), the candidate
    file saved in TMPDIR itself, TMPDIR inside the checkout (which is bound: TMPDIR is masked there): the
    evaluation's folder (every trial's inputs, the reference's outputs) must stay invisible. Before the
    private root, the exploit found it in the first two and was judged correct."""
    parent = REPO_ROOT if where == "tmpdir_inside_the_checkout" else (
        Path("/var/tmp") if os.path.isdir("/var/tmp") else None)
    tmpdir = Path(tempfile.mkdtemp(prefix=".pkb-test-tmpdir-", dir=parent))
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
        monkeypatch.setenv("PKB_TEST_HARNESS_TMPDIR", str(tmpdir))
        os.chmod(tmpdir, 0o755)  # a TMPDIR others may walk: only the private root's own mode keeps them out
        candidate = EXPLOITS / "read_reference_outputs.py"
        if where == "candidate_inside_tmpdir":
            candidate = Path(shutil.copy(candidate, tmpdir / candidate.name))
        logs = tmp_path / "logs"
        result = evaluate(all_reduce, candidate, world_size=2, log_dir=logs,
                          config=EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"), skip_timing=True))
        assert result.verdict == "output_mismatch", result.failure
        assert "reference folders seen: []" in _rank_log(logs)
        left = [p.name for p in tmpdir.iterdir() if p.name != candidate.name]
        assert left == [], f"the evaluation left {left} in TMPDIR"
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


@pytest.mark.parametrize("sandboxed", [pytest.param(True, marks=needs_sandbox), False])
def test_a_solution_saved_directly_in_tmp_is_judged(all_reduce, monkeypatch, sandboxed):
    """Issue 29: a file directly in /tmp was invisible under the sandbox's own /tmp (import failed). The
    ranks import the evaluation's copy, wherever the file was."""
    if not sandboxed:
        monkeypatch.setenv("PKB_SANDBOX", "off")
    solution = Path(f"/tmp/pkb-test-solution-{os.getpid()}.py")
    shutil.copy(TESTS / "candidates" / "correct_all_gather_sum.py", solution)
    try:
        result = evaluate(all_reduce, solution, world_size=2,
                          config=EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"), skip_timing=True))
    finally:
        solution.unlink()
    assert result.verdict == "correct", result.failure
    assert result.candidate.path == str(solution)  # the record names the user's file, not the copy
    assert result.integrity["sandbox"]["backend"] == ("bwrap" if sandboxed else "none")


@needs_sandbox
def test_memory_over_the_limit_is_caught_by_the_watchdog_without_a_cgroup(all_reduce, monkeypatch):
    """Where no cgroup can be made (an ordinary user, a container), the harness's watchdog reads the
    sandbox's memory from outside and ends it: the same verdict, naming the same limit."""
    monkeypatch.setattr("harness.launch.spawn.MemoryCgroup.create", lambda name, limit: None)
    result = evaluate(all_reduce, EXPLOITS / "memory_hog.py", world_size=2,
                      config=EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"), skip_timing=True),
                      integrity_config={"rank_memory_bytes": 1 << 30})
    assert result.verdict == "runtime_error" and failure_of(result).phase == "check", result.failure
    assert "rank_memory_bytes" in failure_of(result).message and "over its limit" in failure_of(result).message
    assert result.integrity["sandbox"]["memory"] == {"backend": "watchdog"}
    assert live_children() == []


@needs_sandbox
def test_a_compile_stage_over_its_memory_limit_is_the_candidate_s_failure(all_reduce, tmp_path):
    """The compile stage imports the candidate in a sandbox too (a candidate that builds native code): its
    limits hold there, and going over is the candidate's failure, not a build that 'passed'."""
    candidate = tmp_path / "hog_at_import.py"
    candidate.write_text(textwrap.dedent("""
        import time
        import torch
        from torch.utils.cpp_extension import load_inline  # it builds native code: compiled in a sandbox

        _held = []
        for _ in range(40):
            _held.append(torch.ones(64 << 20, dtype=torch.uint8))
            time.sleep(0.02)

        def solution(x):
            return x.clone()
    """))
    result = evaluate(all_reduce, candidate, world_size=2,
                      config=EvalConfig(trials=2, timing=TimingConfig.for_device("cpu"), skip_timing=True),
                      integrity_config={"rank_memory_bytes": 1 << 30})
    assert result.verdict == "runtime_error" and failure_of(result).phase == "compile", result.failure
    assert "rank_memory_bytes" in failure_of(result).message
    assert live_children() == []


def test_the_private_root_refuses_a_folder_others_can_enter_or_a_link(tmp_path, monkeypatch):
    """In a shared TMPDIR someone else may have made `pkb-<uid>` first, or left a link there: the harness
    refuses it rather than keep its evaluations' folders where another user can reach them."""
    from harness.launch.sandbox.private import PrivateRootUnsafe, private_folder, private_root, remove_private

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = tmp_path / f"pkb-{os.geteuid()}"
    folder = private_folder("pkb-eval-")
    assert folder.parent == root and root.stat().st_mode & 0o777 == 0o700
    remove_private(folder)
    assert not root.exists()  # removed once empty: an evaluation leaves nothing in TMPDIR
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    with pytest.raises(PrivateRootUnsafe, match="mode 0700"):
        private_root()
    root.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    root.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PrivateRootUnsafe):
        private_root()


def test_the_bind_list_refuses_the_home_and_shared_temp_and_masks_what_a_code_folder_holds(tmp_path, monkeypatch):
    """sys.path may name anything: `/`, the home folder, /tmp, a folder holding TMPDIR (and with it every
    evaluation's folder). None of them is bound whole; a folder holding TMPDIR is bound with TMPDIR masked,
    and the scratch under it is bound again on top, its way there walkable by another uid (0755)."""
    from harness.launch.sandbox import mounts

    work = tmp_path / "work"
    tmpdir = work / "tmp"
    scratch = tmpdir / f"pkb-{os.geteuid()}" / "pkb-pool-x" / "scratch"
    scratch.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    monkeypatch.setattr(sys, "path", ["/", str(Path.home()), "/tmp", str(work), *sys.path])
    layout = mounts.plan(cwd=Path.cwd(), visible=(), hide=(), scratch=scratch, extensions=None,
                         ext_mount="/tmp/ext", gpus=False, tmp_bytes=1 << 20, shm_bytes=1 << 20)
    assert {"/", str(Path.home()), "/tmp"} <= set(layout.refused)
    bound = [m.dest for m in layout.mounts if m.kind == "ro"]
    assert str(work) in bound and not [p for p in bound if p in ("/", "/tmp", str(Path.home()))]
    assert str(tmpdir) in layout.masked
    args = mounts.bwrap_args(layout, perms=True, sizes=True)
    mask_at = args.index(str(tmpdir), args.index("--tmpfs", args.index(str(work))))
    scratch_at = args.index("--bind")
    assert mask_at < scratch_at  # the scratch is bound on top of the mask
    made = [args[i + 3] for i in range(len(args) - 3) if args[i:i + 3] == ["--perms", "0755", "--dir"]]
    assert str(scratch.parent) in made and str(scratch.parent.parent) in made
    assert f"{tmpdir}/pkb-{os.geteuid()}" in made


@pytest.mark.skipif(memory_cgroup_parent() is None, reason="no memory cgroup can be made here (not root, or none "
                                                             "delegated): the watchdog limits memory instead")
def test_the_cgroup_of_a_killed_harness_is_removed_by_the_next_pool_and_a_live_one_is_not():
    """A harness killed with SIGKILL leaves its sandboxes' cgroups (and whatever is still in them); the next
    pool's reaper removes those whose maker is gone, and leaves a live harness's alone."""
    from harness.launch.sandbox.memory import MemoryCgroup, sweep_orphans

    maker = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from harness.launch.sandbox.memory import MemoryCgroup
        group = MemoryCgroup.create("pkb-test-orphan", 1 << 30)
        print(group.path, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert maker.stdout is not None
    orphan = Path(maker.stdout.readline().strip())
    inside = subprocess.Popen(MemoryCgroup(orphan, 1).join_command(["sleep", "600"]))
    # The shell joins the cgroup after Popen returns: sweep only once it is in, or it finds no cgroup to join.
    for _ in range(300):
        if str(inside.pid) in (orphan / "cgroup.procs").read_text().split() or inside.poll() is not None:
            break
        time.sleep(0.01)
    assert inside.poll() is None, "the process never joined the cgroup"
    mine = MemoryCgroup.create("pkb-test-live", 1 << 30)
    assert mine is not None
    try:
        maker.kill()
        maker.wait()
        assert orphan in sweep_orphans() and not orphan.exists()
        assert inside.wait(timeout=30) == -signal.SIGKILL  # what was left in it ended with it
        assert mine.path.exists()  # this process is alive: its cgroup stays
    finally:
        inside.kill()
        inside.wait()
        mine.remove()


def test_an_evaluation_folder_whose_harness_was_killed_is_removed_by_the_next_pool(tmp_path, monkeypatch):
    """Every folder of the private root names its maker: the reference's outputs and the candidate's copy
    of a harness killed mid-evaluation go with the next pool's sweep; a live harness's stay."""
    from harness.launch.sandbox.private import private_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = subprocess.run([sys.executable, "-c", "from harness.launch.sandbox.private import private_folder; "
                           "print(private_folder('pkb-eval-'))"], capture_output=True, text=True, check=True,
                          env={**os.environ, "TMPDIR": str(tmp_path),
                               "PYTHONPATH": str(REPO_ROOT)})
    orphan = Path(made.stdout.strip())
    live = private_folder("pkb-eval-")
    assert orphan.parent == live.parent and (orphan / "owner").exists()
    assert reap_stale_folders() == [orphan]
    assert live.exists() and not orphan.exists()
    shutil.rmtree(live)


def test_the_toolchain_the_environment_names_is_bound_but_nothing_under_the_home_folder(tmp_path):
    """A compiler named by path (CC) is bound with its install prefix (its lib and libexec sit beside bin), as
    are the linker's and compilers' search folders; a tool folder under the home folder is not (~/.cargo
    keeps credentials beside cargo), and the toolchain's variables survive the environment's allow-list."""
    from harness.launch.sandbox import clean_environment, mounts

    prefix = tmp_path / "opt" / "gcc"
    (prefix / "bin").mkdir(parents=True)
    gcc = prefix / "bin" / "gcc"
    gcc.write_text("#!/bin/sh\n")
    gcc.chmod(0o755)
    home_tools = Path.home() / ".cargo" / "bin"
    env = {"PATH": f"{home_tools}:/usr/bin:/bin", "CC": f"{gcc} -m64", "LIBRARY_PATH": f"{tmp_path / 'stubs'}:",
           "CPATH": str(Path.home() / "include")}
    found = mounts.toolchain_folders(env)
    assert prefix in found and tmp_path / "stubs" in found
    assert not [f for f in found if Path.home() in (f, *f.parents)]
    kept = clean_environment({**env, "GCC_EXEC_PREFIX": "/opt/gcc/lib/gcc/", "HF_TOKEN": "x"}, None)
    assert {"CC", "LIBRARY_PATH", "CPATH", "GCC_EXEC_PREFIX"} <= set(kept) and "HF_TOKEN" not in kept
