"""ParallelKernelBench's own prompts, assembled at run time from the user's checkout (never copied here).

PKB's generator (`kernelgen/generate_kernel.py` in a checkout) builds its zero-shot request from
`kernelgen/prompts.toml`: a system text (the backend's `generate_kernel_system_prompt`, else the
generator's `SYSTEM_PROMPT` constant) and a user text made of the components `[options.generate_kernel]`
lists (the problem statement, the in-context example, the reference file, the precision note, the
hardware profile, the instruction), each a `str.format` template, joined by blank lines, plus a footer
naming the file to write. Its agent (`kernelgen/generate_kernel_agent.py`) wraps that body in
`[templates.agent_kernel]`'s task, with the backend's `agent_system_prompt` as system text.

This module follows the same steps over the checkout's files: the templates come from its prompts.toml,
the system-prompt constant and the footer from its generator's source (read with `ast`, never imported),
so the text is the checkout's and only the assembly is ours. benchmarks/pkb_prompt_identity.py checks
the result against PKB's own functions, run from the checkout. The code a reply carries is taken by
PKB's rule (`first_block`). Standard library only (prompts/ is a leaf).
"""

from __future__ import annotations

import ast
import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GENERATOR = "kernelgen/generate_kernel.py"
AGENT_GENERATOR = "kernelgen/generate_kernel_agent.py"
TEMPLATES = "kernelgen/prompts.toml"
# The hardware profile of PKB's published solution sets (their folder names end in `_h100_8_...`).
DEFAULT_HARDWARE = "h100_8"
# How code is taken from a reply (recorded with every sample): PKB's generator and this project's default.
PKB_RULE = "pkb:first-python-block"
PKB_AGENT_FILE = "solutions_{backend}/{stem}_{backend}.py"  # where PKB's agent writes (its run_agent)
PKB_REFERENCE_FILE = "reference/{stem}.py"
# PKB's providers, by this project's provider names (the generated folder's name carries them).
PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "google": "google", "together": "together"}


class PkbPromptError(ValueError):
    """A checkout whose generator or templates cannot give a prompt; the message is one line."""


@dataclass(frozen=True)
class PkbSettings:
    """What PKB's generator takes on its command line: backend, precision, hardware profile (None: none)."""

    backend: str | None = None  # None: prompts.toml's meta.default_backend
    precision: str | None = None  # None: meta.default_precision
    hardware: str | None = DEFAULT_HARDWARE


@dataclass(frozen=True)
class PkbPrompt:
    system: str
    user: str
    record: dict[str, Any] = field(default_factory=dict)  # which checkout, files (sha256), settings, rule


# -- reading the checkout ------------------------------------------------------------------------------


def _read(checkout: Path, relative: str) -> str:
    path = Path(checkout) / relative
    if not path.is_file():
        raise PkbPromptError(f"{checkout}: no {relative} (a ParallelKernelBench checkout has one)")
    return path.read_text(encoding="utf-8")


def _sha256(checkout: Path, relative: str) -> str:
    return hashlib.sha256((Path(checkout) / relative).read_bytes()).hexdigest()


def load_templates(checkout: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(_read(checkout, TEMPLATES))
    except tomllib.TOMLDecodeError as err:
        raise PkbPromptError(f"{checkout}/{TEMPLATES}: not valid TOML ({err})") from None


@dataclass(frozen=True)
class GeneratorFacts:
    """What the generator's source holds that the templates do not: its default system text, its model
    list (model -> provider), and the footer it appends, as an f-string over the output path."""

    system_prompt: str
    models: dict[str, str]
    footer: ast.JoinedStr | None
    footer_name: str  # the name the footer's f-string uses for the output path


def generator_facts(checkout: Path) -> GeneratorFacts:
    source = _read(checkout, GENERATOR)
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise PkbPromptError(f"{checkout}/{GENERATOR}: cannot be parsed ({err.msg}, line {err.lineno})") from None
    constants: dict[str, Any] = {}
    for node in tree.body:
        target: ast.expr
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                constants[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    if not isinstance(constants.get("SYSTEM_PROMPT"), str):
        raise PkbPromptError(f"{checkout}/{GENERATOR}: no SYSTEM_PROMPT string constant")
    footer, name = _footer(tree)
    models = constants.get("ALLOWED_MODELS")
    return GeneratorFacts(constants["SYSTEM_PROMPT"], dict(models) if isinstance(models, dict) else {}, footer, name)


def _footer(tree: ast.Module) -> tuple[ast.JoinedStr | None, str]:
    """The f-string assigned to `footer` in assemble_user_prompt, and the one name it formats."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "assemble_user_prompt":
            for inner in ast.walk(node):
                if (isinstance(inner, ast.Assign) and len(inner.targets) == 1
                        and isinstance(inner.targets[0], ast.Name) and inner.targets[0].id == "footer"
                        and isinstance(inner.value, ast.JoinedStr)):
                    names = {n.id for n in ast.walk(inner.value) if isinstance(n, ast.Name)}
                    if len(names) == 1:
                        return inner.value, names.pop()
    return None, ""


def _render_fstring(node: ast.JoinedStr, values: dict[str, str]) -> str:
    out = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            out.append(str(part.value))
        elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) and part.format_spec is None:
            out.append(str(values[part.value.id]))
        else:
            raise PkbPromptError(f"{GENERATOR}: the footer's f-string has a part this reader does not evaluate")
    return "".join(out)


# -- the rules PKB's generator follows -------------------------------------------------------------------


def _table(cfg: dict[str, Any], *keys: str) -> dict[str, Any]:
    value: Any = cfg
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, dict):
        raise PkbPromptError(f"{TEMPLATES}: no [{'.'.join(keys)}] table")
    return value


def resolved(cfg: dict[str, Any], settings: PkbSettings) -> PkbSettings:
    """The settings with the checkout's defaults filled in, each checked against the templates."""
    meta = cfg.get("meta") or {}
    backend = settings.backend or str(meta.get("default_backend") or "cuda")
    precision = settings.precision or str(meta.get("default_precision") or "bf16")
    if backend not in (cfg.get("backends") or {}):
        raise PkbPromptError(f"{TEMPLATES}: no backend {backend!r} (has {', '.join(cfg.get('backends') or {})})")
    if precision not in (cfg.get("precision") or {}):
        raise PkbPromptError(f"{TEMPLATES}: no precision {precision!r} (has {', '.join(cfg.get('precision') or {})})")
    hardware = settings.hardware
    if hardware and hardware not in (cfg.get("hardware_profiles") or {}):
        raise PkbPromptError(f"{TEMPLATES}: no hardware profile {hardware!r} "
                             f"(has {', '.join(cfg.get('hardware_profiles') or {})})")
    return PkbSettings(backend, precision, hardware or None)


def system_text(cfg: dict[str, Any], facts: GeneratorFacts, backend: str) -> str:
    """The backend's own generator system text when it has a non-blank one, else the generator's constant."""
    own = ((cfg.get("backends") or {}).get(backend) or {}).get("generate_kernel_system_prompt")
    return own.strip() if isinstance(own, str) and own.strip() else facts.system_prompt


def hardware_text(cfg: dict[str, Any], hardware: str | None) -> str:
    if not hardware:
        return ""
    profile = {k: str(v) for k, v in _table(cfg, "hardware_profiles", hardware).items()}
    parts = _table(cfg, "templates", "hardware")
    pieces = [parts["hardware_header"].strip()] + [parts[k].format(**profile) for k in
                                                   ("hardware_specs", "hardware_definitions",
                                                    "hardware_best_practices")]
    return "\n\n".join(p for p in pieces if p)


def _context(cfg: dict[str, Any], checkout: Path, settings: PkbSettings, reference: str) -> dict[str, str]:
    """The values every template is formatted with: backend and precision names, the reference, the
    hardware text, and the in-context examples (each a pair of files of the checkout)."""
    assert settings.backend is not None and settings.precision is not None
    backend = _table(cfg, "backends", settings.backend)
    common = _table(cfg, "templates", "common")
    ctx = {"backend_display": backend["backend_display"],
           "precision_display": _table(cfg, "precision", settings.precision)["precision_display"],
           "ref_arch_src": reference, "hardware_context_body": hardware_text(cfg, settings.hardware)}
    examples = backend.get("in_context_examples") or []
    if not isinstance(examples, list) or not examples:
        raise PkbPromptError(f"{TEMPLATES}: backends.{settings.backend} lists no in_context_examples")
    intro = common["example_intro_one_shot"] if len(examples) == 1 else common["example_intro_few_shot"]
    ctx["examples_intro"] = intro.format(**ctx)
    entries = []
    for i, example in enumerate(examples):
        try:
            pair = {"input_code": _read(checkout, str(example["pytorch_solution"])),
                    "output_code": _read(checkout, str(example["custom_solution"]))}
        except (KeyError, TypeError):
            raise PkbPromptError(f"{TEMPLATES}: backends.{settings.backend}.in_context_examples[{i}] needs "
                                 "pytorch_solution and custom_solution") from None
        label = str(example.get("label") or f"Example {i + 1}")
        entries.append(common["example_entry_template"].format(**ctx, example_label=label, **pair))
    ctx["examples_entries"] = "\n\n".join(entries)
    return ctx


def body_text(cfg: dict[str, Any], checkout: Path, settings: PkbSettings, reference: str) -> str:
    """The components of [options.generate_kernel], each formatted and stripped, joined by blank lines."""
    ctx = _context(cfg, checkout, settings, reference)
    shared, common = cfg.get("shared") or {}, _table(cfg, "templates", "common")
    parts = []
    for name in _table(cfg, "options", "generate_kernel").get("components") or []:
        template = shared.get(name, common.get(name))
        if not isinstance(template, str):
            raise PkbPromptError(f"{TEMPLATES}: unknown prompt component {name!r}")
        parts.append(template.format(**ctx).strip())
    return "\n\n".join(p for p in parts if p)


def model_slug(model: str, limit: int = 72) -> str:
    """A model id as PKB's generated folder names carry it: '/' and other characters outside
    [A-Za-z0-9._-] become '_', runs of '_' one, none at either end, at most `limit` characters."""
    text = re.sub(r"[^a-zA-Z0-9._\-]+", "_", model.strip().replace("/", "_"))
    text = re.sub(r"_+", "_", text).strip("_") or "model"
    return text[:limit]


def generated_path(settings: PkbSettings, stem: str, provider: str, model: str) -> str:
    """Where PKB's generator writes a problem's file: solutions_<backend>_<precision>_<hardware|none>_
    <provider>_<model slug>/<stem>_<backend>.py."""
    folder = (f"solutions_{settings.backend}_{settings.precision}_{settings.hardware or 'none'}_{provider}_"
              f"{model_slug(model)}")
    return f"{folder}/{stem}_{settings.backend}.py"


def provider_for(facts: GeneratorFacts, provider: str, model: str) -> str:
    """PKB's provider for a model: its own list's where the model is on it, else ours by name."""
    return facts.models.get(model) or PROVIDERS.get(provider, provider)


# -- the two prompts ----------------------------------------------------------------------------------


def _record(checkout: Path, settings: PkbSettings, kind: str, **extra: Any) -> dict[str, Any]:
    return {"name": "pkb", "kind": kind, "checkout": str(Path(checkout).resolve()),
            "files": {rel: _sha256(checkout, rel) for rel in (TEMPLATES, GENERATOR)},
            "backend": settings.backend, "precision": settings.precision, "hardware": settings.hardware,
            "extraction": PKB_RULE, **extra}


def zero_shot_prompt(checkout: Path, reference: str, stem: str, *, provider: str, model: str,
                     settings: PkbSettings = PkbSettings()) -> PkbPrompt:
    """PKB's generator request for one problem: its system text and its user text, footer included."""
    cfg = load_templates(checkout)
    facts = generator_facts(checkout)
    settings = resolved(cfg, settings)
    assert settings.backend is not None
    path = generated_path(settings, stem, provider_for(facts, provider, model), model)
    user = body_text(cfg, checkout, settings, reference)
    if facts.footer is not None:
        user += _render_fstring(facts.footer, {facts.footer_name: path})
    return PkbPrompt(system_text(cfg, facts, settings.backend), user,
                     _record(checkout, settings, "generate_kernel", solution_path=path, stem=stem))


def agent_prompt(checkout: Path, reference: str, stem: str, *, root: str, eval_command: str,
                 settings: PkbSettings = PkbSettings()) -> PkbPrompt:
    """PKB's agent task for one problem: the backend's agent system text (else the default one), and the
    task template around the generator's body, with `root` as the repository root the shell starts in and
    `eval_command` as the command that checks the file."""
    cfg = load_templates(checkout)
    facts = generator_facts(checkout)
    settings = resolved(cfg, settings)
    assert settings.backend is not None
    rel = PKB_AGENT_FILE.format(backend=settings.backend, stem=stem)
    body = body_text(cfg, checkout, settings, reference)
    if facts.footer is not None:
        body += _render_fstring(facts.footer, {facts.footer_name: rel})
    templates = _table(cfg, "templates", "agent_kernel")
    values = {"rel_target": rel, "problem_arg": stem, "problem_stem": stem, "backend": settings.backend}
    remote = str(templates.get("remote_eval") or "").strip()
    if not remote:
        raise PkbPromptError(f"{TEMPLATES}: [templates.agent_kernel] has no remote_eval")
    remote = remote.format(eval_command=eval_command, dry_command=_no_dryrun_text(checkout), **values)
    task = str(templates.get("task") or "").strip()
    if not task:
        raise PkbPromptError(f"{TEMPLATES}: [templates.agent_kernel] has no task")
    user = task.format(project_root=root, rel=rel, ref_rel=PKB_REFERENCE_FILE.format(stem=stem),
                       backend=settings.backend, remote_block=f"\n{remote}\n", prompt_body=body)
    own = ((cfg.get("backends") or {}).get(settings.backend) or {}).get("agent_system_prompt")
    fallback = (cfg.get("agent_kernel") or {}).get("default_system_prompt")
    system = next((t.strip() for t in (own, fallback) if isinstance(t, str) and t.strip()), None)
    if system is None:
        raise PkbPromptError(f"{TEMPLATES}: no agent_system_prompt for {settings.backend} and no default")
    return PkbPrompt(system, user, _record(checkout, settings, "generate_kernel_agent", solution_path=rel,
                                           reference_path=PKB_REFERENCE_FILE.format(stem=stem), stem=stem))


def _no_dryrun_text(checkout: Path) -> str:
    """What PKB's agent puts where its task template names the dry-run command when there is none: the
    string its `_remote_verify_section` falls back to (read from the checkout; empty if not found)."""
    try:
        tree = ast.parse(_read(checkout, AGENT_GENERATOR))
    except (PkbPromptError, SyntaxError):
        return ""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_remote_verify_section":
            for inner in ast.walk(node):
                if (isinstance(inner, ast.IfExp) and isinstance(inner.orelse, ast.Constant)
                        and isinstance(inner.orelse.value, str)):
                    return inner.orelse.value
    return ""


# -- reading code out of a reply, PKB's way ---------------------------------------------------------------

def _block(text: str, opening: str) -> str | None:
    """What PKB's `re.search(opening + r"\\s*\\n(.*?)```", text, re.DOTALL)` finds, in one pass: the first
    `opening` followed by blanks holding a newline, up to the next ```. (The pattern backtracked
    quadratically over a long blank run after an unclosed fence.)"""
    pos = 0
    while (start := text.find(opening, pos)) >= 0:
        blank = end = start + len(opening)
        while end < len(text) and text[end].isspace():
            end += 1
        newline = text.rfind("\n", blank, end)
        if newline < 0:
            pos = start + 1
            continue
        close = text.find("```", end)  # none here, none for any later opening either
        return None if close < 0 else text[newline + 1:close]
    return None


def first_block(reply: str) -> str:
    """PKB's rule: the first ```python block, else the first untagged ``` block, else the whole reply
    (stripped); the code itself stripped too. An empty result means no code."""
    text = reply.strip()
    for opening in ("```python", "```"):
        found = _block(text, opening)
        if found is not None:
            return found.strip()
    return text
