"""Which prompt a sample opens with, and how its code is read back: this project's own (prompts/) or
ParallelKernelBench's (`--prompt pkb`: prompts.pkb_generator, assembled at run time from the user's
checkout). Every sample records which prompt and which extraction rule it used.

- zero-shot, `--prompt pkb`: PKB generator's system and user text (its template, in-context example,
  hardware profile, precision text and footer) and PKB's rule for the code (the first ```python block);
- bash, `--prompt pkb`: PKB agent's system text and task (the generator's body inside its task template),
  with the scratch folder as the repository root, the reference at PKB's path and `pkb-check <file>` as
  the evaluation command; the file at PKB's solution path is scored;
- otherwise this project's prompts and its rule (the last ```python block), or for bash the shell's
  `solution.py`.
The structured-tool agent has no PKB counterpart: `--prompt pkb` applies to zero-shot and bash only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

import prompts
from agent.conditions import AGENT, BASH, Condition
from prompts import pkb_generator

OURS = "pkb-agent"
PKB = "pkb"
OUR_RULE = "pkb-agent:last-python-block"
SHELL_RULE = "shell-file"  # the bash condition: the file in the scratch folder, not the reply


class PromptChoiceError(ValueError):
    """A --prompt that cannot be used as asked; one line."""


@dataclass(frozen=True)
class PromptChoice:
    name: str = OURS
    checkout: str | None = None  # PKB's prompts: the checkout they are read from
    hardware: str | None = pkb_generator.DEFAULT_HARDWARE
    precision: str | None = None  # the run's --precision; None: the checkout's meta.default_precision

    @property
    def settings(self) -> pkb_generator.PkbSettings:
        return pkb_generator.PkbSettings(precision=self.precision, hardware=self.hardware)


def parse_prompt(text: str | None, source: str | None, hardware: str | None = None,
                 precision: str | None = None) -> PromptChoice:
    """`pkb-agent` (default), `pkb` (the checkout of --source pkb:PATH) or `pkb:PATH`, checked now: the
    checkout must have PKB's generator and templates, and the hardware profile and precision must be among them."""
    text = (text or OURS).strip()
    if text == OURS:
        if hardware is not None:
            raise PromptChoiceError("--pkb-hardware applies to --prompt pkb")
        return PromptChoice()
    name, sep, path = text.partition(":")
    if name != PKB:
        raise PromptChoiceError(f"unknown --prompt {text!r}: use {OURS}, {PKB} or {PKB}:CHECKOUT")
    if not sep:
        if not (source or "").startswith("pkb:"):
            raise PromptChoiceError("--prompt pkb reads PKB's templates from a checkout: give --prompt pkb:CHECKOUT "
                                    "or --source pkb:CHECKOUT")
        path = str(source)[4:]
    checkout = Path(path).expanduser().resolve()
    hw = None if hardware == "none" else (hardware or pkb_generator.DEFAULT_HARDWARE)
    try:
        cfg = pkb_generator.load_templates(checkout)
        pkb_generator.generator_facts(checkout)
        pkb_generator.resolved(cfg, pkb_generator.PkbSettings(precision=precision, hardware=hw))
    except pkb_generator.PkbPromptError as err:
        raise PromptChoiceError(str(err)) from None
    return PromptChoice(PKB, str(checkout), hw, precision)


def check_conditions(choice: PromptChoice, conditions: list[Condition]) -> None:
    if choice.name == PKB and any(c.kind == AGENT for c in conditions):
        raise PromptChoiceError("--prompt pkb applies to zero-shot and bash; PKB has no structured-tool agent to "
                                "take a prompt from")


@dataclass
class Opening:
    """A sample's first messages, the record of where they came from, and for bash the scratch folder's
    files and the file that is scored."""

    messages: list[BaseMessage]
    record: dict[str, Any]
    shell_files: dict[str, str] = field(default_factory=dict)
    solution_file: str = prompts.SHELL_SOLUTION


def reference_text(problem: Any) -> str:
    """What PKB's prompt shows as the reference: a PKB problem's whole reference file, as PKB's generator
    reads it; for this suite's problems the reference as this project shows it (the oracle, the answer key,
    stays out)."""
    if getattr(problem, "origin", "") == "pkb":
        return Path(problem.path).read_text(encoding="utf-8")
    return prompts.reference_source(problem.path).strip() + "\n"


def opening(choice: PromptChoice, condition: Condition, problem: Any, *, shape: str, world_size: int,
            topology: dict[str, Any] | None, guide_in_prompt: bool, model_name: str, scratch: Path | None) -> Opening:
    if choice.name == PKB:
        return _pkb_opening(choice, condition, problem, model_name, scratch)
    if condition.kind == BASH:
        system = prompts.render_bash_system(guide_in_prompt)
        task = prompts.render_task(problem, shape, world_size, topology, include_guide=False, answer="shell")
        return Opening([SystemMessage(content=system), HumanMessage(content=task)],
                       {"name": OURS, "extraction": f"{SHELL_RULE}:{prompts.SHELL_SOLUTION}"},
                       {prompts.SHELL_REFERENCE: prompts.reference_source(problem.path).strip() + "\n"})
    tools = list(condition.bound_tools)
    # The guide goes into the system prompt unless the condition offers it as a tool (or it is switched off).
    system = prompts.render_system(tools, guide_in_prompt and "guide" not in tools)
    task = prompts.render_task(problem, shape, world_size, topology, include_guide=False)
    return Opening([SystemMessage(content=system), HumanMessage(content=task)], {"name": OURS, "extraction": OUR_RULE})


def _pkb_opening(choice: PromptChoice, condition: Condition, problem: Any, model_name: str,
                 scratch: Path | None) -> Opening:
    assert choice.checkout is not None
    checkout = Path(choice.checkout)
    reference = reference_text(problem)
    provider, _, model = model_name.partition(":")
    try:
        if condition.kind == BASH:
            assert scratch is not None
            rel = pkb_generator.PKB_AGENT_FILE.format(backend=_backend(checkout), stem=problem.name)
            built = pkb_generator.agent_prompt(checkout, reference, problem.name, root=str(scratch),
                                               eval_command=f"pkb-check {rel}", settings=choice.settings)
            ref_rel = built.record["reference_path"]
            record = {**built.record, "extraction": f"{SHELL_RULE}:{rel}", "reference_origin": _origin(problem)}
            return Opening([SystemMessage(content=built.system), HumanMessage(content=built.user)], record,
                           {ref_rel: reference}, rel)
        built = pkb_generator.zero_shot_prompt(checkout, reference, problem.name, provider=provider, model=model,
                                               settings=choice.settings)
    except pkb_generator.PkbPromptError as err:
        raise PromptChoiceError(str(err)) from None
    return Opening([SystemMessage(content=built.system), HumanMessage(content=built.user)],
                   {**built.record, "reference_origin": _origin(problem)})


def _backend(checkout: Path) -> str:
    settings = pkb_generator.resolved(pkb_generator.load_templates(checkout), pkb_generator.PkbSettings())
    assert settings.backend is not None
    return settings.backend


def _origin(problem: Any) -> str:
    return ("the PKB checkout's reference file" if getattr(problem, "origin", "") == "pkb"
            else "this suite's reference as pkb-agent shows it (solution and what it uses; no oracle)")


def extract(record: dict[str, Any], reply: str) -> str | None:
    """The code of a text reply by the rule the sample's prompt record names."""
    if record.get("extraction") == pkb_generator.PKB_RULE:
        code = pkb_generator.first_block(reply)
        return code + "\n" if code.strip() else None
    return prompts.extract_code(reply)
