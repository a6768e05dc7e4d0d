"""The trusted judge and the sandbox on a GPU machine: which sandbox starts there, what a rank sees and may
do inside it (`--checks`), evaluations with and without it (wall time per evaluation, interleaved), and
exploits that run on CUDA, their verdicts.

    python benchmarks/gpu_sandbox.py --out OUTDIR [--checks] [--repeats 3] [--exploits] [--device cpu]

`--checks` (issue 31): the uid the ranks run as on the host and the GPU device nodes' modes; inside a
sandbox, as that uid: the device nodes open, CUDA initialises and computes (the driver's libraries are
bound), root-only files stay unreadable; an expert solution with W=2 ranks sharing the GPU (symmetric
memory emulated over CUDA IPC between the sandbox's ranks) is judged correct; a rank over its memory limit
is the candidate's runtime_error naming the limit; which memory backend (cgroup or watchdog) is in force.
`--device cpu` runs the same on a CPU machine (the GPU-only parts skipped), to try the script first.

With fewer GPUs than ranks, the W ranks share the visible GPUs under gloo (CUDA tensors): the harness
runs as on a multi-GPU node, only NCCL is missing. Writes OUTDIR/gpu_sandbox.json and OUTDIR/gpu_sandbox.md.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import stat
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import EvalConfig, Limits, TimingConfig  # noqa: E402
from harness.evaluate import evaluate  # noqa: E402
from harness.launch.sandbox import policy, probe  # noqa: E402
from harness.launch.sandbox.limits import SandboxLimits  # noqa: E402
from harness.launch.sandbox.memory import memory_cgroup_parent  # noqa: E402
from harness.launch.sandbox.private import private_folder, remove_private  # noqa: E402
from harness.problems.registry import get, load_suite  # noqa: E402

EXPLOITS = ROOT / "tests" / "exploits"
CANDIDATES = ROOT / "tests" / "candidates"
# Exploits that run on CUDA under gloo (the symmetric-memory and copy-engine ones need peers' memory).
CUDA_EXPLOITS = ["timer_patch.py", "timer_patch_when_timed.py", "patch_harness.py", "gc_forged_ok.py",
                 "torch_function_mode.py", "raising_comparison.py", "raising_tensor_subclass.py", "forge_reply.py",
                 "mutates_inputs_when_timed.py", "replay_when_timed.py", "replay_first_call.py", "lazy_subclass.py",
                 "lazy_next_call.py", "reduced_precision_int8.py", "empty_like_reuse.py", "reads_peer_inputs.py",
                 "nccl_all_reduce.py", "reference_call.py", "hang_forever.py", "content_cache.py"]


def expectation(path: Path) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EXPECT" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def one(problem, candidate: Path, shape: str, sandbox: bool, device: str = "cuda", **kw) -> dict:
    if sandbox:
        os.environ.pop("PKB_SANDBOX", None)
    else:
        os.environ["PKB_SANDBOX"] = "off"
    policy._bwrap_works.cache_clear()
    config = EvalConfig(trials=3, timing=TimingConfig.for_device(device), use_reference_cache=False,
                        limits=Limits(check_s=kw.pop("check_s", 120.0), grace_s=2),
                        ranks_per_gpu=kw.pop("ranks_per_gpu", 1), skip_timing=kw.pop("skip_timing", False))
    started = time.perf_counter()
    r = evaluate(problem, candidate, world_size=2, device=device, shape=shape, config=config,
                 integrity_config=kw.pop("integrity", None))
    return {"candidate": candidate.name, "shape": shape, "sandbox": r.integrity.get("sandbox", {}).get("backend"),
            "seconds": round(time.perf_counter() - started, 3), "verdict": r.verdict, "flags": r.flags,
            "message": r.failure.message[:300] if r.failure else None, "stages": r.stages,
            "median_ms": r.timings.candidate.median_ms if r.timings else None,
            "reference_ms": r.timings.reference.median_ms if r.timings else None,
            "span_ms": r.timings.candidate.span_median_ms if r.timings else None}


# What a rank checks about itself inside its sandbox (printed as one JSON line).
INSIDE = textwrap.dedent("""
    import glob, json, os
    seen = {"uid": os.getresuid(), "gid": os.getresgid(), "groups": os.getgroups(),
            "capabilities": {l.split(":")[0]: l.split()[1] for l in open("/proc/self/status") if l.startswith("Cap")},
            "unreadable": {}, "devices": {}}
    for path in ("/etc/shadow", "/root/.bashrc", "/root/.ssh", os.environ.get("PKB_TEST_PRIVATE_FILE", "")):
        if path:
            try:
                open(path, "rb").read(1) if not os.path.isdir(path) else os.listdir(path)
                seen["unreadable"][path] = False
            except OSError as err:
                seen["unreadable"][path] = err.strerror
    for node in sorted(glob.glob("/dev/nvidia*")):
        if os.path.isdir(node):  # /dev/nvidia-caps: a folder of capability nodes, not a device to open
            continue
        try:
            os.close(os.open(node, os.O_RDWR))
            seen["devices"][node] = "opens"
        except OSError as err:
            seen["devices"][node] = err.strerror
    try:
        import torch
        seen["cuda_available"] = torch.cuda.is_available()
        if seen["cuda_available"]:
            x = torch.randn(1024, 1024, device="cuda")
            seen["cuda_matmul_sum"] = float((x @ x).sum().item()) != 0.0
            seen["device_count"] = torch.cuda.device_count()
            seen["device_name"] = torch.cuda.get_device_name(0)
    except Exception as err:
        seen["cuda_error"] = f"{type(err).__name__}: {err}"
    print(json.dumps(seen))
""")


def checks(device: str) -> dict:
    """The sandbox's facts on this machine, and what a rank finds inside it."""
    info = probe()
    cgroups = memory_cgroup_parent()
    out: dict = {"euid": os.geteuid(), "probe": info.record(),
                 "memory_backend": f"cgroup under {cgroups}" if cgroups else "watchdog (no writable memory cgroup)",
                 "device_nodes": {n: stat.filemode(os.stat(n).st_mode) for n in sorted(glob.glob("/dev/nvidia*"))
                                  if not os.path.isdir(n)}}
    out["device_nodes_world_rw"] = all(os.stat(n).st_mode & 0o006 == 0o006 for n in out["device_nodes"])
    if info.backend != "bwrap":
        out["inside"] = {"skipped": info.reason}
        return out
    secret = Path.home() / f".pkb-gpu-sandbox-secret-{os.getpid()}"
    secret.write_text("root only")
    os.chmod(secret, 0o600)
    folder = private_folder("pkb-gpu-sandbox-")
    try:
        scratch = folder / "scratch"
        scratch.mkdir(mode=0o1777)
        # The 0600 file is bound on purpose: only the uid the rank runs as can keep it from being read.
        sandbox = policy.SandboxPolicy(scratch=scratch, gpus=device == "cuda", limits=SandboxLimits.for_ranks(1),
                                       info=info, visible=(secret,))
        command = sandbox.bwrap_command([sys.executable, "-c", INSIDE], ROOT)
        env = policy.clean_environment({**os.environ, "PKB_TEST_PRIVATE_FILE": str(secret)}, scratch)
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=str(ROOT))
        out["record"] = sandbox.record(ROOT)
        try:
            out["inside"] = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            out["inside"] = {"error": f"rc {done.returncode}: {done.stderr[-1500:]}"}
    finally:
        secret.unlink()
        remove_private(folder)
    inside = out["inside"]
    out["ok"] = {
        "ranks_unprivileged_on_host": info.host_uid_switch or os.geteuid() != 0,
        "root_files_unreadable": inside.get("unreadable", {}).get(str(secret)) == "Permission denied"
                                 and all(v is not False for v in inside["unreadable"].values()),
        "no_capabilities": all(int(v, 16) == 0 for v in inside.get("capabilities", {}).values()),
        "device_nodes_open": all(v == "opens" for v in inside.get("devices", {}).values()),
        "cuda_works": device != "cuda" or inside.get("cuda_matmul_sum") is True,
    }
    return out


def limits_and_ipc(suite, device: str) -> list[dict]:
    """An expert solution with both ranks on one GPU (symmetric memory emulated over CUDA IPC between the
    sandbox's ranks), and a rank over its memory limit."""
    rows = []
    if device == "cuda":
        expert = ROOT / "problems" / "collective" / "solutions" / "all_reduce__one_shot.py"
        row = one(get(suite, "all_reduce"), expert, "small", True, device=device, ranks_per_gpu=2, skip_timing=True,
                  check_s=300.0)
        rows.append({"check": "cuda_ipc_between_sandboxed_ranks", "expected": "correct", **row})
    hog = one(get(suite, "all_reduce"), EXPLOITS / "memory_hog.py", "small", True, device=device, skip_timing=True,
              integrity={"rank_memory_bytes": 3 << 30})  # a CUDA rank's own host memory fits in 3 GiB
    rows.append({"check": "memory_limit", "expected": "runtime_error", **hog,
                 "names_limit": "rank_memory_bytes" in (hog["message"] or "")})
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def markdown(report: dict) -> str:
    lines = ["# gpu_sandbox", "", f"date {report['date']}; sandbox {report['sandbox'].get('backend')}", ""]
    c = report.get("checks")
    if c:
        lines += ["| check | result |", "| --- | --- |"]
        lines += [f"| {k} | {v} |" for k, v in c.get("ok", {}).items()]
        lines += [f"| memory backend | {c.get('memory_backend')} |",
                  f"| device nodes world rw | {c.get('device_nodes_world_rw')} |"]
        for row in report.get("limits", []):
            lines.append(f"| {row['check']} | {row['verdict']} (expected {row['expected']}) |")
    if report.get("cost_summary"):
        lines += ["", "| shape | sandboxed s | unsandboxed s | difference s |", "| --- | --- | --- | --- |"]
        lines += [f"| {shape} | {v['sandboxed_s']:.2f} | {v['unsandboxed_s']:.2f} | {v['difference_s']:.2f} |"
                  for shape, v in report["cost_summary"].items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--exploits", action="store_true")
    parser.add_argument("--checks", action="store_true", help="the sandbox's uid, devices, limits and CUDA IPC")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run on a CPU machine")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    info = probe()
    report: dict = {"sandbox": info.record(), "date": time.strftime("%Y-%m-%d %H:%M"), "cost": [], "exploits": []}
    print(json.dumps(report["sandbox"]), flush=True)
    suite = load_suite()
    all_reduce = get(suite, "all_reduce")

    def save() -> None:
        (args.out / "gpu_sandbox.json").write_text(json.dumps(report, indent=1))
        (args.out / "gpu_sandbox.md").write_text(markdown(report))

    if args.checks:
        report["checks"] = checks(args.device)
        print(json.dumps(report["checks"]), flush=True)
        save()
        report["limits"] = limits_and_ipc(suite, args.device)
        save()
    good = CANDIDATES / "correct_all_gather_sum.py"
    shapes = ("small", "default") if args.device == "cuda" else ("small",)  # default is minutes a run on CPU
    for repeat in range(args.repeats):
        for shape in shapes:
            for sandbox in (True, False):
                row = {"repeat": repeat, **one(all_reduce, good, shape, sandbox, device=args.device)}
                report["cost"].append(row)
                print(json.dumps(row), flush=True)
                save()
    summary = {}
    for shape in shapes:
        on = [r["seconds"] for r in report["cost"] if r["shape"] == shape and r["sandbox"] == "bwrap"]
        off = [r["seconds"] for r in report["cost"] if r["shape"] == shape and r["sandbox"] == "none"]
        if on and off:
            summary[shape] = {"sandboxed_s": statistics.median(on), "unsandboxed_s": statistics.median(off),
                              "difference_s": statistics.median(on) - statistics.median(off)}
    report["cost_summary"] = summary
    print(json.dumps(summary), flush=True)
    save()
    if args.exploits:
        for name in CUDA_EXPLOITS:
            expect = expectation(EXPLOITS / name)
            problem = get(suite, expect.get("problem", "all_reduce"))
            row = one(problem, EXPLOITS / name, "small", True, device=args.device,
                      **({"check_s": 8.0} if name == "hang_forever.py" else {}))
            row["expected"] = expect.get("verdict")
            row["expected_flags"] = expect.get("flags", [])
            row["as_expected"] = row["verdict"] == row["expected"] and set(row["expected_flags"]) <= set(row["flags"])
            report["exploits"].append(row)
            print(json.dumps(row), flush=True)
            save()
        report["exploits_as_expected"] = sum(r["as_expected"] for r in report["exploits"])
        save()
    save()
    print(markdown(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
