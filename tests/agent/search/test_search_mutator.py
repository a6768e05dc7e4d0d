"""The stochastic scripted model: its proposals are edits of real kernels, with failures mixed in, and seeded."""

from __future__ import annotations

import ast
import random
import shutil
import subprocess

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from agent.search import mutator, tunables
from agent.search.mutator import MutatorChatModel, Rates, library, propose
from tests import search_fakes

NO_FAILURES = Rates(syntax=0, wrong=0, hang=0, runtime=0, collective=0, no_code=0)


def test_annotated_tunables_of_the_cpu_families_and_their_ladders() -> None:
    for kernel in library("all_reduce", "cpu") + library("all_gather", "cpu") + library("reduce_scatter", "cpu"):
        sites = {t.name: t for t in tunables.find_tunables(kernel.source) if t.annotated}
        assert {"CHUNK", "POLL_S"} <= set(sites), kernel.name
        chunk = sites["CHUNK"]
        assert chunk.value == "8" and chunk.choices[0] == "8" and chunk.choices[-1] == "1024"
        assert kernel.source[chunk.start:chunk.end] == "8"


def test_found_sites_of_the_expert_solutions() -> None:
    source = next(k for k in library("all_reduce", "cuda") if k.name == "all_reduce__one_shot").source
    sites = tunables.find_tunables(source)
    names = [t.name for t in sites]
    assert any("threads per block" in n for n in names) and any("work per block" in n for n in names)
    threads = next(t for t in sites if "threads per block" in t.name)
    assert threads.value == "512" and "1024" in threads.choices and "2048" not in threads.choices  # CUDA's limit
    edited = tunables.set_value(source, threads, "256")
    assert edited.count("\n") == source.count("\n")
    # the launch's block size and the kernel's __launch_bounds__ change together, nothing else does
    launch_line = source.splitlines()[source[:threads.start].count("\n")]
    bounds_line = next(line for line in source.splitlines() if "__launch_bounds__(512)" in line)
    assert [a for a, b in zip(edited.splitlines(), source.splitlines()) if a != b] == \
        [bounds_line.replace("512", "256", 1), launch_line.replace("512", "256", 1)]


CUDA_PROBLEMS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_reduce_residual_rmsnorm")


def _cuda_experts() -> list[mutator.Kernel]:
    return [k for p in CUDA_PROBLEMS for k in library(p, "cuda")]


def _extremes(source: str) -> list[str]:
    """The source with every found site at the bottom of its ladder, and with every one at the top."""
    sites = tunables.find_tunables(source)
    out = []
    for pick in (0, -1):
        edited = source
        for original in sites:
            # offsets move as values change length (names carry line numbers, which do not): find it again
            site = next(t for t in tunables.find_tunables(edited) if t.name == original.name)
            edited = tunables.set_value(edited, site, original.choices[pick])
        out.append(edited)
    return out


def test_block_size_edits_keep_launches_and_launch_bounds_equal() -> None:
    import re

    for kernel in _cuda_experts():
        for variant in _extremes(kernel.source):
            bounds = set(re.findall(r"__launch_bounds__\((\d+)", variant))
            launches = set(re.findall(r"launch\(kernel, [^,]+, (\d+),", variant))
            assert not bounds or not launches or launches <= bounds, (kernel.name, bounds, launches)
            defines = dict(re.findall(r"(?m)^#define (THREADS|VPT) (\d+)", variant))
            for name, value in defines.items():
                assert re.search(rf"(?m)^{name} = {value}\b", variant), (kernel.name, name, value)


def test_an_edit_changes_one_literal_and_a_variant_switch_carries_the_tunables() -> None:
    one_shot, two_shot = library("all_reduce", "cpu")
    draft = mutator.Draft(one_shot.source)
    assert mutator.edit_tunable(draft, random.Random(3), NO_FAILURES)
    assert tunables.skeleton(draft.source) == one_shot.skeleton  # still the same family
    assert draft.source != one_shot.source
    values = {n: t.value for n, t in tunables.by_name(draft.source).items()}
    assert mutator.switch_variant(draft, random.Random(0), [one_shot, two_shot])
    assert mutator.family_of(draft.source, [one_shot, two_shot]) == two_shot
    assert {n: t.value for n, t in tunables.by_name(draft.source).items()} == values


@pytest.mark.parametrize("kind,verdict", [("syntax", "compile_error"), ("wrong", "output_mismatch"),
                                          ("hang", "deadlock"), ("runtime", "runtime_error"),
                                          ("collective", "correct")])
def test_failure_injections_apply_to_every_kernel_of_the_library(kind: str, verdict: str) -> None:
    kernels = [k for p in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
               for device in ("cpu", "cuda") for k in library(p, device)]
    assert len(kernels) >= 12
    for k in kernels:
        broken = mutator.FAILURES[kind](k.source)
        assert broken is not None, k.name
        source, note = broken
        assert source != k.source and note
        if kind == "syntax":
            with pytest.raises(SyntaxError):
                compile(source, k.name, "exec")
        else:
            compile(source, k.name, "exec")
        assert search_fakes.verdict_of(source)[0] == verdict


def _prompt(problem: str, parent: str | None = None, inspiration: str | None = None) -> list:
    text = f"# Problem: {problem}\n\nSome task.\n"
    if parent is not None:
        text += f"\n## Parent\n\nCandidate 3.\n\n```python\n{parent}```\n"
    if inspiration is not None:
        text += f"\n## Inspiration\n\n```python\n{inspiration}```\n"
    return [SystemMessage(content="You write kernels. ```python\nexample = 1\n```"), HumanMessage(content=text)]


def test_the_model_is_seeded_reads_its_parent_and_reports_usage() -> None:
    parent = library("all_gather", "cpu")[1].source
    a = MutatorChatModel(seed=11, rates=NO_FAILURES).invoke(_prompt("all_gather", parent))
    b = MutatorChatModel(seed=11, rates=NO_FAILURES).invoke(_prompt("all_gather", parent))
    assert a.content == b.content
    assert a.usage_metadata and a.usage_metadata["input_tokens"] > 0 and a.usage_metadata["output_tokens"] > 0
    import prompts

    code = prompts.extract_code(str(a.content))
    assert code is not None and code != parent
    assert mutator.family_of(code, library("all_gather", "cpu")) is not None  # an edit of a real kernel
    others = {prompts.extract_code(str(MutatorChatModel(seed=s, rates=NO_FAILURES).invoke(
        _prompt("all_gather", parent)).content)) for s in range(12)}
    assert len(others) > 3  # the seed matters


def test_without_a_parent_it_drafts_from_the_library_and_without_one_it_has_no_code() -> None:
    import prompts

    reply = MutatorChatModel(seed=1, rates=NO_FAILURES, device="cuda").invoke(_prompt("reduce_scatter"))
    code = prompts.extract_code(str(reply.content))
    assert code is not None and "launch(" in code  # the expert solution, on CUDA
    reply = MutatorChatModel(seed=1, rates=NO_FAILURES).invoke(_prompt("no_such_problem"))
    assert prompts.extract_code(str(reply.content)) is None


def test_crossover_takes_values_from_the_inspiration() -> None:
    base = library("all_reduce", "cpu")[0].source
    other = tunables.set_value(base, tunables.by_name(base)["POLL_S"], "1e-05")
    other = tunables.set_value(other, tunables.by_name(other)["CHUNK"], "512")
    taken = set()
    for seed in range(20):
        draft = mutator.Draft(base)
        mutator.crossover(draft, random.Random(seed), other)
        taken |= {n for n, t in tunables.by_name(draft.source).items() if t.value != tunables.by_name(base)[n].value}
    assert taken == {"POLL_S", "CHUNK"}


def test_failure_rates_mix_failures_in_at_about_their_rate() -> None:
    rates = Rates()
    parent = library("all_reduce", "cpu")[0].source
    kinds = []
    for seed in range(400):
        source, notes = propose("all_reduce", parent, None, device="cpu", rates=rates, rng=random.Random(seed))
        injected = [n.split(":", 1)[1] for n in notes if n.startswith("injected:")]
        kinds.append("no_code" if source is None else (injected[0] if injected else "edit"))
    share = 1 - kinds.count("edit") / len(kinds)
    assert abs(share - rates.failure_total) < 0.07
    assert set(kinds) == {"edit", "no_code", "syntax", "wrong", "hang", "runtime", "collective"}


def test_rates_parse_and_reject_bad_options() -> None:
    assert mutator.rates_of("mutator:hang=0,syntax=0.5").syntax == 0.5
    assert mutator.rates_of("mutator").hang == Rates().hang
    with pytest.raises(ValueError, match="NAME=RATE"):
        Rates.parse("typo=0.1")
    with pytest.raises(ValueError, match="add up"):
        Rates.parse("syntax=0.6,wrong=0.6")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_extreme_variants_of_every_cuda_expert_compile(tmp_path) -> None:
    """Each expert's CUDA source with every tunable at the bottom, then the top, of its ladder compiles for
    sm_90 (as CuPy's NVRTC compiles it on the GPU: the prelude, then the module's SOURCE)."""
    from problems._symm import CUDA_PRELUDE

    failures = []
    for kernel in _cuda_experts():
        for i, variant in enumerate([kernel.source, *_extremes(kernel.source)]):
            tree = ast.parse(variant)
            cuda = next((n.value.value for n in tree.body if isinstance(n, ast.Assign)
                         and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                         and getattr(n.targets[0], "id", "") == "SOURCE"), None)
            if cuda is None:
                continue  # copy-engine experts: no kernel of their own
            path = tmp_path / f"{kernel.name}_{i}.cu"
            path.write_text(CUDA_PRELUDE + cuda)
            proc = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "--ptx", str(path), "-o",
                                   str(path.with_suffix(".ptx"))], capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                failures.append(f"{kernel.name} variant {i}: {proc.stderr[-600:]}")
    assert not failures, "\n".join(failures)
