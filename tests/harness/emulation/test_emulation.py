"""Symmetric memory emulated on one GPU (harness.emulation): refusals, placement, the handle's
bookkeeping and the rendezvous exchange on CPU; the whole thing on a GPU (marker gpu(count=1)).

GPU rows: pytest -m gpu tests/harness/emulation/test_emulation.py on a machine with one GPU or more.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from harness.common.paths import REPO_ROOT
from harness.common.safe_env import SAFE_ENV
from harness.emulation import driver, errors, installer, layout, memory, rendezvous, selftest
from harness.emulation.errors import NotAvailableInEmulation
from harness.emulation.handle import EmulatedSymmetricMemory

ROOT = REPO_ROOT


@pytest.fixture
def emulated():
    emulation = installer.install()
    try:
        yield emulation
    finally:
        installer.uninstall()


# -- refusals ---------------------------------------------------------------------------------------
def test_refusal_message_round_trips_through_text():
    err = NotAvailableInEmulation("multicast", "handle.multicast_ptr", "no single-GPU multicast")
    assert str(err).startswith(errors.PREFIX + ": handle.multicast_ptr")
    trace = f"Traceback (most recent call last):\n  ...\nharness.emulation.errors.NotAvailableInEmulation: {err}\n"
    refusal = errors.parse_refusal(trace)
    assert refusal == errors.Refusal(kind="multicast", api="handle.multicast_ptr", why="no single-GPU multicast")
    assert errors.parse_refusal("RuntimeError: CUDA error: an illegal memory access") is None
    with pytest.raises(ValueError):
        NotAvailableInEmulation("gpu_magic", "x", "y")


def test_refusal_is_plausible_only_where_the_source_names_the_api():
    refusal = errors.parse_refusal(str(NotAvailableInEmulation("nccl", "new_group(backend='nccl')", "one GPU")))
    assert refusal is not None
    assert errors.refusal_is_plausible(refusal, "pg = dist.new_group(backend='nccl')")
    assert not errors.refusal_is_plausible(refusal, "raise RuntimeError('not available in emulation: ...')")


def test_symm_mem_operators_are_refused_through_the_dispatcher(emulated):
    x = torch.zeros(8)
    for op in (torch.ops.symm_mem.one_shot_all_reduce, torch.ops.symm_mem.one_shot_all_reduce.default,
               torch.ops.symm_mem.fused_all_gather_matmul):
        with pytest.raises(NotAvailableInEmulation, match="torch.ops.symm_mem") as info:
            if op is torch.ops.symm_mem.fused_all_gather_matmul:
                op(torch.zeros(4, 4), [torch.zeros(4, 4)], 0, "0")
            else:
                op(x, "sum", "0")
        assert info.value.kind == "symm_mem_op"


def test_served_operators_keep_torchs_kernels(emulated):
    # memset32_ needs no symmetric memory: torch's own kernel stays (it has none for CPU tensors).
    with pytest.raises(NotImplementedError):
        torch.ops.symm_mem.memset32_(torch.zeros(4, dtype=torch.int32), 0, 1, 1)


def test_uninstall_restores_torch(emulated):
    import torch.distributed._symmetric_memory as symm_mem

    assert symm_mem.empty == emulated.empty
    installer.uninstall()
    assert symm_mem.empty.__module__ == "torch.distributed._symmetric_memory"
    assert dist.new_group is not None and not getattr(dist.new_group, "__pkb_emulation_guard__", False)
    with pytest.raises(NotImplementedError):  # torch's own dispatch again: no CPU kernel
        torch.ops.symm_mem.one_shot_all_reduce(torch.zeros(8), "sum", "0")
    installer.install()  # the fixture uninstalls once more


@pytest.mark.parametrize("call", [
    lambda: dist.new_group([0], backend="nccl"),
    lambda: dist.new_group([0], None, "nccl"),
    lambda: dist.new_group(backend=dist.Backend.NCCL),
    lambda: dist.new_group(backend="cpu:gloo,cuda:nccl"),
    lambda: dist.new_subgroups(backend="nccl"),
    lambda: torch.cuda.nccl.all_reduce([torch.zeros(2)]),
], ids=["keyword", "positional", "enum", "per-device", "subgroups", "torch.cuda.nccl"])
def test_nccl_is_refused(emulated, call):
    with pytest.raises(NotAvailableInEmulation) as info:
        call()
    assert info.value.kind == "nccl"


def test_gloo_groups_pass_through(emulated):
    with pytest.raises(Exception) as info:  # no default group in this process: torch's own error
        dist.new_group([0], backend="gloo")
    assert not isinstance(info.value, NotAvailableInEmulation)


def test_every_public_function_of_the_module_is_emulated_or_refused(emulated):
    import torch.distributed._symmetric_memory as symm_mem

    emulated_names = set(installer._module_table(emulated))
    for name, value in vars(symm_mem).items():
        if name.startswith("_") or not callable(value) or isinstance(value, type):
            continue
        module = getattr(value, "__module__", "")
        if module not in (symm_mem.__name__, "harness.emulation.api", "harness.emulation.installer"):
            continue
        assert (name in emulated_names or name in installer.PURE_HELPERS
                or getattr(value, "__pkb_emulation_refusal__", False)), name
    with pytest.raises(NotAvailableInEmulation):
        symm_mem.get_mem_pool(torch.device("cuda:0"))
    with pytest.raises(NotAvailableInEmulation):
        symm_mem.set_backend("NVSHMEM")
    symm_mem.set_backend("CUDA")
    assert symm_mem.is_nvshmem_available() is False
    assert getattr(dist.new_group, "__pkb_emulation_guard__", False)


def test_low_level_class_answers_no_multicast(emulated):
    from torch._C._autograd import DeviceType
    from torch._C._distributed_c10d import _SymmetricMemory

    assert _SymmetricMemory.has_multicast_support(DeviceType.CUDA, 0) is False


def test_empty_needs_a_cuda_device(emulated):
    import torch.distributed._symmetric_memory as symm_mem

    with pytest.raises(RuntimeError, match="CUDA device") as info:
        symm_mem.empty(16, dtype=torch.uint8, device=torch.device("cpu"))
    assert not isinstance(info.value, NotAvailableInEmulation)  # the candidate's mistake, charged


def test_signal_pad_size_is_set_before_the_first_allocation(emulated):
    emulated.set_signal_pad_size(8192)
    assert emulated.get_signal_pad_size() == 8192
    with pytest.raises(RuntimeError):
        emulated.set_signal_pad_size(6)
    emulated.registry.add(memory.Allocation(device=torch.device("cpu"), base=4096, pad_bytes=8192,
                                            data_offset=8192, data_bytes=64, ipc_handle=b"\0" * 64))
    with pytest.raises(RuntimeError, match="already allocated"):
        emulated.set_signal_pad_size(4096)


def test_install_keeps_multicast_off_in_the_environment(emulated, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    installer.uninstall()
    installer.install()
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    assert os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and os.environ["NVSHMEM_DISABLE_NVLS"] == "1"


def test_ipc_handles_survive_bytes_with_zeros_inside():
    raw = bytes([7, 0, 0, 3] + [0] * 59 + [9])  # real handles hold NULs: a c_char array would cut at one
    assert driver.handle_bytes(driver.handle_from_bytes(raw)) == raw
    with pytest.raises(ValueError, match="64 bytes"):
        driver.handle_from_bytes(raw[:4])


# -- placement --------------------------------------------------------------------------------------
def test_layout_places_ranks_in_blocks_and_folds_repeated_gpus():
    assert layout.gpus_needed(4, 2) == 2 and layout.gpus_needed(3, 2) == 2 and layout.gpus_needed(2, 1) == 2
    assert layout.rank_gpus(4, 2, [5, 7]) == [5, 5, 7, 7]
    assert layout.rank_gpus(4, 4, [3]) == [3, 3, 3, 3]
    assert layout.visible_devices([5, 5, 7, 7]) == ("5,7", [0, 0, 1, 1])
    assert layout.is_emulated(2) and not layout.is_emulated(1)
    with pytest.raises(ValueError, match="need 2 GPUs"):
        layout.rank_gpus(4, 2, [0])
    with pytest.raises(ValueError):
        layout.gpus_needed(2, 0)


# -- the handle's bookkeeping over host memory ------------------------------------------------------
class _HostRanks:
    """W ranks' buffers and pads in host memory, to check the handle's address arithmetic on CPU."""

    def __init__(self, world: int, nbytes: int, pad_bytes: int) -> None:
        self.buffers = [ctypes.create_string_buffer(nbytes) for _ in range(world)]
        self.pads = [ctypes.create_string_buffer(pad_bytes) for _ in range(world)]

    def handle(self, rank: int) -> EmulatedSymmetricMemory:
        return EmulatedSymmetricMemory(rank=rank, world_size=len(self.buffers), device=torch.device("cpu"),
                                       group_name="0", buffer_ptrs=[ctypes.addressof(b) for b in self.buffers],
                                       signal_pad_ptrs=[ctypes.addressof(p) for p in self.pads],
                                       buffer_size=len(self.buffers[0]), signal_pad_size=len(self.pads[0]))


def test_get_buffer_views_a_peers_memory_at_its_offset():
    ranks = _HostRanks(world=3, nbytes=256, pad_bytes=2048)
    handle = ranks.handle(rank=0)
    view = handle.get_buffer(2, (4, 2), torch.int32, storage_offset=3)
    view.fill_(7)
    raw = ranks.buffers[2].raw
    assert raw[:12] == b"\0" * 12 and raw[12:44] == (b"\x07\0\0\0" * 8) and raw[44:] == b"\0" * (256 - 44)
    assert handle.buffer_ptrs == [ctypes.addressof(b) for b in ranks.buffers]
    assert torch.equal(torch.tensor(handle.buffer_ptrs), torch.tensor([int(v) for v in handle._buffer_table]))
    assert handle.get_remote_tensor(1, (64,), torch.float32).data_ptr() == ctypes.addressof(ranks.buffers[1])
    with pytest.raises(RuntimeError, match="exceeds the allocated size"):
        handle.get_buffer(1, (65,), torch.float32)
    with pytest.raises(RuntimeError, match="exceeds the allocated size"):
        handle.get_buffer(1, (64,), torch.float32, storage_offset=1)
    with pytest.raises(RuntimeError, match="out of range"):
        handle.get_buffer(3, (1,), torch.float32)


def test_signal_pad_defaults_to_the_whole_pad_as_uint32():
    ranks = _HostRanks(world=2, nbytes=64, pad_bytes=2048)
    pad = ranks.handle(rank=1).get_signal_pad(0)
    assert pad.dtype == torch.uint32 and pad.shape == (512,)
    assert pad.data_ptr() == ctypes.addressof(ranks.pads[0])


def test_channel_and_device_checks_use_torchs_rules():
    handle = _HostRanks(world=4, nbytes=64, pad_bytes=2048).handle(rank=0)
    with pytest.raises(RuntimeError, match="maximum supported channel .* is 127"):
        handle.barrier(channel=128)
    with pytest.raises(RuntimeError, match="non-negative"):
        handle.put_signal(1, channel=-1)
    with pytest.raises(RuntimeError, match="out of range"):
        handle.wait_signal(4)
    with pytest.raises(RuntimeError, match="CUDA device"):
        handle.barrier(channel=0)
    with pytest.raises(NotAvailableInEmulation) as info:
        _ = handle.multicast_ptr
    assert info.value.kind == "multicast"


def test_registry_finds_the_allocation_around_a_pointer():
    registry = memory.Registry()
    for base in (1 << 20, 1 << 24, 1 << 22):
        registry.add(memory.Allocation(device=torch.device("cpu"), base=base, pad_bytes=2048, data_offset=4096,
                                       data_bytes=1000, ipc_handle=b"\0" * 64))
    found = registry.find((1 << 22) + 4096 + 999)
    assert found is not None and found.base == 1 << 22
    assert registry.find((1 << 22) + 4096 + 1000) is None  # one past the end
    assert registry.find((1 << 22) + 100) is None  # inside the pad: not a data pointer
    assert len(registry) == 3


# -- the rendezvous exchange ------------------------------------------------------------------------
def _record(rank: int, data_bytes: int = 4096, pad: int = 2048) -> rendezvous.PeerRecord:
    return rendezvous.PeerRecord(rank=rank, pid=1000 + rank, device_uuid="ab" * 16, ipc_handle=f"{rank:02x}" * 64,
                                 pad_bytes=pad, data_offset=4096, data_bytes=data_bytes, tensor_offset=0)


def test_exchange_gives_every_rank_every_record_in_rank_order():
    store = dist.HashStore()  # type: ignore[attr-defined]  # torch exports it without declaring it
    world = 3
    seen: dict[int, list[rendezvous.PeerRecord]] = {}

    def rank_main(rank: int) -> None:
        seen[rank] = rendezvous.exchange(store, "pkb-emulation/0/0", _record(rank), world)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in reversed(range(world))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(seen) == [0, 1, 2]
    for records in seen.values():
        assert records == [_record(r) for r in range(world)]
        rendezvous.validate(records)


def test_validate_refuses_ranks_with_different_sizes():
    with pytest.raises(RuntimeError, match="differ in size"):
        rendezvous.validate([_record(0), _record(1, data_bytes=2048)])
    with pytest.raises(RuntimeError, match="signal pads differ"):
        rendezvous.validate([_record(0), _record(1, pad=4096)])


def test_own_record_maps_to_the_own_allocation():
    mappings = rendezvous.PeerMappings()
    mine = rendezvous.PeerRecord(**{**_record(0).__dict__, "pid": os.getpid()})
    assert mappings.base_of(mine, 0, own_base=12345) == 12345
    with pytest.raises(RuntimeError, match="one process"):
        mappings.base_of(mine, 0, own_base=None)


# -- the self-test's own logic ----------------------------------------------------------------------
def test_selftest_plans_every_expert_with_its_problem_and_both_exploits():
    cases = selftest.plan_cases("small", None, exploits=True)
    experts = sorted(p.stem for p in ROOT.glob("problems/*/solutions/*.py"))
    assert sorted(c["name"] for c in cases if c["kind"] == "expert") == experts
    assert {c["name"] for c in cases if c["kind"] == "exploit"} == {"gpu_race_no_barrier", "gpu_stale_epoch"}
    for case in cases:
        assert Path(case["problem"]).stem == (case["name"].split("__")[0] if case["kind"] == "expert"
                                              else "all_reduce")


def test_selftest_compare_follows_the_tolerance_rule():
    e = torch.tensor([1.0, 2.0, 3.0])
    assert selftest.compare(e, e + 0.01, atol=0.02, rtol=0.0)[0]
    assert not selftest.compare(e, e + 0.05, atol=0.02, rtol=0.0)[0]
    assert not selftest.compare(e, torch.tensor([1.0, float("nan"), 3.0]), atol=1.0, rtol=1.0)[0]
    assert not selftest.compare(e, e.to(torch.float64), atol=1.0, rtol=1.0)[0]
    assert not selftest.compare((e, e), (e,), atol=1.0, rtol=1.0)[0]
    assert not selftest.compare(torch.tensor([1, 2]), torch.tensor([1, 3]), atol=5, rtol=5)[0]


def test_selftest_outcomes():
    ok = {"status": "ok", "message": "", "trials": [{"ok": True}, {"ok": True}]}
    wrong = {"status": "ok", "message": "", "trials": [{"ok": True}, {"ok": False}]}
    refused = {"status": "refused", "message": "not available in emulation: x", "trials": []}
    assert selftest.outcome({"kind": "expert"}, [ok, ok]) == "correct"
    assert selftest.outcome({"kind": "expert"}, [ok, wrong]).startswith("WRONG")
    assert selftest.outcome({"kind": "exploit"}, [ok, wrong]).startswith("misbehaved in 1 of 4")
    assert selftest.outcome({"kind": "exploit"}, [ok, ok]).startswith("NOT CAUGHT")
    assert selftest.outcome({"kind": "expert"}, [ok, refused]).startswith("refused")
    assert selftest.outcome({"kind": "expert"}, [ok, None]).startswith("incomplete")
    result: dict[str, Any] = {"timed_out": False, "cases": [{"kind": "expert", "outcome": "correct"},
                                            {"kind": "exploit", "outcome": "misbehaved in 1 of 4 rank-trials"}]}
    assert selftest.passed(result)
    result["cases"].append({"kind": "exploit", "outcome": "NOT CAUGHT (always right)"})
    assert not selftest.passed(result)


# -- on a GPU ---------------------------------------------------------------------------------------
def _selftest(tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "selftest.json"
    proc = subprocess.run([sys.executable, "-m", "harness.emulation.selftest", *argv, "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert proc.returncode == 0, proc.stdout[-4000:]
    return report


@pytest.mark.gpu(count=1)
@pytest.mark.parametrize("world_size", [2, 4])
def test_experts_are_correct_and_sync_exploits_misbehave_in_emulation(tmp_path, world_size):
    report = _selftest(tmp_path, "--world-size", str(world_size), "--trials", "3", "--stress", "3", "--calls", "0")
    (result,) = report["results"]
    outcomes = {c["name"]: c["outcome"] for c in result["cases"]}
    experts = [p.stem for p in ROOT.glob("problems/*/solutions/*.py")]
    assert all(outcomes[name] == "correct" for name in experts), outcomes
    assert all(outcomes[name].startswith("misbehaved") for name in ("gpu_race_no_barrier", "gpu_stale_epoch"))


SINGLE_RANK = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from harness.emulation import install, NotAvailableInEmulation
    emulation = install()
    import torch.distributed._symmetric_memory as symm_mem
    buf = symm_mem.empty(4096, dtype=torch.bfloat16, device="cuda")
    h = symm_mem.rendezvous(buf, dist.group.WORLD)
    assert h.rank == 0 and h.world_size == 1 and h.buffer_ptrs == [buf.data_ptr()]
    assert symm_mem.rendezvous(buf, dist.group.WORLD) is h and emulation.is_symm_mem_tensor(buf)
    assert int(h.get_signal_pad(0).view(torch.int32).abs().sum()) == 0, "pads start zeroed"
    h.get_buffer(0, (16,), torch.float32, 4).fill_(3.0)
    assert torch.equal(buf.view(torch.float32)[4:20], torch.full((16,), 3.0, device="cuda"))
    h.barrier(channel=3)
    torch.cuda.synchronize()
    # multicast_ptr is an emulated window (a reserved, unmapped range), the same on every read
    assert h.multicast_ptr == h.multicast_ptr and h.multicast_ptr not in (0, buf.data_ptr())
    refused = 0
    for call in (lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", dist.group.WORLD.group_name),
                 lambda: dist.new_group([0], backend="nccl")):
        try:
            call()
        except NotAvailableInEmulation:
            refused += 1
    assert refused == 2
    print("single-rank ok")
""")


@pytest.mark.gpu(count=1)
def test_single_rank_handle_on_a_gpu():
    proc = subprocess.run([sys.executable, "-c", SINGLE_RANK], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **SAFE_ENV, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and "single-rank ok" in proc.stdout, proc.stdout + proc.stderr
