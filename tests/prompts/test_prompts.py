"""Prompt templates: loading, hashing, rendering, code extraction, the guide and the in-context example.

The example's CUDA source compiles with nvcc where nvcc exists; on two GPUs (marker `gpu`) the example runs
against a ring-shift problem written for this test, and the tools run an expert kernel on CUDA:

    pytest -m gpu tests/prompts/test_prompts.py
"""

from __future__ import annotations

import ast
import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import prompts
from harness.config import EvalConfig, Limits, TimingConfig
from harness.evaluate import evaluate
from harness.measure.calibration import AllReducePoint, Calibration, PeerCopy
from harness.measure.discovery import Gpu, NvLink, Topology
from harness.measure.topology import Profile
from harness.problems.problem import load_problem
from harness.problems.registry import SUITE_ROOT, get, load_suite
from tests.conftest import timings_of
from tools import render
from tools.render import count_tokens
from tools.specs import TOOL_NAMES

EXAMPLE = prompts.EXAMPLES_DIR / "ring_shift.py"
EXPERT_FILES = sorted(SUITE_ROOT.glob("*/solutions/*.py")) + [SUITE_ROOT / "_symm" / "__init__.py"]


@pytest.fixture(scope="module")
def all_reduce():
    return get(load_suite(), "all_reduce")


def distinctive_lines(path: Path, min_len: int = 40) -> set[str]:
    """Lines long enough to be recognisable if quoted (comments and code alike; imports are everyone's)."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return {line for line in lines if len(line) >= min_len and not line.startswith(("import ", "from "))}


# -- files and hashes --------------------------------------------------------------------------------


def test_hashes_cover_every_template_and_example():
    hashes = prompts.hashes()
    assert set(hashes) >= {"system.md", "task.md", "zero_shot.md", "tools.md", "guide.md", "examples/README.md",
                           "examples/ring_shift.py"}
    assert "__init__.py" not in hashes
    for name, digest in hashes.items():
        assert digest == hashlib.sha256((prompts.PROMPT_DIR / name).read_bytes()).hexdigest()


def test_load_stays_inside_the_prompt_folder():
    assert "$tool_list" in prompts.load("system.md")
    for bad in ("../pyproject.toml", "missing.md", "examples"):
        with pytest.raises(prompts.PromptError):
            prompts.load(bad)


def test_every_tool_has_a_description_and_its_arguments_too():
    descriptions = prompts.tool_descriptions()
    assert set(descriptions) == set(TOOL_NAMES)
    assert all(len(d) > 40 and "\n" not in d for d in descriptions.values())
    assert "barrier" in descriptions["guide"]  # $topics was filled in
    assert set(prompts.arg_descriptions()) == {"source", "source_optional", "topic", "candidate", "command"}


# -- system prompts -----------------------------------------------------------------------------------


def test_agent_system_prompt_lists_exactly_the_condition_tools():
    text = prompts.render_system(["compile", "check", "submit"], guide_in_prompt=False)
    listed = re.findall(r"^- `(\w+)`:", text, flags=re.M)
    assert listed == ["compile", "check", "submit"]
    assert "submit" in text and "# Multi-GPU programming guide" not in text
    assert "```python\n" + EXAMPLE.read_text().rstrip() in text  # the whole example, verbatim
    assert not re.search(r"\$[a-z_]+", text), "a placeholder was left unfilled"
    with pytest.raises(prompts.PromptError, match="nccl"):
        prompts.render_system(["compile", "nccl"], guide_in_prompt=False)


def test_zero_shot_and_guide_placement():
    zero = prompts.render_system([], guide_in_prompt=False)
    assert "one reply and no tools" in zero and "## Tools" not in zero and "ring_shift.py" in zero
    with_guide = prompts.render_system([], guide_in_prompt=True)
    assert prompts.guide_text() in with_guide
    as_tool = prompts.render_system(["check", "guide", "submit"], guide_in_prompt=False)
    assert "The `guide` tool returns sections" in as_tool and prompts.guide_text() not in as_tool


def test_prompts_never_quote_expert_solutions(all_reduce):
    shown = prompts.render_system(list(TOOL_NAMES), guide_in_prompt=True)
    shown += prompts.render_task(all_reduce, "small", 2, None, include_guide=True)
    for path in EXPERT_FILES:
        quoted = [line for line in distinctive_lines(path) if line in shown]
        assert not quoted, f"{path} is quoted: {quoted[:3]}"


# -- the task prompt ----------------------------------------------------------------------------------


def test_task_prompt_holds_the_spec_and_the_rules_but_not_the_oracle(all_reduce):
    text = prompts.render_task(all_reduce, "default", 2, None, include_guide=False)
    assert "dist.all_reduce(out, op=dist.ReduceOp.SUM)" in text and "@torch.no_grad()" in text
    for hidden in ("def oracle", "def make_inputs", "PROBLEM", "inputs_by_rank", "randn"):
        assert hidden not in text, hidden
    assert "Signature: `solution(x)`" in text and "Main dtype: bfloat16" in text
    assert '{"tokens": 4096, "hidden": 8192}' in text and "`x`: Tensor[bfloat16](4096, 8192)" in text
    assert "W = 2" in text and "atol 0.02, rtol 0.02" in text
    assert "No topology was measured" in text and "multicast is disabled" in text
    for api in ("symm_mem.empty", "symm_mem.rendezvous", "buffer_ptrs_dev", "signal_pad_ptrs_dev",
                "get_buffer(rank, sizes, dtype", "barrier(channel", "hdl.rank", "hdl.world_size",
                "load_inline", "cupy.RawModule"):
        assert api in text, api
    assert "No NCCL or torch.distributed collectives in the timed call" in text
    assert "Do not modify the inputs" in text and "```python fenced block" in text
    assert not re.search(r"\$[a-z_]+", text), "a placeholder was left unfilled"
    assert "# Multi-GPU programming guide" not in text
    assert prompts.guide_text() in prompts.render_task(all_reduce, "small", 2, None, include_guide=True)


def test_task_prompt_tells_how_a_load_inline_edit_rebuilds_in_seconds(all_reduce):
    """The split layout (benchmarks/edit_verdict.py's candidates): torch only in cpp_sources, no implicit header."""
    text = " ".join(prompts.render_task(all_reduce, "default", 2, None, include_guide=False).split())
    for fact in ("Keep torch headers out of cuda_sources", '`extern "C"` launcher taking raw pointers and a '
                 "`cudaStream_t`", "`#include <torch/extension.h>` and the torch::Tensor wrappers",
                 "`no_implicit_headers=True`", "an edit to a kernel rebuilds in seconds", "about a minute every time"):
        assert fact in text, fact


def test_reference_source_keeps_what_solution_uses_and_hides_the_rest(tmp_path):
    folder = tmp_path / "other"
    folder.mkdir()
    path = folder / "toy_scale.py"
    path.write_text('''"""A toy problem."""

import math

import torch
import torch.distributed as dist

PROBLEM = {"name": "toy_scale"}
SCALE = 3.0
SECRET = 42  # only the oracle uses it


# doubles then scales
def _helper(x):
    return x * 2 * SCALE


def _oracle_only(x):
    return x * SECRET


def make_inputs(shape, rank, world_size, generator, device):
    return (torch.randn(4, generator=generator),)


@torch.no_grad()
def solution(x):
    out = _helper(x)
    dist.all_reduce(out)
    return out


def oracle(shape, world_size, inputs_by_rank):
    return [_oracle_only(i[0]) for i in inputs_by_rank]
''')
    text = prompts.reference_source(path)
    assert text.startswith("import math\nimport torch\nimport torch.distributed as dist")
    assert "SCALE = 3.0" in text and "# doubles then scales\ndef _helper(x)" in text
    assert "@torch.no_grad()\ndef solution(x):" in text
    for hidden in ("SECRET", "_oracle_only", "make_inputs", "def oracle", "PROBLEM", "A toy problem"):
        assert hidden not in text, hidden
    ast.parse(text)  # still valid Python


def test_every_suite_problem_renders(all_reduce):
    problems = load_suite()
    for problem in problems:
        text = prompts.reference_source(problem.path)
        ast.parse(text)
        assert "def solution" in text and "def oracle" not in text, problem.name
    # Inputs of a problem with data-dependent sizes still render (FakeTensorMode cannot trace them).
    text = prompts.render_task(get(problems, "all_to_all_v"), "small", 2, None, include_guide=False)
    assert "(not available)" not in text and "Tensor[" in text


def topology_profile() -> dict:
    links = [NvLink(link=i, active=True, gbytes_per_s=26.562, version=4) for i in range(18)]
    gpus = [Gpu(index=i, name="NVIDIA H200", memory_bytes=143771287552, sm_count=132, l2_bytes=52428800,
                compute_capability="9.0", nvlinks=links, multicast_supported=True) for i in range(2)]
    topo = Topology(discovered_at="2026-11-29T19:00:00+00:00", gpu_count=2, gpus=gpus, torch="2.11.0",
                    cuda="13.0", nccl="2.28.3", driver="580.1", peer_access=[[True, True], [True, True]],
                    interconnect=[["X", "NV18"], ["NV18", "X"]], nvlink_source="nvml",
                    multicast_supported=True, multicast_disabled_by_policy=True)
    cal = Calibration(
        measured_at="2026-11-29T19:10:00+00:00", world_size=2, copy_bytes=1 << 30,
        peer_copy=[PeerCopy(src=0, dst=1, median_ms=2.72, bytes_per_s=394.2e9)],
        peer_copy_bidir=[PeerCopy(src=0, dst=1, median_ms=3.0, bytes_per_s=360.0e9)],
        hbm_copy_bytes_per_s=[4.28e12, 4.27e12], matmul_n=8192, matmul_bf16_flops_per_s=[7.9e14, 7.8e14],
        all_reduce=[AllReducePoint(bytes=1 << 20, median_us=27.0, p10_us=26.5, p90_us=27.9, cv=0.01,
                                   host_median_us=40.0, algbw_bytes_per_s=38.8e9, busbw_bytes_per_s=38.8e9)])
    return Profile(hardware_key="abc", topology=topo, calibration=cal).model_dump(mode="json")


def test_task_prompt_topology_has_measured_ceilings_and_multicast(all_reduce):
    text = prompts.render_task(all_reduce, "small", 2, topology_profile(), include_guide=False)
    assert '"peer_copy_gbytes_per_s_one_way": 394.2' in text
    assert '"hbm_copy_tbytes_per_s_read_plus_write": 4.28' in text and '"bf16_matmul_tflops": 790' in text
    assert '"busbw_gbytes_per_s": 38.8' in text and '"NV18"' in text and '"nvlinks_per_gpu": 18' in text
    assert '"hardware_supported": true' in text and '"allowed": false' in text
    assert "the hardware reports multicast support; NVLink multicast is disabled" in text
    assert "Target: 2 x NVIDIA H200 (sm_90)" in text
    summary = prompts.topology_summary(topology_profile())
    assert summary["gpus"]["sms"] == 132 and summary["multicast"]["allowed"] is False
    assert prompts.topology_summary({"custom": 1}) == {"custom": 1}  # an unknown shape passes through


# -- code extraction ----------------------------------------------------------------------------------

CODE = "def solution(x):\n    return x\n"


@pytest.mark.parametrize("reply, expected", [
    (None, None),
    ("", None),
    ("I would use a one-shot all-reduce here.", None),
    ("Inline ```python x``` is not a block.", None),
    (f"Here:\n```python\n{CODE}```\nDone.", CODE),
    (f"Draft:\n```python\ndef solution(x):\n    pass\n```\nFinal:\n```python\n{CODE}```", CODE),
    (f"```python\n{CODE}```\nand the kernel alone:\n```cuda\n__global__ void k() {{}}\n```", CODE),
    (f"```\n{CODE}```", CODE),
    (f"```\n{CODE}```\n```\nprint(1)\n```", None),
    ("```cuda\n__global__ void k() {}\n```", None),
    (f"```py\n{CODE}```", CODE),
    (f"~~~python\n{CODE}~~~", CODE),
    (f"````python\n{CODE}s = '''\n```\n'''\n````", CODE + "s = '''\n```\n'''\n"),
    ("```python\n\n```", None),
    (f"The reply was cut:\n```python\n{CODE}    # unfinished", CODE + "    # unfinished\n"),
    ("```python", None),
])
def test_extract_code_from_hostile_replies(reply, expected):
    assert prompts.extract_code(reply) == expected


# -- the guide ---------------------------------------------------------------------------------------


def test_guide_is_concise_and_covers_its_subjects():
    sections = prompts.guide_sections()
    topics = [s.topic for s in sections]
    assert len(topics) == len(set(topics)) and "barrier" in topics and "failures" in topics
    words = len(prompts.guide_text().split())
    assert 1500 <= words <= 2500, words
    text = prompts.guide_text()
    for subject in ("signal pad", "st.release.sys", "ld.acquire.sys", "Epoch flags", "CAS flags", "double-buffer",
                    "One-shot", "Two-shot", "Copy engine", "TMA", "current_stream", "multicast",
                    "Rank coordination", "Data partitioning", "Collective ordering", "Deadlock", "rank order"):
        assert subject in text, subject
    if render.encodings():  # real token counts (tiktoken's data available offline)
        assert all(count_tokens(s.text()) <= 580 for s in sections)  # each fits one default tool answer


# -- the in-context example --------------------------------------------------------------------------


def example_cuda() -> str:
    tree = ast.parse(EXAMPLE.read_text())
    return next(n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                and isinstance(n.value.value, str)
                and getattr(n.targets[0], "id", None) == "CUDA_SRC")


def test_example_is_a_symmetric_memory_kernel_for_a_problem_outside_the_suite():
    text = EXAMPLE.read_text()
    tree = ast.parse(text)
    solution = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "solution")
    assert [a.arg for a in solution.args.args] == ["x"]
    for needed in ("symm_mem.empty", "symm_mem.rendezvous", "buffer_ptrs_dev", "signal_pad_ptrs_dev",
                   "st.release.sys", "ld.acquire.sys", "torch.cuda.current_stream", "cupy.RawKernel"):
        assert needed in text, needed
    assert "multimem" not in text and "multicast_ptr" not in text
    assert "problems" not in {(n.module or "").split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert "ring_shift" not in {p.name for p in load_suite()}
    for path in EXPERT_FILES:
        assert not distinctive_lines(path) & distinctive_lines(EXAMPLE), path


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_example_cuda_source_compiles_for_sm90(tmp_path):
    source = tmp_path / "ring_shift.cu"
    source.write_text(example_cuda())
    done = subprocess.run(["nvcc", "-arch=sm_90", "-c", str(source), "-o", str(tmp_path / "ring_shift.o")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


# -- GPU: the example against its own problem --------------------------------------------------------

RING_SHIFT_PROBLEM = '''"""Ring shift: every rank receives its left neighbour's tensor."""

import torch
import torch.distributed as dist

PROBLEM = {
    "name": "ring_shift",
    "category": "other",
    "source": {"codebase": "pkb-agent", "path": "prompts/examples/ring_shift.py", "symbol": "solution"},
    "summary": "Each rank sends its tensor to rank r+1 and returns the one from rank r-1.",
    "dtype": "bfloat16",
    "shapes": {"default": {"n": 1 << 25}, "odd": {"n": 1000003}, "small": {"n": 64}},
    "world_sizes": [2, 4, 8],
    "tolerance": {"atol": 0.0, "rtol": 0.0},
}


def make_inputs(shape, rank, world_size, generator, device):
    return (torch.randn(shape["n"], generator=generator, device=device).to(torch.bfloat16),)


@torch.no_grad()
def solution(x):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, out, (rank - 1) % world)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return out


def oracle(shape, world_size, inputs_by_rank):
    return [inputs_by_rank[(r - 1) % world_size][0].clone() for r in range(world_size)]
'''


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["small", "odd", "default"])
def test_example_is_correct_on_two_gpus(tmp_path, shape):
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "ring_shift.py").write_text(RING_SHIFT_PROBLEM)
    problem = load_problem(folder / "ring_shift.py")
    config = EvalConfig(trials=5, skip_timing=shape != "default", limits=Limits(check_s=120))
    result = evaluate(problem, EXAMPLE, world_size=2, device="cuda", shape=shape, config=config,
                      log_dir=tmp_path / "logs")
    assert result.verdict == "correct", result.failure
    if shape == "default":
        assert result.speedup is not None and result.speedup > 0
        print(f"ring_shift {shape}: speedup {result.speedup:.2f}x, candidate median "
              f"{timings_of(result).candidate.median_ms * 1e3:.1f} us")


@pytest.mark.gpu
def test_tools_run_an_expert_kernel_on_cuda(tmp_path, all_reduce):
    from tools.base import ToolContext, ToolSettings
    from tools.dispatch import run_tool

    ctx = ToolContext(problem=all_reduce, settings=ToolSettings(2, "cuda", "1mib"),
                      config=EvalConfig(timing=TimingConfig.for_device("cuda")), workdir=tmp_path)
    expert = (SUITE_ROOT / "collective" / "solutions" / "all_reduce__one_shot.py").read_text()
    o = run_tool("bench", {"source": expert}, ctx)
    assert o.data["verdict"] == "correct", o.text
    assert o.data["speedup"] > 0 and o.gpu_seconds > 0 and "CUDA events" in o.text
    assert count_tokens(o.text) <= ctx.answer_tokens
    print(o.text)
