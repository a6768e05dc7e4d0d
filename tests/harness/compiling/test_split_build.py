"""harness.compiling.split_build and harness.compiling.build_cache: the binding unit of a load_inline build
comes from a cache that hands back only what the same inputs built; only the CUDA unit is compiled again.

Most tests drive the split build with stand-in compilers (shell scripts that log each call and write their
input into the object), over a build.ninja in torch's own format: fast, and they count what was compiled.
One slow test builds a real C++ extension twice and loads it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from harness.compiling import build_cache, split_build
from harness.compiling.build_cache import MANIFEST, OBJECT, ObjectCache
from harness.rank import prebuilt

# A stand-in compiler: `--version` names it; otherwise it copies `-c IN` into `-o OUT` (prefixed by its
# flags), writes a depfile naming a header, and logs the input it compiled.
FAKE = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "fake-cc {version}"; exit 0; fi
out=""; in=""; dep=""; prev=""
for a in "$@"; do
  case "$prev" in -o) out="$a";; -c) in="$a";; -MF) dep="$a";; esac
  prev="$a"
done
echo "$in" >> "{log}"
if [ -n "$in" ]; then {{ echo "$*"; cat "$in"; }} > "$out"; else cat > /dev/null < /dev/null; echo linked > "$out"; fi
if [ -n "$dep" ]; then echo "$out: $in {header}" > "$dep"; fi
"""

NINJA = """ninja_required_version = 1.3
cxx = {cxx}
nvcc = {nvcc}

cflags = -DTORCH_EXTENSION_NAME=demo -DTORCH_API_INCLUDE_EXTENSION_H {cflags}
post_cflags = -fPIC -std=c++17
cuda_cflags = -DTORCH_EXTENSION_NAME=demo {cuda_cflags}
cuda_post_cflags = -O3
ldflags = -shared

rule compile
  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags
  depfile = $out.d
  deps = gcc

rule cuda_compile
  command = $nvcc  $cuda_cflags -c $in -o $out $cuda_post_cflags

rule link
  command = $cxx $in $ldflags -o $out

build main.o: compile {dir}/main.cpp
build cuda.cuda.o: cuda_compile {dir}/cuda.cu

build demo.so: link main.o cuda.cuda.o

default demo.so
"""


class Tools:
    """Stand-in compilers and a header, under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = root / "compiled.log"
        self.header = root / "include" / "binding.h"
        self.header.parent.mkdir(parents=True)
        self.header.write_text("// header v1\n")
        self.cxx = self._script("cxx", "1.0")
        self.nvcc = self._script("nvcc", "13.0")

    def _script(self, name: str, version: str) -> Path:
        path = self.root / "bin" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(FAKE.format(version=version, log=self.log, header=self.header))
        path.chmod(0o755)
        return path

    def compiled(self) -> list[str]:
        return [Path(line).name for line in self.log.read_text().split()] if self.log.exists() else []


def folder(root: Path, tools: Tools, *, kernel: str = "k1", binding: str = "PYBIND11_MODULE(demo, m) {}",
           cflags: str = "-O3", name: str = "build") -> Path:
    """An extension build folder as torch's load_inline leaves it before running ninja."""
    where = root / name
    where.mkdir()
    (where / "main.cpp").write_text(f"#include <torch/extension.h>\n{binding}\n")
    (where / "cuda.cu").write_text(f"__global__ void kernel() {{ int c = {kernel}; }}\n")
    (where / "build.ninja").write_text(NINJA.format(cxx=tools.cxx, nvcc=tools.nvcc, dir=where, cflags=cflags,
                                                    cuda_cflags="-gencode=arch=compute_90,code=sm_90"))
    return where


@pytest.fixture
def tools(tmp_path: Path) -> Tools:
    return Tools(tmp_path)


def test_an_edit_to_the_cuda_unit_takes_the_binding_unit_from_the_cache(tmp_path: Path, tools: Tools):
    cache = ObjectCache(tmp_path / "cache")
    first = split_build.build(folder(tmp_path, tools, name="a"), cache, writable=True)
    assert first.binding == "miss" and first.stored
    assert {"main.cpp", "cuda.cu"} <= set(tools.compiled())
    tools.log.unlink()
    edited = folder(tmp_path, tools, name="b", kernel="k2")
    second = split_build.build(edited, cache, writable=True)
    assert second.binding == "hit" and not second.stored
    assert "main.cpp" not in tools.compiled() and "cuda.cu" in tools.compiled()
    # The cached object is the binding unit's, byte for byte.
    assert (edited / "main.o").read_bytes() == (tmp_path / "a" / "main.o").read_bytes()
    assert (edited / "demo.so").read_text() == "linked\n"


def test_a_finished_build_is_not_built_again_in_the_same_folder(tmp_path: Path, tools: Tools):
    where = folder(tmp_path, tools)
    split_build.build(where, None, writable=False)
    tools.log.unlink()
    assert split_build.build(where, None, writable=False).binding == "up_to_date"
    assert tools.compiled() == []
    (where / "cuda.cu").write_text("__global__ void kernel() { int c = 3; }\n")  # edited in place: built again
    assert split_build.build(where, None, writable=False).binding == "miss"
    assert "cuda.cu" in tools.compiled()


def test_without_a_writable_cache_nothing_is_stored(tmp_path: Path, tools: Tools):
    """A build process that candidate code shares reads the cache at most: it never places an object."""
    cache = ObjectCache(tmp_path / "cache")
    report = split_build.build(folder(tmp_path, tools), cache, writable=False)
    assert report.binding == "miss" and not report.stored and not cache.root.exists()


@pytest.mark.parametrize("change", ["binding source", "flags", "compiler", "name"])
def test_the_key_changes_with_every_input(tmp_path: Path, tools: Tools, change: str):
    base = folder(tmp_path, tools, name="base")
    unit = split_build.plan(base).units[0]
    before = split_build.unit_key(unit, base, Path(unit.source).read_bytes())
    if change == "compiler":
        split_build.compiler_identity.cache_clear()
        tools.cxx.write_text(tools.cxx.read_text().replace("fake-cc 1.0", "fake-cc 1.1"))
        other = base
    else:
        other = folder(tmp_path, tools, name="other", binding="int f();" if change == "binding source" else
                       "PYBIND11_MODULE(demo, m) {}", cflags="-O2" if change == "flags" else "-O3")
        if change == "name":
            text = (other / "build.ninja").read_text().replace("TORCH_EXTENSION_NAME=demo", "TORCH_EXTENSION_NAME=x")
            (other / "build.ninja").write_text(text)
    unit = split_build.plan(other).units[0]
    after = split_build.unit_key(unit, other, Path(unit.source).read_bytes())
    split_build.compiler_identity.cache_clear()
    assert before is not None and after is not None and before != after


def test_the_same_inputs_in_another_folder_have_the_same_key(tmp_path: Path, tools: Tools):
    a, b = folder(tmp_path, tools, name="a"), folder(tmp_path, tools, name="b", kernel="k9")
    units = [(split_build.plan(f).units[0], f) for f in (a, b)]
    keys = {split_build.unit_key(u, f, Path(u.source).read_bytes()) for u, f in units}
    assert len(keys) == 1 and None not in keys


@pytest.mark.parametrize("tamper", ["object", "manifest", "no manifest", "link", "header"])
def test_a_tampered_entry_is_a_miss_and_the_unit_is_built_again(tmp_path: Path, tools: Tools, tamper: str):
    cache = ObjectCache(tmp_path / "cache")
    split_build.build(folder(tmp_path, tools, name="a"), cache, writable=True)
    (entry,) = [p for p in cache.root.iterdir() if not p.name.startswith(".")]
    if tamper == "object":
        with open(entry / OBJECT, "ab") as f:
            f.write(b"\x90")
    elif tamper == "manifest":
        manifest = json.loads((entry / MANIFEST).read_text())
        (entry / MANIFEST).write_text(json.dumps({**manifest, "sha256": "0" * 64}))
    elif tamper == "no manifest":  # as a half-written entry would be
        (entry / MANIFEST).unlink()
    elif tamper == "link":
        (entry / OBJECT).unlink()
        (entry / OBJECT).symlink_to(tmp_path / "a" / "main.o")
    else:  # a header the object was built from changed since
        tools.header.write_text("// header v2\n")
    tools.log.unlink()
    report = split_build.build(folder(tmp_path, tools, name="b"), cache, writable=True)
    assert report.binding == "miss" and "main.cpp" in tools.compiled()
    assert report.stored  # the bad entry was removed, and the fresh object replaced it
    assert cache.lookup(entry.name) is not None


def test_lookup_refuses_what_it_cannot_check(tmp_path: Path):
    cache = ObjectCache(tmp_path / "cache")
    built = tmp_path / "x.o"
    built.write_bytes(b"object")
    key = build_cache.digest(b"k")
    assert cache.lookup(key) is None  # absent
    assert cache.store(key, built, {})
    assert cache.lookup(key) is not None
    with pytest.raises(ValueError):
        cache.entry("../escape")
    (cache.root / key / MANIFEST).write_text("{not json")
    assert cache.lookup(key) is None and not (cache.root / key).exists()


def test_concurrent_stores_of_one_key_leave_one_complete_entry(tmp_path: Path):
    cache = ObjectCache(tmp_path / "cache")
    key = build_cache.digest(b"same inputs")
    objects = []
    for i in range(8):
        path = tmp_path / f"o{i}.o"
        path.write_bytes(b"the same object" * 1000)
        objects.append(path)
    results: list[bool] = []
    start = threading.Barrier(len(objects))

    def store(path: Path) -> None:
        start.wait()
        results.append(cache.store(key, path, {}))

    threads = [threading.Thread(target=store, args=(p,)) for p in objects]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
    found = cache.lookup(key)
    assert found is not None and found.read_bytes() == b"the same object" * 1000
    assert [p.name for p in cache.root.iterdir()] == [key]  # no staging folder left


def test_a_build_ninja_torch_did_not_write_falls_back_to_ninja(tmp_path: Path, tools: Tools):
    where = folder(tmp_path, tools)
    text = (where / "build.ninja").read_text().replace("$cxx $in $ldflags -o $out", "touch $out; $cxx $in")
    (where / "build.ninja").write_text(text)
    with pytest.raises(split_build.SplitUnavailable):
        split_build.plan(where)


def test_a_failing_unit_raises_with_the_compilers_output(tmp_path: Path, tools: Tools):
    where = folder(tmp_path, tools)
    tools.nvcc.write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho 'cuda.cu(1): error: nope' >&2\nexit 2\n")
    with pytest.raises(RuntimeError, match="error: nope"):
        split_build.build(where, ObjectCache(tmp_path / "cache"), writable=True)
    assert not (where / prebuilt.STAMP).exists()


def test_several_architectures_compile_with_nvcc_threads():
    one = "nvcc -gencode=arch=compute_90,code=sm_90 -c a.cu"
    two = one + " -gencode=arch=compute_80,code=sm_80"
    assert split_build._threads(one) == one
    assert split_build._threads(two).endswith(" -t 2") or os.cpu_count() == 1
    assert split_build._threads(two + " -t 4") == two + " -t 4"


def test_the_cuda_unit_compiled_is_the_one_the_multimem_rewrite_wrote(tmp_path: Path, tools: Tools,
                                                                        monkeypatch: pytest.MonkeyPatch):
    """harness.emulation.build_hook rewrites cuda.cu as torch writes it; the split build compiles what is on
    disk, after that: the CUDA object holds the rewritten source, never the multimem one."""
    from torch.utils import cpp_extension

    from harness.emulation import build_hook

    source = ('__global__ void k(float* mc, unsigned a) {\n    asm volatile('
              '"multimem.red.release.gpu.global.add.u32 [%0], %1;" :: "l"(mc), "r"(a) : "memory");\n}\n')
    written: list[str] = []
    monkeypatch.setattr(cpp_extension, "_maybe_write", lambda f, c: written.append(c))
    build_hook.install(strict=False)
    try:
        cpp_extension._maybe_write(str(tmp_path / "cuda.cu"), source)
    finally:
        build_hook.uninstall()
    (rewritten,) = written
    assert rewritten != source and "pkb_mc::window" in rewritten
    where = folder(tmp_path, tools)
    (where / "cuda.cu").write_text(rewritten)
    split_build.build(where, None, writable=False)
    assert rewritten in (where / "cuda.cuda.o").read_text()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler")
def test_a_real_extension_built_split_loads_and_behaves_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A real C++ extension (torch/extension.h: tens of seconds on 2 cores), built by torch's runner and by the
    split one in fresh folders: the same answers, and the second split build compiles no binding unit."""
    import torch
    from torch.utils import cpp_extension

    cpp = "torch::Tensor scaled(torch::Tensor x, double s) { return x * s + 1; }"

    def built(where: str, name: str) -> object:
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / where))
        cpp_extension.JIT_EXTENSION_VERSIONER.entries.clear()
        return cpp_extension.load_inline(name, cpp_sources=cpp, functions=["scaled"], verbose=False)

    reference = built("torch", "split_demo_ref")
    cache = ObjectCache(tmp_path / "cache")
    split_build.install(cache, writable=True)
    try:
        first = built("split-1", "split_demo")
        second = built("split-2", "split_demo")
    finally:
        split_build.uninstall()
    x = torch.arange(4.0)
    expected = reference.scaled(x, 3.0)  # type: ignore[attr-defined]
    assert torch.equal(first.scaled(x, 3.0), expected)  # type: ignore[attr-defined]
    assert torch.equal(second.scaled(x, 3.0), expected)  # type: ignore[attr-defined]
    reports = split_build.REPORTS[-2:]
    assert [r.binding for r in reports] == ["miss", "hit"] and reports[0].stored
    library = tmp_path / "split-2" / "split_demo" / "split_demo.so"
    assert stat.S_ISREG(library.stat().st_mode)


def test_a_candidate_whose_build_is_cached_is_marked_a_cache_hit(tmp_path: Path):
    """integrity.builds says per sample whether the compile stage built (miss) or took its cache entry (hit);
    the stored entry itself carries no mark (what the trusted side wrote stays as it was)."""
    from harness.compiling import compile as compiling

    path = tmp_path / "cand.py"
    path.write_text("from torch.utils.cpp_extension import load_inline\n\ndef solution(x):\n    return x\n")
    entry = compiling.entry_for(path.read_bytes(), None)
    entry.mkdir(parents=True)
    stored = [{"name": "ext", "kind": "load_inline", "function": "solution", "line": 3, "seconds": 41.5, "ok": True}]
    (entry / compiling.DONE).write_text(json.dumps(stored))
    outcome = compiling.compile_candidate(path, 60.0, "cpu")
    assert outcome.ok and outcome.cached and outcome.builds == [{**stored[0], "cache": "hit"}]
    assert compiling.cached_builds(entry) == stored
    assert compiling.with_cache(stored, compiling.MISS)[0]["cache"] == "miss"


def test_the_report_shows_each_problems_build_time_and_cache_hits():
    from agent.report.build import build_stage
    from agent.report.rows import _problem_cell

    class Sample:
        def __init__(self, problem: str, compile_s: float, cache: str | None) -> None:
            self.record = type("R", (), {"problem": problem})()
            builds = [{"name": "ext", "cache": cache}] if cache else []
            self.result = {"stages": {"compile": compile_s}, "integrity": {"builds": builds} if builds else {}}

    samples = [Sample("p", 90.0, "miss"), Sample("p", 0.0, "hit"), Sample("p", 12.0, "hit"), Sample("q", 1.0, None)]
    summary = build_stage(samples, "p")  # type: ignore[arg-type]
    assert summary == {"median_s": 12.0, "native": 3, "cached": 2}
    cell = _problem_cell({"verdicts": {"correct": 3}, "correct": 3, "n": 3, "pass_at_k": 1.0, "best_speedup": 1.2,
                          "build": summary}, None, 1, "cuda", None)
    assert cell.endswith("; build 12 s median, 2/3 cached")
    assert build_stage(samples, "q") == {"median_s": 1.0, "native": 0, "cached": 0}  # type: ignore[arg-type]


@pytest.mark.parametrize("torch_cuda", [None, "13.0"])
def test_torchs_own_build_ninja_is_read_whether_its_build_has_cuda_or_not(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          torch_cuda: str | None):
    """torch writes the CUDA rule with nvcc's depfile (`-MD -MF $out.d`) when its own build has CUDA and without
    it otherwise: the file its writer makes either way is planned, never left to ninja (on the GPU machine, where
    torch has CUDA, every build fell back to ninja until the second form was listed)."""
    import torch
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")  # only named in the file: nothing is run
    where = tmp_path / "ext"
    where.mkdir()
    sources = [str(where / "main.cpp"), str(where / "cuda.cu")]
    cpp_extension._write_ninja_file(
        path=str(where / "build.ninja"), cflags=["-DTORCH_EXTENSION_NAME=ext"], post_cflags=["-fPIC"],
        cuda_cflags=["-gencode=arch=compute_90,code=sm_90"], cuda_post_cflags=["-O3"], cuda_dlink_post_cflags=None,
        sycl_cflags=None, sycl_post_cflags=None, sycl_dlink_post_cflags=None, sources=sources,
        objects=["main.o", "cuda.cuda.o"], ldflags=["-shared"], library_target="ext.so", with_cuda=True,
        with_sycl=False)
    assert ("-MD -MF $out.d" in (where / "build.ninja").read_text()) == (torch_cuda is not None)
    built = split_build.plan(where)
    units = [(u.rule, Path(u.source).name) for u in built.units]
    assert units == [("compile", "main.cpp"), ("cuda_compile", "cuda.cu")]
    assert built.library == "ext.so"
