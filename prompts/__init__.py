"""Prompt templates and in-context examples: loading, rendering, hashing, and reading code out of replies.

Templates are files in this folder with `$placeholders` (string.Template): data, not code. Every template
and example file is hashed into each run record (`hashes()`), so two runs' prompts can be compared.

- `render_system(tools, guide_in_prompt)`: system.md for an agent with tools, zero_shot.md without tools;
  both carry the in-context example, and the programming guide when it is given in the prompt.
- `render_task(problem, shape, world_size, topology, include_guide)`: task.md: the reference source (the
  problem's imports, the constants and helpers `solution` uses, and `solution` itself; never the oracle,
  make_inputs or expert solutions), signature, dtype, shape, the inputs' layout, W, the machine's
  topology, the rules, the symmetric-memory API, and the answer format.
- `extract_code(reply)`: the candidate file in a model's text reply.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import Any

PROMPT_DIR = Path(__file__).resolve().parent
EXAMPLES_DIR = PROMPT_DIR / "examples"
EXAMPLES = ("ring_shift.py",)  # shown to the model, in this order
GUIDE_FILE = "guide.md"
TOOLS_FILE = "tools.md"
ANSWER_FORMATS_FILE = "answer_formats.md"
# The bash condition's files in its scratch folder (tools/bash.py), as this project's prompt names them.
SHELL_SOLUTION = "solution.py"
SHELL_REFERENCE = "reference.py"


class PromptError(ValueError):
    """A template or prompt file that cannot be used (missing, outside the folder, bad placeholders)."""


# -- files ----------------------------------------------------------------------------------------------


def _path(name: str) -> Path:
    path = (PROMPT_DIR / name).resolve()
    if PROMPT_DIR not in path.parents or not path.is_file():
        raise PromptError(f"no prompt file {name!r} in {PROMPT_DIR}")
    return path


def load(name: str) -> str:
    """The text of a prompt file, by its path relative to the prompts folder ("system.md", "examples/x.py")."""
    return _path(name).read_text(encoding="utf-8")


def template_files() -> list[str]:
    """Every template and example file, relative to the prompts folder (the package's code excluded)."""
    files = [p for p in PROMPT_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts
             and p.name != "__init__.py"]
    return sorted(p.relative_to(PROMPT_DIR).as_posix() for p in files)


def hashes() -> dict[str, str]:
    """sha256 of every template and example file, keyed by its path relative to the prompts folder."""
    return {name: hashlib.sha256(_path(name).read_bytes()).hexdigest() for name in template_files()}


def _substitute(template: str, /, **values: Any) -> str:
    try:
        return Template(load(template)).substitute({k: str(v) for k, v in values.items()})
    except (KeyError, ValueError) as err:
        raise PromptError(f"{template}: placeholder problem: {err}") from err


# -- markdown sections (tools.md, guide.md) -------------------------------------------------------------


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) for every `## heading` of a markdown file; text before the first one is dropped."""
    parts = re.split(r"(?m)^## ", text)
    out = []
    for part in parts[1:]:
        heading, _, body = part.partition("\n")
        out.append((heading.strip(), body.strip()))
    return out


@dataclass(frozen=True)
class GuideSection:
    topic: str  # the short name the `guide` tool takes
    title: str
    body: str

    def text(self) -> str:
        return f"## {self.title}\n\n{self.body}"


@lru_cache(maxsize=1)
def guide_sections() -> tuple[GuideSection, ...]:
    """The guide's sections; a heading reads `## topic: Title`."""
    sections = []
    for heading, body in _sections(load(GUIDE_FILE)):
        topic, sep, title = heading.partition(":")
        if not sep:
            raise PromptError(f"{GUIDE_FILE}: heading {heading!r} must read 'topic: Title'")
        sections.append(GuideSection(topic.strip(), title.strip(), body))
    return tuple(sections)


def guide_text() -> str:
    """The whole guide as one markdown text (for the prompt)."""
    return "\n\n".join(s.text() for s in guide_sections())


@lru_cache(maxsize=1)
def _tool_sections() -> dict[str, str]:
    topics = ", ".join(s.topic for s in guide_sections())
    sections = dict(_sections(load(TOOLS_FILE)))
    return {name: Template(body).substitute(topics=topics) for name, body in sections.items()}


def tool_descriptions() -> dict[str, str]:
    """Each tool's description from tools.md, as one paragraph."""
    return {name: " ".join(body.split()) for name, body in _tool_sections().items() if name != "args"}


def arg_descriptions() -> dict[str, str]:
    """Argument descriptions from the `## args` section of tools.md (`- name: text` lines)."""
    args = {}
    for line in _tool_sections().get("args", "").splitlines():
        match = re.match(r"^-\s*(\w+):\s*(.+)$", line.strip())
        if match:
            args[match.group(1)] = match.group(2).strip()
    return args


# -- the system prompt ----------------------------------------------------------------------------------


def example_text() -> str:
    """The in-context examples, each as a fenced block under its file name."""
    blocks = [f"`{name}`:\n\n```python\n{load(f'examples/{name}').rstrip()}\n```" for name in EXAMPLES]
    return "\n\n".join(blocks)


def _guide_section(guide_in_prompt: bool, guide_tool: bool) -> str:
    if guide_in_prompt:
        return f"\n# Multi-GPU programming guide\n\n{guide_text()}\n"
    if guide_tool:
        topics = ", ".join(s.topic for s in guide_sections())
        return f"\nThe `guide` tool returns sections of a short multi-GPU programming guide ({topics}).\n"
    return ""


def render_system(condition_tools: Sequence[str], guide_in_prompt: bool) -> str:
    """The system prompt of a condition: zero_shot.md when it has no tools, else system.md listing them."""
    tools = list(condition_tools)
    guide = _guide_section(guide_in_prompt, "guide" in tools)
    if not tools:
        return _substitute("zero_shot.md", guide_section=guide, example=example_text()).strip() + "\n"
    descriptions = tool_descriptions()
    unknown = [t for t in tools if t not in descriptions]
    if unknown:
        raise PromptError(f"no description in {TOOLS_FILE} for tool(s): {', '.join(unknown)}")
    tool_list = "\n".join(f"- `{t}`: {descriptions[t]}" for t in tools)
    return _substitute("system.md", tool_list=tool_list, guide_section=guide, example=example_text()).strip() + "\n"


def render_bash_system(guide_in_prompt: bool, reference_file: str = SHELL_REFERENCE,
                       solution_file: str = SHELL_SOLUTION) -> str:
    """The bash condition's system prompt: a shell in a scratch folder, the harness's check as a command."""
    guide = _guide_section(guide_in_prompt, False)
    return _substitute("bash.md", guide_section=guide, example=example_text(), reference_file=reference_file,
                       solution_file=solution_file).strip() + "\n"


def answer_format(name: str, **values: Any) -> str:
    """The answer-format paragraph of a condition: `reply` (a text reply or a tool's source) or `shell`."""
    sections = dict(_sections(load(ANSWER_FORMATS_FILE)))
    if name not in sections:
        raise PromptError(f"{ANSWER_FORMATS_FILE}: no section {name!r}")
    return Template(sections[name]).substitute({k: str(v) for k, v in values.items()})


# -- the task prompt ------------------------------------------------------------------------------------


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


HIDDEN = frozenset({"PROBLEM", "make_inputs", "oracle", "traffic"})


def reference_source(path: Path) -> str:
    """The reference as the model sees it: the module's imports, the constants, helpers and classes that
    `solution` uses (transitively), and `solution` itself, in file order with their comments. The oracle,
    make_inputs, traffic and PROBLEM stay out: the oracle is the answer key."""
    text = Path(path).read_text(encoding="utf-8")
    tree = ast.parse(text)
    lines = text.splitlines()
    definitions = {name: node for node in tree.body for name in _bound_names(node) if name not in HIDDEN}
    if "solution" not in definitions:
        raise PromptError(f"{path}: defines no solution()")
    wanted: set[str] = set()
    frontier = ["solution"]
    while frontier:
        name = frontier.pop()
        if name in wanted or name not in definitions:
            continue
        wanted.add(name)
        frontier.extend(_names_used(definitions[name]) - wanted)
    keep = [node for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom)) or (_bound_names(node) & wanted)]
    chunks = []
    for node in keep:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):  # the comment right above it
            start -= 1
        chunks.append("\n".join(lines[start:node.end_lineno]))
    imports = [c for c, n in zip(chunks, keep) if isinstance(n, (ast.Import, ast.ImportFrom))]
    rest = [c for c, n in zip(chunks, keep) if not isinstance(n, (ast.Import, ast.ImportFrom))]
    return "\n".join(imports) + "\n\n\n" + "\n\n\n".join(rest)


def _describe(value: Any, depth: int = 0) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        dims = ", ".join(str(d) for d in value.shape)
        return f"Tensor[{str(value.dtype).replace('torch.', '')}]({dims})"
    if isinstance(value, (tuple, list)) and depth < 2:
        inner = [_describe(v, depth + 1) for v in value[:6]]
        more = f", ... ({len(value)} items)" if len(value) > 6 else ""
        bracket = "()" if isinstance(value, tuple) else "[]"
        return bracket[0] + ", ".join(inner) + more + bracket[1]
    if isinstance(value, (int, float, bool, str)) or value is None:
        return repr(value)[:80]
    return type(value).__name__


@lru_cache(maxsize=64)
def _input_lines(spec: str, shape_name: str, world_size: int) -> str:
    """One line per positional input of rank 0: name, type, dtype and dims.

    Built under FakeTensorMode (no memory, no time); problems whose inputs depend on data (routing counts)
    fall back to a real call on the CPU. Both are the harness's own make_inputs at this shape."""
    # Deferred: loading a problem imports torch; the prompts are read (hashed, listed) without it.
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from harness.problems.registry import load_problem_spec

    problem = load_problem_spec(spec)
    shape = problem.shape(shape_name)

    def make() -> tuple:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(1)
        return tuple(problem.make_inputs(shape, 0, world_size, generator, torch.device("cpu")))

    try:
        with FakeTensorMode():
            inputs = make()
            described = [_describe(v) for v in inputs]
    except Exception:
        try:
            described = [_describe(v) for v in make()]
        except Exception:
            return "  (not available)"
    names = list(inspect.signature(problem.solution).parameters)
    names += [f"arg{i}" for i in range(len(names), len(described))]
    return "\n".join(f"  - `{n}`: {d}" for n, d in zip(names, described))


def _gib(n: Any) -> str | None:
    return f"{n / 2**30:.0f} GiB" if isinstance(n, (int, float)) else None


def topology_summary(topology: dict[str, Any]) -> dict[str, Any]:
    """What the model needs from a topology record: GPUs, links, measured ceilings, multicast.

    Takes a harness.measure.topology Profile dump ({"topology": ..., "calibration": ...}, optionally with the
    roofline's "ceilings"), or a bare Topology dump; anything else is passed through as it is."""
    topo = topology.get("topology", topology)
    if not isinstance(topo, dict) or "gpus" not in topo:
        return dict(topology)
    cal = topology.get("calibration") or {}
    gpus = topo.get("gpus") or []
    first = gpus[0] if gpus else {}
    links = [link for link in first.get("nvlinks", []) if link.get("active")]
    summary: dict[str, Any] = {
        "gpus": {"count": topo.get("gpu_count", len(gpus)), "name": first.get("name"),
                 "compute_capability": first.get("compute_capability"), "sms": first.get("sm_count"),
                 "memory": _gib(first.get("memory_bytes")),
                 "l2_mib": round(first["l2_bytes"] / 2**20, 1) if first.get("l2_bytes") else None},
        "interconnect": topo.get("interconnect") or None,
        "nvlinks_per_gpu": len(links) or None,
        "nvlink_gbytes_per_s_per_link": links[0].get("gbytes_per_s") if links else None,
        "peer_access": topo.get("peer_access") or None,
        "versions": {k: topo.get(k) for k in ("torch", "cuda", "driver", "nccl") if topo.get(k)},
    }
    measured: dict[str, Any] = {}
    if cal.get("peer_copy"):
        measured["peer_copy_gbytes_per_s_one_way"] = round(max(p["bytes_per_s"] for p in cal["peer_copy"]) / 1e9, 1)
    if cal.get("peer_copy_bidir"):
        measured["peer_copy_gbytes_per_s_each_way_bidirectional"] = round(
            min(p["bytes_per_s"] for p in cal["peer_copy_bidir"]) / 1e9, 1)
    if cal.get("hbm_copy_bytes_per_s"):
        measured["hbm_copy_tbytes_per_s_read_plus_write"] = round(max(cal["hbm_copy_bytes_per_s"]) / 1e12, 2)
    if cal.get("matmul_bf16_flops_per_s"):
        measured["bf16_matmul_tflops"] = round(max(cal["matmul_bf16_flops_per_s"]) / 1e12)
    if cal.get("all_reduce"):
        measured["nccl_all_reduce_bf16"] = [
            {"bytes": p["bytes"], "median_us": round(p["median_us"], 1),
             "busbw_gbytes_per_s": round(p["busbw_bytes_per_s"] / 1e9, 1)} for p in cal["all_reduce"]]
    if measured:
        summary["measured"] = measured
    if topology.get("ceilings"):
        summary["roofline_ceilings"] = topology["ceilings"]
    summary["multicast"] = {"hardware_supported": topo.get("multicast_supported"), "allowed": False,
                            "disabled_by_policy": topo.get("multicast_disabled_by_policy", True)}
    return {k: v for k, v in summary.items() if v not in (None, {}, [])}


def _topology_text(topology: dict[str, Any] | None) -> str:
    if not topology:
        return ("No topology was measured for this run. NVLink multicast is disabled on these machines and "
                "must not be used.")
    summary = topology_summary(topology)
    multicast = summary.get("multicast", {}) if isinstance(summary.get("multicast"), dict) else {}
    exists = multicast.get("hardware_supported")
    said = {True: "reports multicast support", False: "reports no multicast support",
            None: "multicast support unknown"}.get(exists, "multicast support unknown")
    return (f"```json\n{json.dumps(summary, indent=1)}\n```\n\nMulticast: the hardware {said}; NVLink multicast "
            "is disabled on these machines and must not be used.")


def _target(topology: dict[str, Any] | None) -> str:
    summary = topology_summary(topology) if topology else {}
    gpus = summary.get("gpus") if isinstance(summary.get("gpus"), dict) else None
    if gpus and gpus.get("compute_capability"):
        arch = "sm_" + str(gpus["compute_capability"]).replace(".", "")
        return f"{gpus.get('count')} x {gpus.get('name')} ({arch})"
    return "NVIDIA GPUs (the scoring machines are H200, sm_90)"


def _cupy_line() -> str:
    if importlib.util.find_spec("cupy") is not None:
        return "CuPy is installed on this machine."
    return "CuPy is not installed on this machine: use load_inline."


def render_task(problem: Any, shape: str, world_size: int, topology: dict[str, Any] | None,
                include_guide: bool, answer: str = "reply") -> str:
    """The task prompt for one problem at one named shape and world size (see the module docstring)."""
    dims = problem.shape(shape)
    signature = f"solution{inspect.signature(problem.solution)}"
    source = problem.source
    text = _substitute(
        "task.md",
        name=problem.name, category=problem.category, codebase=source.get("codebase", "?"),
        source_path=source.get("path", "?"), symbol=source.get("symbol", "?"), summary=problem.summary,
        reference_source=reference_source(problem.path).strip(), signature=signature,
        dtype=str(problem.dtype).replace("torch.", ""), shape_name=shape, shape_json=json.dumps(dims),
        inputs=_input_lines(problem.loader_spec, shape, world_size), world_size=world_size,
        atol=f"{problem.atol:g}", rtol=f"{problem.rtol:g}", topology=_topology_text(topology),
        cupy=_cupy_line(), target=_target(topology), answer_format=answer_format(answer, solution_file=SHELL_SOLUTION),
        guide_section=f"\n# Multi-GPU programming guide\n\n{guide_text()}\n" if include_guide else "",
    )
    return text.strip() + "\n"


# -- reading code out of a reply -----------------------------------------------------------------------

_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)[^\n]*$")
PYTHON_TAGS = frozenset({"python", "py", "python3"})


def _fenced_blocks(text: str) -> list[tuple[str, str, bool]]:
    """(language, body, closed) for each fenced block, CommonMark-style: a closing fence uses the opening
    character at least as many times; an unclosed block runs to the end of the text."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _OPEN.match(lines[i])
        if not match or (match.group(1)[0] == "`" and "`" in lines[i].strip()[len(match.group(1)):]):
            i += 1
            continue
        fence, lang = match.group(1), match.group(2).lower()
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        body = []
        i += 1
        while i < len(lines) and not close.match(lines[i]):
            body.append(lines[i])
            i += 1
        closed = i < len(lines)
        blocks.append((lang, "\n".join(body), closed))
        i += 1
    return blocks


def extract_code(reply_text: str | None) -> str | None:
    """The candidate file in a text reply: the last ```python block, or else the only (untagged) fenced block.

    None when there is no such block, when several untagged blocks leave it ambiguous, or when the
    block is empty. An unclosed last block (a reply cut off by the token limit) still counts: it is the
    code the model produced, and the harness will say it does not compile.
    """
    if not reply_text:
        return None
    blocks = [b for b in _fenced_blocks(reply_text) if b[1].strip()]
    python = [b for b in blocks if b[0] in PYTHON_TAGS]
    if python:
        chosen = python[-1]
    elif len(blocks) == 1 and not blocks[0][0]:  # one untagged block; a ```cuda or ```bash one is not the file
        chosen = blocks[0]
    else:
        return None
    return chosen[1].strip("\n") + "\n"
