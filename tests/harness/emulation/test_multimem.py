"""Multicast emulated without multicast, on CPU: the multimem rewrite (harness.emulation.multimem_rewrite),
the window layout and the emulated handle's multicast_ptr, the build hook, the gate for candidates
(harness.problems.parallelkernelbench.multicast.emulation_reason), the fixtures compiled with nvcc after the
rewrite, and every multimem line of PKB's recorded CUDA sets. GPU results: test_multimem_gpu.py.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

from harness.common import failures
from harness.common.paths import REPO_ROOT
from harness.emulation import build_hook, errors, multicast_layout, multimem_rewrite, multimem_scan
from harness.emulation.errors import NotAvailableInEmulation
from harness.emulation.handle import EmulatedSymmetricMemory
from harness.emulation.multicast_windows import MulticastWindows
from harness.emulation.multimem_rewrite import parse_opcode, rewrite
from harness.problems.parallelkernelbench.multicast import emulation_reason, multicast_reason
from harness.rank.candidate import classify_load_error

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "multimem"
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
FIRST_CHECKOUTS = [Path(p) for p in (os.environ.get("PKB_FIRST_CHECKOUT", ""),) if p] + \
    [REPO_ROOT / ".pkb" / "first", Path("/work/pkb/first")]
RECORDED_SETS = ("solutions_cuda_bf16_h100_8_anthropic_claude-opus-4-7",
                 "solutions_cuda_bf16_h100_8_google_gemini-3-pro-preview", "solutions_cuda_bf16_h100_8_openai_gpt-5.5")
INSTRUCTION = multimem_rewrite._INSTRUCTION_LIKE  # an opcode with its qualifiers, in C string literals


def code_only(source: str) -> str:
    """The source without comments (the rewrite names each instruction it replaced in a comment)."""
    return "".join(source[a:b] for a, b, kind in multimem_rewrite._code_spans(source) if kind != "comment")


def body(result: multimem_rewrite.RewriteResult) -> str:
    """The rewritten source after the prelude."""
    return result.source.split(multimem_rewrite.LINE_RESET + "\n", 1)[1]


# -- the opcode ---------------------------------------------------------------------------------------------
def test_opcode_reads_every_qualifier():
    op = parse_opcode("multimem.ld_reduce.acquire.gpu.global.add.acc::f32.v4.bf16x2")
    assert isinstance(op, multimem_rewrite.Opcode)
    assert (op.kind, op.sem, op.scope, op.op, op.acc_f32, op.vec, op.type) == \
        ("ld_reduce", "acquire", "gpu", "add", True, 4, "bf16x2")
    st = parse_opcode("multimem.st.release.sys.v8.bf16")
    assert isinstance(st, multimem_rewrite.Opcode) and (st.words, st.word_type, st.word_bits) == (4, "bf16x2", 32)
    red = parse_opcode("multimem.red.add.u64")
    assert isinstance(red, multimem_rewrite.Opcode) and (red.sem, red.scope, red.word_bits) == ("", "", 64)


@pytest.mark.parametrize("spelling", ["multimem.ld_reduce.relaxed.sys.global.add.v4.e4m3x4",
                                      "multimem.ld_reduce.relaxed.sys.global.v4.bf16x2",
                                      "multimem.st.relaxed.sys.global.L2::cache_hint.f32",
                                      "multimem.cp.async.bulk.global.shared::cta", "multimem.f32"])
def test_opcode_refuses_forms_it_does_not_emulate(spelling):
    assert isinstance(parse_opcode(spelling), str)


def test_validity_follows_the_ptx_isa():
    def invalid(spelling: str) -> str:
        op = parse_opcode(spelling)
        assert isinstance(op, multimem_rewrite.Opcode)
        return op.invalid()

    assert invalid("multimem.ld_reduce.relaxed.sys.global.add.v4.bf16x2") == ""
    assert invalid("multimem.st.relaxed.sys.global.v4.f32") == ""
    assert invalid("multimem.ld_reduce.relaxed.sys.global.max.f32")  # PKB's 74 (Opus) writes this one
    assert invalid("multimem.ld_reduce.relaxed.sys.global.add.v8.f32")
    assert invalid("multimem.red.relaxed.sys.global.min.bf16x2")  # .v2 and wider only
    assert invalid("multimem.ld_reduce.relaxed.sys.global.max.acc::f32.v4.bf16x2")


PTXAS = shutil.which("ptxas") or (str(Path(NVCC).resolve().parent / "ptxas") if NVCC else None)


@pytest.mark.slow
@pytest.mark.skipif(PTXAS is None or not Path(PTXAS).exists(), reason="ptxas is not installed")
def test_validity_table_agrees_with_ptxas(tmp_path):
    """Every kind x op x vector x type: the table says valid exactly where ptxas (sm_90a) accepts it."""
    regs = {"b32": "r", "u32": "r", "s32": "r", "f32": "f", "f16x2": "r", "bf16x2": "r", "b64": "rd", "u64": "rd",
            "s64": "rd", "f64": "fd", "f16": "h", "bf16": "h"}
    lines, expected = [], []
    combos = [(k, o) for k in ("ld_reduce", "red") for o in multimem_rewrite.OPS] + [("st", "")]
    for kind, op in combos:
        for vec in (1, 2, 4, 8):
            for t in multimem_rewrite.TYPES:
                width = f".v{vec}" if vec > 1 else ""
                spelling = f"multimem.{kind}.relaxed.sys.global{'.' + op if op else ''}{width}.{t}"
                group = ", ".join(f"%{regs[t]}{i + 1}" for i in range(vec))
                group = f"{{{group}}}" if vec > 1 else group
                text = f"{spelling} {group}, [%rd0];" if kind == "ld_reduce" else f"{spelling} [%rd0], {group};"
                parsed = parse_opcode(spelling)
                assert isinstance(parsed, multimem_rewrite.Opcode)
                lines.append(text)
                expected.append(parsed.invalid() == "")
    actual = []
    for i, text in enumerate(lines):
        ptx = tmp_path / f"k{i}.ptx"
        ptx.write_text(".version 8.8\n.target sm_90a\n.address_size 64\n.visible .entry k(.param .u64 p) {\n"
                       ".reg .b32 %r<10>; .reg .f32 %f<10>; .reg .b64 %rd<10>; .reg .f64 %fd<10>; .reg .b16 %h<10>;\n"
                       f"ld.param.u64 %rd0, [p];\n{text}\nret;\n}}\n")
        assert PTXAS is not None
        done = subprocess.run([PTXAS, "-arch=sm_90a", str(ptx), "-o", os.devnull], capture_output=True, check=False)
        actual.append(done.returncode == 0)
    assert [t for t, e, a in zip(lines, expected, actual) if e != a] == []


# -- the rewrite --------------------------------------------------------------------------------------------
SOURCE = r'''
__device__ void f(unsigned long long mc, unsigned int* out, float x) {
    unsigned int a, b, c, d; float s;
    asm volatile("multimem.ld_reduce.acquire.sys.global.add.v4.bf16x2 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(mc) : "memory");
    asm volatile("multimem.st.release.sys.global.v4.f32 [%0+16], {%1,%2,%3,%4};" :: "l"(mc), "r"(a), "r"(b),
                 "r"(c), "r"(d) : "memory");
    asm volatile("multimem.red.release.gpu.global.add.u32 [%0], %1;" :: "l"(mc), "r"(a) : "memory");
    asm volatile("multimem.ld_reduce.global.add.f32 %0, [%1];" : "=f"(s) : "l"(mc) : "memory");
    asm volatile("multimem.red.relaxed.sys.global.max.v2.bf16x2 [%0], {%1, %2};" :: "l"(mc), "r"(a), "r"(b));
    asm volatile("mov.u32 %0, %1;" : "=r"(a) : "r"(b));
    out[0] = a + (unsigned int)s;
}
'''


def test_each_instruction_becomes_per_rank_accesses_with_its_ordering():
    result = rewrite(SOURCE)
    assert result.complete and not result.invalid
    assert sum(result.rewritten.values()) == 5
    code = code_only(body(result))
    assert "multimem." not in code
    assert 'ld.acquire.sys.global.v4.b32 {%0, %1, %2, %3}, [%4];' in code  # ld_reduce.acquire -> ld.acquire
    assert "::pkb_mc::add_bf16x2(" in code
    assert 'st.release.sys.global.v4.b32 [%0], {%1, %2, %3, %4};' in code  # st.release -> st.release
    assert "(unsigned long long)(mc) + 16" in code  # [%0+16]
    assert 'red.release.gpu.global.add.u32 [%0], %1;' in code  # red -> red, ordering kept
    assert 'ld.global.b32 %0, [%1];' in code and "__uint_as_float(pkb_mc_acc[0])" in code  # weak; "=f"
    assert "atom.relaxed.sys.global.cas.b32" in code and "::pkb_mc::max_bf16x2(" in code  # no PTX red: CAS loop
    assert 'asm volatile("mov.u32 %0, %1;" : "=r"(a) : "r"(b));' in code  # other asm untouched
    # Every rank, rank order: the loop runs over the window's world, each at its own base.
    assert code.count("for (unsigned int pkb_mc_r = 0; pkb_mc_r < pkb_mc_w.world; ++pkb_mc_r)") == 5


def test_the_rewrite_keeps_line_numbers_and_macros():
    source = ('#define MC_LD(v, p) \\\n    asm volatile("multimem.ld_reduce.relaxed.sys.global.add.f32 %0, [%1];" \\\n'
              '                 : "=f"(v) : "l"(p) : "memory")\n__device__ float g(unsigned long long p) {\n'
              '    float v;\n    MC_LD(v, p);\n    return v;\n}\n')
    result = rewrite(source)
    assert result.complete and sum(result.rewritten.values()) == 1
    out = body(result)
    assert out.count("\n") == source.count("\n")
    lines = out.splitlines()
    assert lines[0] == "#define MC_LD(v, p) \\"  # the macro stays one logical line: its continuations are kept
    assert lines[1].startswith("    do { /* pkb-emulated multimem.ld_reduce") and lines[1].endswith("\\")
    assert lines[3:] == source.splitlines()[3:]


def test_comments_prose_and_helper_names_are_left_alone():
    source = ('// multimem.ld_reduce.relaxed.sys.global.add.v4.bf16x2 does the sum in the switch\n'
              '/* multimem.st [%0], {..} broadcasts */\n'
              '__device__ void multimem_ld_reduce_bf16x4(const void* p);\n'
              'const char* doc = "uses Hopper multimem.ld_reduce";\n')  # prose: no qualifiers
    result = rewrite(source)
    assert result.complete and not result.changed and result.source == source


@pytest.mark.parametrize("source, construct, why", [
    ('#define LD "multimem.ld_reduce.relaxed.sys.global.add.f32 "\n'
     '__device__ void f(float& v, void* p) { asm volatile(LD "%0, [%1];" : "=f"(v) : "l"(p)); }',
     "multimem.ld_reduce.relaxed.sys.global.add.f32", "a macro"),
    ('__device__ void f(float& v, void* p) { asm volatile("multimem.ld_reduce.relaxed.sys.global.add.f32 %0, [%1];\\n'
     '\\tmov.b32 %0, %0;" : "=f"(v) : "l"(p)); }', "multimem", "other instructions"),
    ('__device__ void f(float& v, void* p) { asm volatile("@p multimem.st.relaxed.sys.global.f32 [%0], %1;" '
     ':: "l"(p), "f"(v)); }', "@p", "predicated"),
    ('__device__ void f(float& v, void* p) { asm volatile("multimem.st.relaxed.sys.global.f32 [%0], 0f3F800000;" '
     ':: "l"(p)); }', "multimem.st", "0f3F800000"),
    ('__device__ void f(float& v, void* p) { cuda::ptx::multimem_ld_reduce(cuda::ptx::sem_relaxed, v, p); }',
     "ptx::multimem_ld_reduce", "library call"),
    ('const char* kPtx = "multimem.ld_reduce.relaxed.sys.global.add.f32 %f1, [%rd1];";',
     "multimem.ld_reduce.relaxed.sys.global.add.f32", "outside an asm statement"),
    ('printf("multimem.st.release.sys.global.f32 failed\\n");', "multimem.st.release.sys.global.f32",
     "outside an asm statement"),  # an opcode with qualifiers in any string: conservative
    ('void g() { cuMulticastCreate(&h, &prop); }', "cuMulticastCreate", "multicast objects"),
])
def test_what_cannot_be_rewritten_is_named(source, construct, why):
    result = rewrite(source)
    assert not result.complete
    assert any(construct in u.construct and why in u.why for u in result.unrewritable), result.unrewritable
    assert all(u.line == 1 or u.line == 2 for u in result.unrewritable)


def test_an_invalid_instruction_stays_a_build_error():
    result = rewrite('__device__ void f(unsigned& v, void* p) { asm volatile('
                     '"multimem.ld_reduce.relaxed.sys.global.max.f32 %0, [%1];" : "=r"(v) : "l"(p)); }')
    assert result.complete and result.invalid and not result.rewritten
    assert 'static_assert(sizeof(int) == 0, "multimem.ld_reduce.relaxed.sys.global.max.f32: ' in result.source


def test_registers_that_cannot_hold_the_elements_stay_a_build_error():
    result = rewrite('__device__ void f(unsigned& v, void* p) { asm volatile('
                     '"multimem.ld_reduce.relaxed.sys.global.add.u64\t%0, [%1];" : "=r"(v) : "l"(p)); }')
    assert result.invalid == ["multimem.ld_reduce.relaxed.sys.global.add.u64: operand constraint '=r' does not "
                              "fit .u64"]


def test_the_prelude_is_generated_from_the_layout():
    text = multimem_rewrite.prelude()
    for value in (multicast_layout.MAGIC, multicast_layout.MAX_WINDOWS, multicast_layout.HEADER_WORDS,
                  multicast_layout.WINDOW_WORDS):
        assert str(value) in text
    assert f'extern "C" __attribute__((visibility("default"))) int {multimem_rewrite.BIND_SYMBOL}(' in text
    assert text.rstrip().endswith(multimem_rewrite.LINE_RESET)


# -- the fixtures -------------------------------------------------------------------------------------------
FIXTURE_COUNTS = {
    "all_reduce_v4.cu": {"multimem.ld_reduce.relaxed.sys.global.add.v4.bf16x2": 1,
                         "multimem.st.relaxed.sys.global.v4.f32": 1},
    "all_reduce_scalar.cu": {"multimem.ld_reduce.acquire.sys.global.add.bf16x2": 1,
                             "multimem.st.release.sys.global.bf16x2": 1},
    "all_reduce_half_bug.cu": {"multimem.ld_reduce.relaxed.sys.global.add.v4.bf16x2": 1,
                               "multimem.st.relaxed.sys.global.v4.f32": 1},
    "reduce_scatter_v4.cu": {"multimem.ld_reduce.relaxed.sys.global.add.v4.bf16x2": 1},
    "reduce_scatter_scalar.cu": {"multimem.ld_reduce.relaxed.sys.global.add.acc::f32.bf16x2": 1},
}
_GENERATED = re.compile(r"do \{ /\* pkb-emulated (\S+) \*/.*?\} while \(0\)")


def outside_asm(source: str) -> str:
    """The source with every asm statement replaced by a marker: what the rewrite must leave as it was."""
    pieces, at = [], 0
    for start, end, kind in multimem_rewrite._code_spans(source):
        if kind != "code":
            continue
        for m in multimem_rewrite._ASM.finditer(source, max(start, at), end):
            close = multimem_rewrite._matching_paren(source, m.end() - 1)
            pieces += [source[at:m.start()], "<asm>" + multimem_rewrite._line_breaks(source[m.start():close + 1])]
            at = close + 1
    return "".join(pieces) + source[at:]


@pytest.mark.parametrize("name", sorted(FIXTURE_COUNTS))
def test_fixture_rewrite_is_a_faithful_mapping(name):
    original = (FIXTURES / name).read_text()
    result = rewrite(original)
    assert result.complete and dict(result.rewritten) == FIXTURE_COUNTS[name]
    rewritten = body(result)
    # Everything but the asm statements is untouched, line for line; each statement became its emulation.
    assert _GENERATED.sub("<asm>", rewritten) == outside_asm(original)
    assert rewritten.count("\n") == original.count("\n")
    assert "multimem." not in code_only(rewritten)


def test_the_buggy_fixture_stays_buggy():
    good, bad = (body(rewrite((FIXTURES / n).read_text())) for n in ("all_reduce_v4.cu", "all_reduce_half_bug.cu"))
    assert "(n16 + 2 * world - 1) / (2 * world)" in bad  # the bug survives the rewrite
    # Both emulate the same two instructions with the same code: only what the kernels do around them differs.
    assert _GENERATED.findall(good) == _GENERATED.findall(bad)
    assert [m.group(0) for m in _GENERATED.finditer(good)] == [m.group(0) for m in _GENERATED.finditer(bad)]


def nvcc_cubin(source: str, tmp_path: Path, name: str) -> subprocess.CompletedProcess[str]:
    cu = tmp_path / f"{name}.cu"
    cu.write_text(source)
    assert NVCC is not None
    return subprocess.run([NVCC, "-arch=sm_90a", "-cubin", "-o", str(tmp_path / f"{name}.cubin"), str(cu)],
                          capture_output=True, text=True, check=False, timeout=300)


@needs_nvcc
@pytest.mark.parametrize("name", sorted(FIXTURE_COUNTS))
def test_fixtures_compile_after_the_rewrite(name, tmp_path):
    original = (FIXTURES / name).read_text()
    assert nvcc_cubin(original, tmp_path, "original").returncode == 0  # the fixture is valid multimem code
    built = nvcc_cubin(rewrite(original).source, tmp_path, "rewritten")
    assert built.returncode == 0, built.stderr[-2000:]


@needs_nvcc
def test_an_invalid_instruction_fails_the_build_as_the_original_does(tmp_path):
    source = ('__global__ void k(unsigned* v, unsigned long long p) { asm volatile('
              '"multimem.ld_reduce.relaxed.sys.global.max.f32 %0, [%1];" : "=r"(*v) : "l"(p)); }\n')
    original = nvcc_cubin(source, tmp_path, "original")
    rewritten = nvcc_cubin(rewrite(source).source, tmp_path, "rewritten")
    assert original.returncode != 0 and rewritten.returncode != 0
    assert ".max with .f32 is not a valid PTX instruction" in rewritten.stdout + rewritten.stderr


@needs_nvcc
def test_a_build_error_after_the_rewrite_names_the_candidates_line_and_never_shows_the_preludes_text(tmp_path):
    """Gemini 3 Pro's 4_reduce on the H100 (2026-12-07): its missing include was reported at its own line 9, with
    line 9 of the rewritten file (the prelude's) printed under it. The model reads that message."""
    source = ('#include <cuda_runtime.h>\n'
              '__global__ void k(float* v, unsigned long long p) { asm volatile('
              '"multimem.ld_reduce.relaxed.sys.global.add.f32 %0, [%1];" : "=f"(*v) : "l"(p) : "memory"); }\n'
              '#include <pkb/no_such_header.h>\n')
    built = nvcc_cubin(rewrite(source).source, tmp_path, "rewritten")
    said = built.stdout + built.stderr
    assert built.returncode != 0 and "pkb/no_such_header.h" in said
    assert "before the multimem rewrite" in said and ":3:" in said  # the candidate's line 3, under the reset name
    prelude_lines = {line.strip() for line in multimem_rewrite.prelude().splitlines() if len(line.strip()) > 8}
    assert not any(line.strip() in prelude_lines for line in said.splitlines())


# -- layout, windows and the handle -------------------------------------------------------------------------
def test_window_layout_and_unicast_addresses():
    w = multicast_layout.Window(base=0x7F0000000000, size=4096, rank_bases=(0x1000000, 0x2000000, 0x3000000))
    assert w.unicast(2, 0x7F0000000010) == 0x3000010
    with pytest.raises(ValueError):
        w.unicast(0, 0x7F0000001000)  # one past the end
    words = multicast_layout.table_words([w])
    assert len(words) == multicast_layout.TABLE_WORDS
    assert words[:2] == [multicast_layout.MAGIC, 1]
    at = multicast_layout.HEADER_WORDS
    assert words[at:at + 6] == [0x7F0000000000, 4096, 3, 0x1000000, 0x2000000, 0x3000000]
    assert multicast_layout.reserved_bytes(1) == multicast_layout.GRANULE
    assert multicast_layout.reserved_bytes(multicast_layout.GRANULE + 1) == 2 * multicast_layout.GRANULE
    assert multicast_layout.find([w], 0x7F0000000FF0, 16) is w
    assert multicast_layout.find([w], 0x7F0000000FF8, 16) is None


def cpu_handle(windows: MulticastWindows | None, rank: int = 1,
               buffer_ptrs=(0x10000, 0x20000)) -> EmulatedSymmetricMemory:
    return EmulatedSymmetricMemory(rank=rank, world_size=len(buffer_ptrs), device=torch.device("cpu"), group_name="0",
                                   buffer_ptrs=list(buffer_ptrs), signal_pad_ptrs=[1, 2], buffer_size=8192,
                                   signal_pad_size=2048, multicast=None if windows is None else windows.base_for)


def test_multicast_ptr_is_a_reserved_window_with_every_rank_behind_it():
    reserved: list[tuple[int, int]] = []

    def reserve(nbytes: int, ordinal: int) -> int:
        reserved.append((nbytes, ordinal))
        return 0x7E0000000000 + len(reserved) * 0x40000000

    windows = MulticastWindows(reserve=reserve)
    handle = cpu_handle(windows)
    base = handle.multicast_ptr
    assert base == 0x7E0040000000 and handle.multicast_ptr == base  # one window per handle
    assert reserved == [(multicast_layout.GRANULE, -1)]
    other = cpu_handle(windows, buffer_ptrs=(0x50000, 0x60000))
    assert other.multicast_ptr != base and len(reserved) == 2
    table = windows.table(torch.device("cpu")).tolist()
    assert table == multicast_layout.table_words(windows.windows)
    assert windows.windows[0] == multicast_layout.Window(base, 8192, (0x10000, 0x20000))


def test_a_handle_without_windows_still_refuses_multicast():
    with pytest.raises(NotAvailableInEmulation) as info:
        _ = cpu_handle(None).multicast_ptr
    assert info.value.kind == "multicast"


# -- the build hook -----------------------------------------------------------------------------------------
@pytest.fixture
def hooked(monkeypatch):
    """The build hook, uninstalled after the test. It asks for monkeypatch so that the test's own patches of torch
    are undone after the hook's: uninstall() puts back what install() found, which may be a test's stand-in,
    and only monkeypatch's later undo then leaves torch's own functions for the next test in this process."""
    yield build_hook
    build_hook.uninstall()


MULTIMEM_CU = (FIXTURES / "all_reduce_v4.cu").read_text() if (FIXTURES / "all_reduce_v4.cu").exists() else ""
UNREWRITABLE_CU = ('__device__ void f(float& v, void* p) { asm volatile("multimem.ld_reduce.relaxed.sys.global.add.f32'
                   ' %0, [%1];\\n\\tmov.b32 %0, %0;" : "=f"(v) : "l"(p)); }\n')


def test_the_hook_rewrites_what_load_inline_writes(hooked, tmp_path):
    from torch.utils import cpp_extension

    hooked.install(strict=True)
    cu, cpp = tmp_path / "cuda.cu", tmp_path / "main.cpp"
    cpp_extension._maybe_write(str(cpp), "// multimem in a C++ file is left alone\n")
    cpp_extension._maybe_write(str(cu), MULTIMEM_CU)
    assert cpp.read_text() == "// multimem in a C++ file is left alone\n"
    assert cu.read_text() == rewrite(MULTIMEM_CU).source
    plain = tmp_path / "plain" / "cuda.cu"
    plain.parent.mkdir()
    cpp_extension._maybe_write(str(plain), "__global__ void k() {}\n")
    assert plain.read_text() == "__global__ void k() {}\n"


def test_load_inline_under_any_name_writes_the_rewritten_source(hooked, tmp_path, monkeypatch):
    """Through torch's own load_inline, bound before the hook was installed (as PKB's helper binds it)."""
    from torch.utils import cpp_extension
    from torch.utils.cpp_extension import load_inline as bound_early

    built: list[list[str]] = []
    def jit_compile(name, sources, *a, **k):
        built.append(sources)
        return "ext"

    monkeypatch.setattr(cpp_extension, "_jit_compile", jit_compile)
    hooked.install(strict=True)
    assert bound_early(name="t", cpp_sources="", cuda_sources=MULTIMEM_CU, build_directory=str(tmp_path)) == "ext"
    written = (tmp_path / "cuda.cu").read_text()
    assert written.startswith(multimem_rewrite.PRELUDE_MARK) and "#include <torch/types.h>" in written
    assert "multimem." not in code_only(written.split(multimem_rewrite.LINE_RESET + "\n", 1)[1])
    assert built == [[str(tmp_path / "main.cpp"), str(tmp_path / "cuda.cu")]]


def test_the_rank_hook_refuses_what_it_cannot_rewrite_as_infra(hooked, tmp_path):
    from torch.utils import cpp_extension

    hooked.install(strict=True)
    with pytest.raises(NotAvailableInEmulation) as info:
        cpp_extension._maybe_write(str(tmp_path / "cuda.cu"), UNREWRITABLE_CU)
    assert not (tmp_path / "cuda.cu").exists()
    refusal = errors.parse_refusal(str(info.value))
    assert refusal is not None and refusal.kind == "multicast" and "other instructions" in refusal.why
    assert errors.refusal_is_plausible(refusal, UNREWRITABLE_CU)
    # Read by the rank as a runtime failure (then infra_error), never as the candidate's compile error.
    assert classify_load_error(info.value) == failures.RUNTIME_ERROR


def test_the_precompile_hook_writes_unrewritable_sources_as_they_are(hooked, tmp_path):
    from torch.utils import cpp_extension

    hooked.rewrite_builds_of("no multicast here")
    assert cpp_extension._maybe_write is hooked._saved.get("_maybe_write", cpp_extension._maybe_write)
    hooked.rewrite_builds_of(UNREWRITABLE_CU)
    cpp_extension._maybe_write(str(tmp_path / "cuda.cu"), UNREWRITABLE_CU)
    assert (tmp_path / "cuda.cu").read_text() == UNREWRITABLE_CU
    assert cpp_extension._import_module_from_library is hooked._saved["_import_module_from_library"]


def test_a_rewritten_library_is_scanned_before_it_loads_and_bound_after(hooked, tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    loaded: list[str] = []
    bound: list[str] = []

    def import_module(name, path, is_python_module):
        loaded.append(name)
        return "module"

    monkeypatch.setattr(cpp_extension, "_import_module_from_library", import_module)
    hooked.install(strict=True, bind=bound.append)
    cpp_extension._maybe_write(str(tmp_path / "cuda.cu"), MULTIMEM_CU)
    library = str(tmp_path / f"ext{cpp_extension.LIB_EXT}")
    monkeypatch.setattr(multimem_scan, "scan", lambda path: multimem_scan.ScanResult(
        path, findings=["sass: LDGMC.E.ADD.BF16x8.RN.STRONG.SYS R8, [R2.64+URZ]"], views=["sass"]))
    with pytest.raises(NotAvailableInEmulation, match="LDGMC"):
        cpp_extension._import_module_from_library("ext", str(tmp_path), True)
    assert loaded == [] and bound == []
    monkeypatch.setattr(multimem_scan, "scan",
                        lambda path: multimem_scan.ScanResult(path, views=["sass", "ptx"]))
    assert cpp_extension._import_module_from_library("ext", str(tmp_path), True) == "module"
    assert loaded == ["ext"] and bound == [library]
    other = tmp_path / "other"
    other.mkdir()
    cpp_extension._import_module_from_library("plain", str(other), True)  # not rewritten: neither scanned nor bound
    assert loaded == ["ext", "plain"] and bound == [library]


# -- the gate for candidates --------------------------------------------------------------------------------
def candidate_with(kernel: str, extra: str = "") -> str:
    template = (FIXTURES / "candidate_all_reduce.py").read_text()
    return template.replace('KERNEL = ""', f'KERNEL = r"""{kernel}"""') + extra


def test_the_gate_lets_rewritable_multicast_run_under_emulation():
    assert emulation_reason("def solution(x):\n    return x\n") is None
    for name in FIXTURE_COUNTS:
        source = candidate_with((FIXTURES / name).read_text())
        assert multicast_reason(source) is not None  # the blanket rule still skips it on real GPUs
        assert emulation_reason(source) is None, name


@pytest.mark.parametrize("extra, named", [
    ("\nimport cupy\n", "runtime compiler"),
    ("\nh = cuda.cuMulticastCreate(prop)\n", "cuMulticastCreate"),
    ("\nos.environ['NCCL_NVLS_ENABLE'] = '1'\n", "NVLS"),
])
def test_the_gate_names_what_the_emulation_cannot_serve(extra, named):
    reason = emulation_reason(candidate_with((FIXTURES / "all_reduce_v4.cu").read_text(), extra))
    assert reason is not None and named.lower() in reason.lower()


def test_the_gate_names_an_unrewritable_asm_statement():
    reason = emulation_reason(candidate_with(UNREWRITABLE_CU))
    assert reason is not None and "other instructions" in reason and "multimem.ld_reduce" in reason


# -- PKB's recorded sets ------------------------------------------------------------------------------------
def first_checkout() -> Path | None:
    return next((p for p in FIRST_CHECKOUTS if all((p / s).is_dir() for s in RECORDED_SETS)), None)


def recorded_multicast_files() -> list[Path]:
    root = first_checkout()
    if root is None:
        pytest.skip("PKB's first commit is not unpacked (set PKB_FIRST_CHECKOUT)")
    return sorted(p for s in RECORDED_SETS for p in (root / s).glob("*.py") if multicast_reason(p))


def test_every_recorded_multimem_instruction_is_rewritten_or_named():
    files = recorded_multicast_files()
    assert len(files) == 45
    spellings = set((FIXTURES / "pkb_spellings.txt").read_text().split())
    seen: Counter[str] = Counter()
    handled: Counter[str] = Counter()
    fully = 0
    for path in files:
        strings = [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
                   and isinstance(n.value, str) and "multimem" in n.value]
        complete = True
        for text in strings:
            instructions = Counter(m.group(0) for a, b, kind in multimem_rewrite._code_spans(text) if kind == "string"
                                   for m in INSTRUCTION.finditer(text, a, b))
            seen += instructions
            result = rewrite(text)
            named = Counter(u.construct.split()[0] for u in result.unrewritable if u.construct.startswith("multimem."))
            invalid = Counter(i.split(":")[0] for i in result.invalid)
            assert result.rewritten + invalid + named == instructions, path.name
            handled += result.rewritten + invalid
            complete = complete and result.complete
            left = re.sub(r'static_assert\(sizeof\(int\) == 0, "[^"]*"\)', "", code_only(body(result))) \
                if result.changed else ""
            assert not INSTRUCTION.search(left), path.name  # a build error's message may name one, nothing else
        fully += complete
        assert (emulation_reason(path) is None) == complete, path.name
    assert set(seen) == spellings  # the distinct spellings, stored as test data
    assert handled == seen and sum(seen.values()) == 88
    assert fully == 45
