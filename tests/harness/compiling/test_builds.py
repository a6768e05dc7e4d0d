"""harness.compiling.builds and harness.compiling.precompile: builds a candidate makes on its first call are found and
made ahead."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from harness.common.hostile_files import Folder, copy_tree_out
from harness.common.paths import REPO_ROOT
from harness.compiling import builds
from harness.compiling.compile import parse_report
from harness.problems.parallelkernelbench import checkout
from harness.problems.problem import import_file, module_name_for
from harness.rank import prebuilt
from tests.conftest import TESTS

ODD = TESTS / "fixtures" / "pkb_checkout_oddities"
LAZY = ODD / "solutions_cuda_bf16_cpu_scripted_oldnumbers" / "1_all_reduce_cuda.py"
REPO = REPO_ROOT


def imported(path: Path) -> types.ModuleType:
    checkout.ensure_importable(ODD.resolve())
    return import_file(path, module_name_for(path, "test_builds"))


def test_a_lazy_build_through_the_checkouts_helper_is_found_with_its_arguments():
    module = imported(LAZY)
    found = builds.find_builds(module, LAZY.read_text())
    assert found.undiscovered == [] and len(found.calls) == 1
    (call,) = found.calls
    assert (call.kind, call.function, call.line, call.name) == (
        "utils.cuda_helpers.compile_host_extension", "_get_ext", 18, "pkb_fixture_scaled_copy")
    assert call.args == ["pkb_fixture_scaled_copy", module.CPP_SRC, ["scaled_copy"]] and not call.needs_cuda
    assert builds.may_build(LAZY.read_text())  # it names no builder: the import of a checkout helper says so


def test_what_cannot_be_built_ahead_says_why(tmp_path: Path):
    source = '''
import torch
import torch.distributed as dist
from torch.utils.cpp_extension import load_inline
from utils.cuda_helpers import compile_cuda_extension

SRC = "torch::Tensor f(torch::Tensor x) { return x; }"
CUDA_SRC = "__global__ void k() {}"


def per_rank():
    r = dist.get_rank()
    return load_inline(f"ext_r{r}", cpp_sources=SRC, functions=["f"])


def computed():
    return load_inline("ext_c", cpp_sources=make_source(), functions=["f"])


def cuda_helper():
    return compile_cuda_extension("ext_cuda", CUDA_SRC)


def local_import():
    from torch.utils.cpp_extension import load_inline as build
    return build(name="ext_local", cpp_sources=[SRC, SRC], functions=["f"], extra_cflags=["-O1"])


def nvrtc_path(prog):
    from cuda.bindings import nvrtc
    return nvrtc.nvrtcCompileProgram(prog, 0, [])


class Holder:
    def method(self):
        return load_inline(name="ext_method", cpp_sources=SRC, functions=["f"])


def make_source():
    return SRC


def solution(x):
    return x
'''
    path = tmp_path / "candidate.py"
    path.write_text(source)
    module = imported(path)
    found = builds.find_builds(module, source)
    made = {c.function: c for c in found.calls}
    assert set(made) == {"cuda_helper", "local_import", "Holder.method"}
    assert made["cuda_helper"].needs_cuda and made["cuda_helper"].kind == "utils.cuda_helpers.compile_cuda_extension"
    assert made["local_import"].kwargs["cpp_sources"] == [module.SRC, module.SRC]
    assert made["local_import"].name == "ext_local" and not made["local_import"].needs_cuda
    missed = {u.function: u.reason for u in found.undiscovered}
    assert missed == {"per_rank": "its argument 'r' is not a module-level name",
                      "computed": "its argument calls make_source()",
                      "nvrtc_path": "NVRTC compiles into the calling process at run time: nothing persists to build"}


def test_a_build_is_made_once_exactly_as_the_first_call_would(monkeypatch):
    """trigger calls the builder with the evaluated arguments; the same call in two places is made once."""
    module = imported(LAZY)
    source = LAZY.read_text() + ("\n\ndef again():\n    return compile_host_extension("
                                 "'pkb_fixture_scaled_copy', CPP_SRC, ['scaled_copy'])\n")
    found = builds.find_builds(module, source)
    assert [c.function for c in found.calls] == ["_get_ext", "again"]
    seen: list[tuple] = []
    call = found.calls[0]
    call.builder = lambda *args, **kwargs: seen.append((args, kwargs))
    outcome = builds.trigger(call)
    assert outcome.ok is True and seen == [(("pkb_fixture_scaled_copy", module.CPP_SRC, ["scaled_copy"]), {})]
    made: list[str] = []

    def trigger(c: builds.BuildCall) -> builds.BuildOutcome:
        made.append(c.function)
        return outcome

    monkeypatch.setattr(builds, "trigger", trigger)
    outcomes, missed = builds.build_ahead(module, source)
    assert made == ["_get_ext"] and missed == [] and outcomes[0].as_dict()["name"] == "pkb_fixture_scaled_copy"


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks the CPU-build path")
def test_cuda_builds_are_skipped_where_torch_has_no_cuda(tmp_path: Path):
    path = tmp_path / "cuda_candidate.py"
    path.write_text("from utils.cuda_helpers import compile_cuda_extension\nSRC = '__global__ void k() {}'\n\n"
                    "def solution(x):\n    return compile_cuda_extension('ext_cuda_skip', SRC).run(x)\n")
    (outcome,), _ = builds.build_ahead(imported(path), path.read_text())
    assert outcome.ok is None and "CPU build" in outcome.skipped and outcome.as_dict()["seconds"] == 0.0


def _precompile(candidate: Path, extensions: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "harness.compiling.precompile", str(candidate), "--problem",
                           f"pkb:{ODD.resolve()}::1_all_reduce.py"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_precompile_builds_the_lazy_extension_into_the_cache_the_first_call_hits(tmp_path: Path):
    """A real C++ build (about 20 s on 2 cores); the candidate's own first call afterwards compiles nothing.
    The precompile builds split (harness.compiling.split_build: no ninja, so no .ninja_log); the first call
    installs the rank's check (harness.rank.prebuilt, as harness.rank.candidate_side.load does) and finds the
    split build's stamp: torch's runner never runs."""
    extensions = tmp_path / "ext"
    proc = _precompile(LAZY, extensions)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = parse_report(proc.stdout)
    assert report is not None and report["status"] == "ok"
    (build,) = report["builds"]
    assert build["ok"] is True and build["name"] == "pkb_fixture_scaled_copy" and build["seconds"] > 0
    # The split build's own account, joined to its build: no object cache here, so the binding unit compiled.
    assert build["binding_cache"] == "miss" and build["extension"] == "pkb_fixture_scaled_copy"
    assert "main.o" in build["split_seconds"]
    assert report["undiscovered"] == 0 and report["import"] == "ok"
    assert "built pkb_fixture_scaled_copy" in proc.stdout
    folder = extensions / "pkb_fixture_scaled_copy"
    library = folder / "pkb_fixture_scaled_copy.so"
    assert (folder / prebuilt.STAMP).is_file() and not (folder / ".ninja_log").exists()
    stamp = library.stat().st_mtime_ns
    first_call = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
                  "from harness.problems.parallelkernelbench import checkout; "
                  "from harness.problems.problem import import_file\n"
                  "from harness.rank import prebuilt; prebuilt.install()\n"
                  f"checkout.ensure_importable(__import__('pathlib').Path({str(ODD.resolve())!r}))\n"
                  f"m = import_file(__import__('pathlib').Path({str(LAZY)!r}), 'lazy')\n"
                  "import torch; print(m._get_ext().scaled_copy(torch.ones(2), 3.0).tolist())\n")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)}
    run = subprocess.run([sys.executable, "-c", first_call], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "[3.0, 3.0]", run.stderr
    assert library.stat().st_mtime_ns == stamp  # loaded from the cache, not rebuilt
    assert not (folder / ".ninja_log").exists()  # torch's runner never ran
    # The ranks load a copy of the cache entry (compile.private_copy) at the same path: the stamp hashes
    # contents, not times, so the copy is complete too and the call builds nothing.
    aside = tmp_path / "entry"
    extensions.rename(aside)
    with Folder.open(aside) as entry:
        copy_tree_out(entry, extensions, max_bytes=1 << 30, max_files=1000)
    stamp = library.stat().st_mtime_ns
    run = subprocess.run([sys.executable, "-c", first_call], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "[3.0, 3.0]", run.stderr
    assert library.stat().st_mtime_ns == stamp, "the copied build was rebuilt"
    assert not (folder / ".ninja_log").exists()


def test_a_lazy_build_that_fails_in_the_compiler_exits_3_with_its_lines(tmp_path: Path):
    """cpp_extension.load of a plain C++ file (no torch headers, so the compiler fails within a second)."""
    (tmp_path / "broken.cpp").write_text("int broken( { return 0; }\n")
    candidate = tmp_path / "1_all_reduce_cuda.py"
    candidate.write_text("import os\nfrom torch.utils.cpp_extension import load\n\n"
                         "SOURCE = os.path.join(os.path.dirname(__file__), 'broken.cpp')\n\n"
                         "def solution(tensor):\n    load('pkb_fixture_broken', sources=[SOURCE], "
                         "is_python_module=False)\n    return tensor\n")
    proc = _precompile(candidate, tmp_path / "ext")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "build of pkb_fixture_broken (cpp_extension.load, called in solution line 7) failed" in proc.stdout
    assert "broken.cpp" in proc.stdout and "error" in proc.stdout
    report = parse_report(proc.stdout)
    assert report is not None and report["status"] == "build_failed"
    assert report["builds"][0]["ok"] is False and "Error building extension" in report["builds"][0]["error"]
