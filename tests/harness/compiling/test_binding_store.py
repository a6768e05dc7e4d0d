"""harness.compiling.binding_store and its wiring: an edited candidate rebuilds only its kernel unit, the binding
unit's object coming from a scope that only the trusted side writes (issue 48).

The real builds use a C++ extension in load_inline's layout (a CUDA extension cannot load with this CPU
torch): `main.cpp` the pybind11 binding unit, `kernel.cpp` a torch-free kernel unit, both written into
torch's build folder and built by cpp_extension.load from the candidate's solution()."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from harness.compiling import binding_store, split_build
from harness.compiling import compile as compiling
from harness.compiling.build_cache import MANIFEST, OBJECT, ObjectCache, digest
from harness.launch.sandbox import EXT_MOUNT, probe
from harness.launch.sandbox.mounts import plan
from harness.rank import prebuilt

CANDIDATE = '''"""A split-layout candidate: the binding unit is pybind11 only, the kernel unit plain C++."""
import os

from torch.utils import cpp_extension

NAME = "pkb_fixture_split_edit"
BINDING = ('#include <pybind11/pybind11.h>\\n'
           'float kernel_scale();\\n'
           'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("scale", &kernel_scale); }}\\n')
KERNEL = 'float kernel_scale() {{ return {scale}f; }}\\n'
FOLDER = cpp_extension._get_build_directory(NAME, False)
SOURCES = [os.path.join(FOLDER, "main.cpp"), os.path.join(FOLDER, "kernel.cpp")]
for _path, _text in zip(SOURCES, (BINDING, KERNEL)):
    with open(_path, "w") as _f:
        _f.write(_text)


def solution(x):
    ext = cpp_extension.load(NAME, sources=SOURCES)
    return x * ext.scale()
'''

needs_bwrap = pytest.mark.skipif(probe().backend != "bwrap", reason="no bubblewrap sandbox here")
needs_cxx = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler")


def _version(folder: Path, scale: float, name: str) -> Path:
    path = folder / name
    path.write_text(CANDIDATE.format(scale=scale))
    return path


def _computes(entry: Path, scale: float) -> None:
    """The stored build's library, loaded in a fresh process, returns the version's own scale."""
    library = entry / "pkb_fixture_split_edit" / "pkb_fixture_split_edit.so"
    code = ("import torch, importlib.util as u\n"
            f"spec = u.spec_from_file_location('pkb_fixture_split_edit', {str(library)!r})\n"
            "m = u.module_from_spec(spec); spec.loader.exec_module(m); print(m.scale())\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and float(run.stdout) == scale, run.stderr


@needs_bwrap
@needs_cxx
@pytest.mark.slow
def test_an_edit_takes_the_binding_object_the_trusted_store_kept(tmp_path: Path):
    """Version 1 compiles both units and the trusted store keeps the binding object (a third compile, in a
    sandbox of its own); version 2, its kernel edited, in the same folder, takes the binding object from the
    scope and still computes its own answer."""
    sample = tmp_path / "sample"
    sample.mkdir()
    first = compiling.compile_candidate(_version(sample, 3.0, "v1.py"), 600.0, "cpu")
    assert first.ok, (first.message, first.evidence)
    (build,) = first.builds
    assert build["binding_cache"] == "miss" and build["binding_store"] == "stored", build
    assert build["binding_stored_s"] > 0 and build["extension"] == "pkb_fixture_split_edit"
    assert set(build["split_seconds"]) == {"main.o", "kernel.o", "pkb_fixture_split_edit.so"}
    scope = binding_store.scope_for(sample / "v1.py", None)
    assert len([p for p in scope.iterdir() if not p.name.startswith(".")]) == 1
    second = compiling.compile_candidate(_version(sample, 5.0, "v2.py"), 600.0, "cpu")
    assert second.ok, (second.message, second.evidence)
    (build,) = second.builds
    assert build["binding_cache"] == "hit" and build["binding_store"] == "present", build
    assert "main.o" in build["split_seconds"] and "kernel.o" in build["split_seconds"]
    assert second.extensions is not None and first.extensions is not None
    _computes(first.extensions, 3.0)
    _computes(second.extensions, 5.0)
    # Another sample (another folder) never reads this one's objects: its first version misses.
    other = tmp_path / "other"
    other.mkdir()
    assert binding_store.scope_for(other / "v1.py", None) != scope


PROBE = '''"""Builds nothing; it names load_inline, so the compile stage runs its precompile (and its import)."""
import os
import sys

print("ARGV", " ".join(sys.argv))
try:
    print("LISTED", ",".join(sorted(os.listdir("/.pkb-objects"))))
except OSError as err:
    print("NOT LISTED", err.errno)
for name in ("planted", "0" * 64):
    try:
        with open(os.path.join("/.pkb-objects", name), "w") as f:
            f.write("an object of the candidate's choosing")
        print("WROTE", name)
    except OSError as err:
        print("REFUSED", err.errno)


def solution(x):
    return x
'''


@needs_bwrap
def test_a_candidate_sees_its_scope_read_only_and_cannot_write_it(tmp_path: Path):
    path = tmp_path / "probe.py"
    path.write_text(PROBE + f"# {tmp_path.name}: a source of its own (the compile stage caches by source)\n")
    scope = binding_store.scope_for(path, None)
    scope.mkdir(parents=True, exist_ok=True)
    (scope / "marker").write_text("")
    outcome = compiling.compile_candidate(path, 300.0, "cpu")
    assert outcome.ok, (outcome.message, outcome.evidence)
    assert f"--object-cache {binding_store.OBJECTS_MOUNT}" in outcome.evidence
    assert "LISTED marker" in outcome.evidence  # the scope is there, readable
    assert outcome.evidence.count("REFUSED 30") == 2 and "WROTE" not in outcome.evidence  # EROFS
    assert sorted(p.name for p in scope.iterdir()) == ["marker"]


def test_without_a_sandbox_no_object_cache_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Unsandboxed, the candidate runs as the harness's user and could write any folder it is given: no
    scope is made, mounted or named, and nothing is stored."""
    monkeypatch.setenv("PKB_SANDBOX", "off")
    stored: list[object] = []

    def store_one(*args: object) -> tuple[str, str]:
        stored.append(args)
        return "stored", ""

    monkeypatch.setattr(binding_store, "_store_one", store_one)
    path = tmp_path / "probe.py"
    path.write_text(PROBE + f"# {tmp_path.name}: a source of its own (the compile stage caches by source)\n")
    outcome = compiling.compile_candidate(path, 300.0, "cpu")
    assert outcome.ok, (outcome.message, outcome.evidence)
    assert "ARGV" in outcome.evidence and "--object-cache" not in outcome.evidence
    assert "NOT LISTED" in outcome.evidence
    assert not binding_store.scope_for(path, None).exists() and stored == []
    assert binding_store.store_bindings(tmp_path, tmp_path, 1.0, None, probe()) == []


def test_the_scope_is_bound_read_only_at_a_path_of_its_own(tmp_path: Path):
    layout = plan(cwd=tmp_path, visible=(), hide=(), scratch=None, extensions=None, ext_mount=EXT_MOUNT, gpus=False,
                  tmp_bytes=None, shm_bytes=None, read_only=[(tmp_path / "scope", "/.pkb-objects")])
    assert layout.mounts[-1].args(sizes=True, perms=True) == ["--ro-bind", str(tmp_path / "scope"), "/.pkb-objects"]


def test_one_scope_per_folder_and_problem(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert binding_store.scope_for(a / "v1.py", "p") == binding_store.scope_for(a / "v7.py", "p")
    assert binding_store.scope_for(a / "v1.py", "p") != binding_store.scope_for(b / "v1.py", "p")
    assert binding_store.scope_for(a / "v1.py", "p") != binding_store.scope_for(a / "v1.py", "q")


WHERE = PurePosixPath(EXT_MOUNT) / "x"
TORCH_LIKE = ('c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=x -DTORCH_API_INCLUDE_EXTENSION_H '
              '-DPYBIND11_COMPILER_TYPE=\\"_gcc\\" -isystem /usr/lib/torch/include -I/opt/inc -fPIC -std=c++20 -O3 -g '
              f'-Wall -Wno-unused -fno-strict-aliasing -c {WHERE}/main.cpp -o main.o')


def _unit(command: str) -> split_build.Unit:
    return split_build.Unit("main.o", "compile", f"{WHERE}/main.cpp", command)


def test_a_binding_command_torch_writes_passes_word_by_word():
    argv = binding_store.check_command(TORCH_LIKE, _unit(TORCH_LIKE), WHERE)
    assert isinstance(argv, list) and argv[0] == "c++" and '-DPYBIND11_COMPILER_TYPE="_gcc"' in argv


@pytest.mark.parametrize("change", [
    ("-O3", "-fplugin=/tmp/evil.so"), ("-O3", "-fplugin-arg-x=y"), ("-O3", "-fno-plugin"), ("-O3", "-O3; touch /tmp/x"),
    ("-O3", "-O3 && true"), ("-O3", "-B/tmp/evil"), ("-O3", "-specs=/tmp/x"), ("-O3", "-wrapper /tmp/w"),
    ("-O3", "@/tmp/flags"), ("-O3", "-Wp,-MD,/tmp/x"), ("-O3", "-Wl,-rpath"), ("-O3", "-include /etc/x"),
    ("-O3", "$(touch /tmp/x)"), ("-O3", "`id`"), ("c++ ", "/tmp/cc "), ("-o main.o", "-o /tmp/main.o"),
    ("-MF main.o.d", "-MF /tmp/dep"), (f"-c {WHERE}/main.cpp", "-c /etc/passwd"), ("-O3", "-O3 -c x.cpp")])
def test_a_binding_command_with_a_word_torch_does_not_write_is_refused(change: tuple[str, str]):
    command = TORCH_LIKE.replace(*change, 1)
    assert command != TORCH_LIKE
    assert isinstance(binding_store.check_command(command, _unit(command), WHERE), str)


NINJA = """ninja_required_version = 1.3
cxx = c++

cflags = -DTORCH_EXTENSION_NAME=x {cflags}
post_cflags = -fPIC -std=c++17
ldflags = -shared

rule compile
  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags
  depfile = $out.d
  deps = gcc

rule link
  command = $cxx $in $ldflags -o $out

build main.o: compile {where}/main.cpp
build kernel.o: compile {where}/kernel.cpp

build x.so: link main.o kernel.o

default x.so
"""


def _snapshot(tmp_path: Path, cflags: str = "-O3", kernel: str = "float k() { return 1; }\n") -> Path:
    """A stored cache entry with one extension folder, as the compile stage keeps it."""
    ext = tmp_path / "entry" / "x"
    ext.mkdir(parents=True)
    (ext / "build.ninja").write_text(NINJA.format(cflags=cflags, where=WHERE))
    (ext / "main.cpp").write_text("#include <pybind11/pybind11.h>\nPYBIND11_MODULE(x, m) {}\n")
    (ext / "kernel.cpp").write_text(kernel)
    return ext.parent


@pytest.mark.parametrize("cflags", ["-fplugin=/tmp/evil.so", "-O3 ; touch /tmp/pkb-owned"])
def test_the_store_never_compiles_a_refused_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cflags: str):
    monkeypatch.setattr(binding_store, "_compile", lambda *a: pytest.fail("compiled a refused command"))
    (stored,) = binding_store.store_bindings(_snapshot(tmp_path, cflags), tmp_path / "scope", 60.0, None, probe())
    assert stored.binding_store == "failed" and "refused" in stored.reason
    assert not (tmp_path / "scope").exists()


def test_a_kernel_unit_with_torch_headers_stores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """PKB's recorded files include torch in cuda.cu: the binding unit is not what their edits wait for."""
    monkeypatch.setattr(binding_store, "_compile", lambda *a: pytest.fail("compiled for a torch kernel unit"))
    entry = _snapshot(tmp_path, kernel="#include <torch/extension.h>\nfloat k() { return 1; }\n")
    (stored,) = binding_store.store_bindings(entry, tmp_path / "scope", 60.0, None, probe())
    assert stored.binding_store == "skipped" and "torch headers" in stored.reason


def test_the_depfile_must_name_the_source_alone():
    source = f"{WHERE}/main.cpp"
    assert binding_store._depfile_names_only(f"main.o: {source}\n".encode(), "main.o", source)
    assert binding_store._depfile_names_only(f"main.o: \\\n {source}\n".encode(), "main.o", source)
    assert not binding_store._depfile_names_only(f"main.o: {source} /etc/x.h\n".encode(), "main.o", source)
    assert not binding_store._depfile_names_only(f"other.o: {source}\n".encode(), "main.o", source)
    assert not binding_store._depfile_names_only(b"", "main.o", source)


def test_a_planted_entry_is_a_miss(tmp_path: Path):
    """An object under a key whose manifest does not describe it (a candidate could not write the scope; a
    stale or corrupted one reads the same) is never linked in: the binding unit is compiled."""
    from tests.harness.compiling.test_split_build import Tools, folder

    tools = Tools(tmp_path)
    where = folder(tmp_path, tools)
    binding = split_build.plan(where).units[0]
    key = split_build.unit_key(binding, where, (where / "main.cpp").read_bytes())
    assert key is not None
    entry = tmp_path / "cache" / key
    entry.mkdir(parents=True)
    (entry / OBJECT).write_bytes(b"the candidate's object")
    (entry / MANIFEST).write_text(json.dumps({"key": key, "size": 22, "sha256": digest(b"another"), "inputs": {}}))
    report = split_build.build(where, ObjectCache(tmp_path / "cache"), writable=False)
    assert report.binding == "miss" and "main.cpp" in tools.compiled()
    assert b"the candidate's object" not in (where / "main.o").read_bytes()


def test_a_stamped_build_is_skipped_by_the_ranks_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The rank installs prebuilt's check: a split build's folder is complete, torch's runner is not called;
    a folder changed since (or never stamped) goes to torch's runner."""
    from torch.utils import cpp_extension

    from tests.harness.compiling.test_split_build import Tools, folder

    tools = Tools(tmp_path)
    stamped, fresh = folder(tmp_path, tools, name="a"), folder(tmp_path, tools, name="b")
    split_build.build(stamped, None, writable=False)
    ran: list[str] = []
    monkeypatch.setattr(cpp_extension, "_run_ninja_build", lambda d, v, e: ran.append(Path(d).name))
    prebuilt.install()
    prebuilt.install()  # idempotent
    cpp_extension._run_ninja_build(str(stamped), False, "")
    cpp_extension._run_ninja_build(str(fresh), False, "")
    assert ran == ["b"]
    (stamped / "cuda.cu").write_text("__global__ void kernel() { int c = 7; }\n")
    cpp_extension._run_ninja_build(str(stamped), False, "")
    assert ran == ["b", "a"]


@pytest.mark.parametrize("forge", ["link", "relative", "not json", "no build.ninja"])
def test_a_stamp_that_is_not_one_is_not_up_to_date(tmp_path: Path, forge: str):
    from tests.harness.compiling.test_split_build import Tools, folder

    where = folder(tmp_path, Tools(tmp_path))
    split_build.build(where, None, writable=False)
    assert prebuilt.up_to_date(where)
    stamp = where / prebuilt.STAMP
    files = json.loads(stamp.read_text())["files"]
    if forge == "link":
        (tmp_path / "real").write_text(stamp.read_text())
        stamp.unlink()
        stamp.symlink_to(tmp_path / "real")
    elif forge == "relative":
        stamp.write_text(json.dumps({"files": {os.path.relpath(k): v for k, v in files.items()}}))
    elif forge == "not json":
        stamp.write_text("{")
    else:
        stamp.write_text(json.dumps({"files": {k: v for k, v in files.items() if not k.endswith("build.ninja")}}))
    assert not prebuilt.up_to_date(where)
