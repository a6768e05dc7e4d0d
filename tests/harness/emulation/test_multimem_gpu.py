"""Multicast emulated without multicast, on one GPU: the multimem fixtures (tests/fixtures/multimem/) built
through torch's load_inline, rewritten by the build hook, run by two ranks sharing the GPU, and judged by
the whole harness. Correct kernels must be correct; the buggy one must stay wrong.

Not run on CPU (marker gpu(count=1)): pytest -m gpu tests/harness/emulation/test_multimem_gpu.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.common import failures
from harness.common.paths import REPO_ROOT
from harness.config import EvalConfig, TimingConfig
from harness.emulation.multimem_rewrite import rewrite
from harness.evaluate import evaluate
from harness.problems.registry import get, load_suite

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "multimem"
pytestmark = pytest.mark.gpu(count=1)

CASES = [  # (kernel, template, problem, verdict)
    ("all_reduce_v4.cu", "candidate_all_reduce.py", "all_reduce", failures.CORRECT),
    ("all_reduce_scalar.cu", "candidate_all_reduce.py", "all_reduce", failures.CORRECT),
    ("all_reduce_half_bug.cu", "candidate_all_reduce.py", "all_reduce", failures.OUTPUT_MISMATCH),
    ("reduce_scatter_v4.cu", "candidate_reduce_scatter.py", "reduce_scatter", failures.CORRECT),
    ("reduce_scatter_scalar.cu", "candidate_reduce_scatter.py", "reduce_scatter", failures.CORRECT),
]


def candidate(tmp_path: Path, kernel: str, template: str) -> Path:
    source = (FIXTURES / kernel).read_text()
    text = (FIXTURES / template).read_text().replace('KERNEL = ""', f'KERNEL = r"""{source}"""')
    path = tmp_path / f"{Path(kernel).stem}_candidate.py"
    path.write_text(text)
    return path


@pytest.mark.parametrize("kernel, template, problem, verdict", CASES, ids=[c[0] for c in CASES])
def test_multimem_fixture_under_emulation(tmp_path, kernel, template, problem, verdict):
    config = EvalConfig(trials=3, ranks_per_gpu=2, timing=TimingConfig(warmup=2, iters=5, host_iters=2))
    result = evaluate(get(load_suite(), problem), candidate(tmp_path, kernel, template), world_size=2,
                      device="cuda", shape="small", config=config)
    assert result.verdict == verdict, result.failure
    # The result says its build was rewritten, and which instructions (harness.emulation.rewrite_record).
    rewritten = result.integrity["emulation"]["multimem_rewritten"]
    assert rewritten["files"] == 1 and rewritten["seen_in"] == "builds"
    assert rewritten["instructions"] == dict(sorted(rewrite((FIXTURES / kernel).read_text()).rewritten.items()))
