"""harness.compiling.requirements: what a reference or candidate needs that this machine lacks, read from source
only."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from harness.compiling.requirements import environment_issue, file_needs
from harness.problems.parallelkernelbench import checkout
from harness.problems.registry import load_suite
from tests.conftest import TESTS

ODD = TESTS / "fixtures" / "pkb_checkout_oddities"
HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.fixture(scope="module")
def odd():
    return {p.name: p for p in checkout.list_problems(ODD)}


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_lazily_built_cuda_candidate_needs_cuda_on_cpu_only(odd, tmp_path: Path):
    """The shape of every recorded PKB cuda solution: the checkout's helper called inside solution()."""
    lazy = write(tmp_path / "1_all_reduce_cuda.py",
                 "import torch\nfrom utils.cuda_helpers import compile_cuda_extension\n\nSRC = 'x'\n_ext = None\n\n"
                 "def _get_ext():\n    global _ext\n    if _ext is None:\n"
                 "        _ext = compile_cuda_extension('e', SRC)\n    return _ext\n\n"
                 "def solution(tensor):\n    return _get_ext().run(tensor)\n")
    issue = environment_issue(odd["1_all_reduce"], lazy, "cpu")
    assert issue is not None and issue.startswith(
        "the candidate needs CUDA (line 10: compile_cuda_extension(...) builds a CUDA extension)"), issue
    assert issue.endswith("this evaluation runs on CPU") and "\n" not in issue
    assert environment_issue(odd["1_all_reduce"], lazy, "cuda") is None


@pytest.mark.parametrize(("body", "evidence"), [
    ("    return tensor.cuda()", "tensor.cuda()"),
    ("    return torch.zeros(3, device='cuda')", "device='cuda'"),
    ("    return tensor.to('cuda:0')", "tensor.to('cuda:0')"),
    ("    torch.cuda.synchronize()\n    return tensor", "torch.cuda.synchronize()"),
    ("    buf = symm.empty(4, device=tensor.device)\n    return buf", "symm.empty()"),
    ("    return helper(tensor)", "x.cuda()"),  # through a function solution() calls
    ("    assert tensor.is_cuda and tensor.is_contiguous(), 'CUDA only'\n    return tensor", "assert tensor.is_cuda"),
    ("    if not tensor.is_cuda:\n        raise RuntimeError('x must be CUDA')\n    return tensor",
     "if not tensor.is_cuda:"),
    ("    from torch.utils.cpp_extension import load_inline\n"
     "    return load_inline('k', cpp_sources='', cuda_sources='__global__ void k() {}')", "with CUDA sources"),
])
def test_what_needs_cuda(odd, tmp_path: Path, body: str, evidence: str):
    path = write(tmp_path / "c.py", "import torch\nimport torch.distributed._symmetric_memory as symm\n\n"
                 f"def helper(x):\n    return x.cuda()\n\ndef unused(x):\n    return x.to('cuda')\n\n"
                 f"def solution(tensor):\n{body}\n")
    issue = environment_issue(odd["1_all_reduce"], path, "cpu")
    assert issue is not None and evidence in issue, issue


@pytest.mark.parametrize("body", [
    "    if tensor.is_cuda:\n        return tensor.cuda()\n    return tensor.clone()",
    "    return tensor.cuda() if torch.cuda.is_available() else tensor.clone()",
    "    if tensor.is_cuda:\n        raise RuntimeError('this path is for CPU tensors')\n    return tensor.clone()",
    "    try:\n        import cupy\n    except ImportError:\n        cupy = None\n    return tensor.clone()",
    "    dev = torch.device('cuda', 0) if False else tensor.device\n    return torch.zeros(2, device=dev)",
    "    return tensor.clone()\n\nif __name__ == '__main__':\n    solution(torch.ones(2).cuda())",
    "    return unused_helper(tensor) if tensor.device.type == 'cuda' else tensor.clone()",
    # the shape of Opus 4.7's recorded 66/67 (correct on CPU): a fallback returned first, then the CUDA path
    "    if not tensor.is_cuda or tensor.dim() != 2:\n        return tensor.clone()\n"
    "    from utils.cuda_helpers import compile_cuda_extension\n"
    "    return compile_cuda_extension('e', 'src').run(tensor.cuda())",
])
def test_fallbacks_and_unreached_code_need_nothing(odd, tmp_path: Path, body: str):
    path = write(tmp_path / "c.py", "import torch\n\ndef unused_helper(x):\n    return x.cuda()\n\n"
                 f"def solution(tensor):\n{body}\n")
    assert environment_issue(odd["1_all_reduce"], path, "cpu") is None


def test_missing_packages(odd, tmp_path: Path):
    """A reference that needs a missing package cannot run anywhere here; a candidate's missing package is
    the environment's fault only for a GPU backend or one the reference needs too."""
    root = tmp_path / "checkout"
    (root / "reference").mkdir(parents=True)
    (root / "utils").mkdir()
    (root / "utils" / "input_output_tensors.py").write_text("def create_input_tensor(*a, **k):\n    return ()\n")
    (root / "utils" / "kernels.py").write_text("import pkb_fixture_no_such_package\n")
    write(root / "reference" / "1_q.py", "import pkb_fixture_no_such_package as p\n\ndef solution(x):\n"
          "    return p.run(x)\n")
    write(root / "reference" / "2_r.py", "import torch\n\ndef solution(x):\n    return x\n")
    first, second = checkout.list_problems(root)
    for device in ("cpu", "cuda"):
        issue = environment_issue(first, None, device)
        assert issue == ("the reference needs the package pkb_fixture_no_such_package, which is not installed here "
                         "(reference/1_q.py, line 1: import pkb_fixture_no_such_package)")
    typo = write(tmp_path / "typo.py", "import pkb_fixture_misspelt\n\ndef solution(x):\n    return x\n")
    assert environment_issue(second, typo, "cpu") is None  # the candidate's own error, for the workers
    shared = write(tmp_path / "shared.py", "from utils.kernels import run\n\ndef solution(x):\n    return run(x)\n")
    assert environment_issue(second, shared, "cuda") is None
    triton = write(tmp_path / "tri.py", "import triton\n\ndef solution(x):\n    return x\n")
    issue = environment_issue(second, triton, "cuda")
    if HAS_TRITON:
        assert issue is None and "CUDA" in (environment_issue(second, triton, "cpu") or "")
    else:
        assert issue is not None and "needs the package triton, which is not installed here" in issue
    needs = file_needs(shared, (root,))
    assert [n.what for n in needs] == ["pkb_fixture_no_such_package"]
    assert needs[0].evidence.startswith("import utils.kernels (kernels.py line 1")


def test_this_suites_own_candidates_are_judged_as_their_devices_say():
    """Every exploit that runs on CPU has no environment issue there; every CUDA-only one has one."""
    all_reduce = next(p for p in load_suite() if p.name == "all_reduce")
    checked = 0
    for path in sorted((TESTS / "exploits").glob("*.py")):
        expect = next((ast.literal_eval(n.value) for n in ast.parse(path.read_text()).body
                       if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "EXPECT"), None)
        if expect is None:
            continue
        issue = environment_issue(all_reduce, path, "cpu")
        assert (issue is None) == ("cpu" in expect["devices"]), (path.name, issue)
        checked += 1
    assert checked >= 20
    for path in sorted((TESTS / "candidates").glob("*.py")):
        assert environment_issue(all_reduce, path, "cpu") is None, path.name
    assert all(environment_issue(p, None, "cpu") is None for p in load_suite())


def test_the_oddity_checkouts_references_run_here(odd):
    assert {name: environment_issue(p, None, "cpu") for name, p in odd.items()} == {name: None for name in odd}
