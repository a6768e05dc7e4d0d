"""The scan of built binaries for multimem (harness.emulation.multimem_scan), on objects nvcc builds here.

Needs nvcc and cuobjdump (the CUDA toolkit, or the nvidia-cuda-cuobjdump package); skipped without them,
except the fail-closed cases, which need neither.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harness.common.paths import REPO_ROOT
from harness.emulation import multimem_scan
from harness.emulation.multimem_rewrite import rewrite

NVCC = shutil.which("nvcc")
CUOBJDUMP = multimem_scan.find_cuobjdump()
needs_tools = pytest.mark.skipif(NVCC is None or CUOBJDUMP is None,
                                 reason="needs nvcc and cuobjdump (CUDA toolkit or nvidia-cuda-cuobjdump)")

LD_REDUCE = r'''
#include <cstdint>
__global__ void k(uint64_t mc, uint32_t* out) {
    uint32_t a, b, c, d;
    asm volatile("multimem.ld_reduce.relaxed.sys.global.add.v4.bf16x2 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(mc) : "memory");
    out[0] = a ^ b ^ c ^ d;
}
'''
STORE_ONLY = r'''
#include <cstdint>
__global__ void k(uint64_t mc, uint32_t v) {
    asm volatile("multimem.st.relaxed.sys.global.f32 [%0], %1;" :: "l"(mc), "r"(v) : "memory");
}
'''
PLAIN = "__global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n"


def build(tmp_path: Path, source: str, name: str, *flags: str) -> Path:
    cu = tmp_path / f"{name}.cu"
    cu.write_text(source)
    out = tmp_path / name
    assert NVCC is not None
    done = subprocess.run([NVCC, *flags, "-o", str(out), str(cu)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@needs_tools
def test_ld_reduce_is_found_in_sass_and_gone_after_the_rewrite(tmp_path):
    original = multimem_scan.scan(build(tmp_path, LD_REDUCE, "original.cubin", "-arch=sm_90a", "-cubin"))
    assert not original.clean and any("LDGMC" in f for f in original.findings), original.describe()
    rewritten = multimem_scan.scan(build(tmp_path, rewrite(LD_REDUCE).source, "rewritten.cubin", "-arch=sm_90a",
                                         "-cubin"))
    assert rewritten.clean and rewritten.views == ["sass"], rewritten.describe()


@needs_tools
def test_an_extension_library_is_scanned_in_sass_and_ptx(tmp_path):
    flags = ("-gencode", "arch=compute_90a,code=sm_90a", "-gencode", "arch=compute_90a,code=compute_90a",
             "-shared", "-Xcompiler", "-fPIC")
    found = multimem_scan.scan(build(tmp_path, LD_REDUCE + STORE_ONLY.replace("void k(", "void k2("), "ext.so", *flags))
    assert {f.split(":")[0] for f in found.findings} == {"sass", "ptx"}
    assert any("multimem.st.relaxed.sys.global.f32" in f for f in found.findings)
    clean = multimem_scan.scan(build(tmp_path, rewrite(LD_REDUCE).source, "clean.so", *flags))
    assert clean.clean and clean.views == ["sass", "ptx"]


@needs_tools
def test_stores_show_only_in_ptx(tmp_path):
    """What SASS cannot show: multimem.st compiles to an ordinary STG, so a binary without PTX hides it
    (docs/emulation.md: the unmapped window is what stops such a store)."""
    sass_only = multimem_scan.scan(build(tmp_path, STORE_ONLY, "st.cubin", "-arch=sm_90a", "-cubin"))
    assert sass_only.clean
    with_ptx = multimem_scan.scan(build(tmp_path, STORE_ONLY, "st.fatbin", "-gencode",
                                        "arch=compute_90a,code=compute_90a", "-fatbin"))
    assert not with_ptx.clean and with_ptx.findings[0].startswith("ptx: multimem.st")


@needs_tools
def test_a_binary_without_device_code_is_clean(tmp_path):
    host = build(tmp_path, "int f() { return 1; }\n", "host.so", "-shared", "-Xcompiler", "-fPIC")
    assert multimem_scan.scan(host).clean
    plain = multimem_scan.scan(build(tmp_path, PLAIN, "plain.cubin", "-arch=sm_90a", "-cubin"))
    assert plain.clean and plain.views == ["sass"]


def test_a_scan_that_cannot_run_is_never_clean(tmp_path, monkeypatch):
    binary = tmp_path / "x.so"
    binary.write_bytes(b"\x7fELF not really")
    monkeypatch.setattr(multimem_scan, "find_cuobjdump", lambda: None)
    missing = multimem_scan.scan(binary)
    assert not missing.clean and "cuobjdump was not found" in missing.error
    assert not multimem_scan.scan(tmp_path / "absent.so", tool="/bin/true").clean
    failing = multimem_scan.scan(binary, tool=str(REPO_ROOT / "no-such-tool"))
    assert not failing.clean and "cuobjdump -sass" in failing.error
    refused = multimem_scan.scan(binary, tool="/bin/false")
    assert not refused.clean and "exited 1" in refused.error
