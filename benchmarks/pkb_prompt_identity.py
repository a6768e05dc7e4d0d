"""Is the prompt `pkb run --prompt pkb` sends the one ParallelKernelBench's own generator builds?

    python benchmarks/pkb_prompt_identity.py CHECKOUT [--problems 1_allreduce 13_gemm_allreduce 54_ring_attention]
        [--model gpt-4.1] [--hardware h100_8 none] [--out DIR]

For each problem and hardware profile, two texts are built and compared character by character:
- ours: prompts.pkb_generator (what `--prompt pkb` sends), from the checkout's files;
- PKB's: the checkout's own `kernelgen/generate_kernel.py`, imported in a subprocess of its own and called
  directly (`system_prompt_for_backend`, `assemble_user_prompt` with the path `output_run_dir_relative`
  gives; no model is called, nothing leaves the machine), and `kernelgen/generate_kernel_agent.py`'s
  `_build_task` for the agent task (with our check command as the eval command).
PKB's generator needs the `toml` package (`pip install toml`) and the checkout's `utils/problem_id.py`.
`--model` must be one of the generator's ALLOWED_MODELS (the footer's folder names its provider).
Writes identity.json and identity.md into --out (default: print only); prints a table last; exits 1 on any
difference.
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prompts import pkb_generator  # noqa: E402  (after the path: run from anywhere)

DEFAULT_PROBLEMS = ("1_allreduce", "13_gemm_allreduce", "54_ring_attention")
EVAL_COMMAND = "pkb-check {rel}"  # what our bash condition's prompt names as the check command

# Runs in the checkout's interpreter context: PKB's own code, its own TOML reader, its own files.
PKB_SIDE = r"""
import argparse, json, sys
from pathlib import Path
root = Path(sys.argv[1]).resolve()
sys.path[:0] = [str(root / "kernelgen"), str(root)]
import toml
import generate_kernel as gk
import generate_kernel_agent as ga
request = json.loads(sys.argv[2])
cfg = toml.load(root / "kernelgen" / "prompts.toml")
backend = cfg["meta"].get("default_backend", "cuda")
out = []
for item in request:
    stem, hardware, model, precision = item["stem"], item["hardware"], item["model"], item["precision"]
    folder = gk.output_run_dir_relative(backend=backend, precision=precision, hardware=hardware, model=model)
    rel = f"{folder}/{stem}_{backend}.py"
    ref = gk._load_reference(root, stem)
    user = gk.assemble_user_prompt(cfg, backend=backend, precision=precision, ref_arch_src=ref, project_root=root,
                                   problem_stem=stem, hardware_key=hardware, solution_relative_path=rel)
    system = gk.system_prompt_for_backend(cfg, backend)
    agent_rel = f"solutions_{backend}/{stem}_{backend}.py"
    body = gk.assemble_user_prompt(cfg, backend=backend, precision=precision, ref_arch_src=ref, project_root=root,
                                   problem_stem=stem, hardware_key=hardware, solution_relative_path=agent_rel)
    args = argparse.Namespace(problem_arg=stem, backend=backend, m=1024, n=1024, dtype="bfloat16", trials=3,
                              measure_perf=True, remote_dryrun_command=None,
                              remote_eval_command=item["eval_command"])
    ctx = ga._placeholder_context(args, problem_stem=stem, rel_target=agent_rel)
    remote = ga._remote_verify_section(cfg, args, problem_stem=stem, ctx=ctx)
    task = ga._build_task(cfg, project_root=root, problem_id=stem, backend=backend, prompt_body=body,
                          remote_block=remote)
    out.append({"system": system, "user": user, "agent_system": ga._agent_system_prompt(cfg, backend),
                "agent_task": task})
print(json.dumps(out))
"""


def pkb_side(checkout: Path, request: list[dict[str, object]]) -> list[dict[str, str]]:
    proc = subprocess.run([sys.executable, "-c", PKB_SIDE, str(checkout), json.dumps(request)], capture_output=True,
                          text=True, timeout=300, cwd=str(checkout))
    if proc.returncode != 0:
        raise SystemExit(f"PKB's generator failed in its subprocess:\n{proc.stderr[-3000:]}")
    value: list[dict[str, str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return value


def first_difference(a: str, b: str) -> str:
    if a == b:
        return ""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first difference at character {i}: ours {a[i:i + 40]!r} / PKB's {b[i:i + 40]!r}"
    return f"one is a prefix of the other: {len(a)} vs {len(b)} characters"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("--problems", nargs="+", default=list(DEFAULT_PROBLEMS))
    parser.add_argument("--model", default="gpt-4.1", help="one of the generator's ALLOWED_MODELS")
    parser.add_argument("--hardware", nargs="+", default=[pkb_generator.DEFAULT_HARDWARE, "none"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    cfg = pkb_generator.load_templates(checkout)
    facts = pkb_generator.generator_facts(checkout)
    if args.model not in facts.models:
        raise SystemExit(f"--model {args.model!r} is not in the generator's ALLOWED_MODELS: {', '.join(facts.models)}")
    provider = facts.models[args.model]
    started = time.perf_counter()
    cases, request = [], []
    for stem in args.problems:
        reference = (checkout / pkb_generator.PKB_REFERENCE_FILE.format(stem=stem)).read_text(encoding="utf-8")
        for hw in args.hardware:
            settings = pkb_generator.resolved(cfg, pkb_generator.PkbSettings(hardware=None if hw == "none" else hw))
            ours = pkb_generator.zero_shot_prompt(checkout, reference, stem, provider=provider, model=args.model,
                                                  settings=settings)
            rel = pkb_generator.PKB_AGENT_FILE.format(backend=settings.backend, stem=stem)
            command = EVAL_COMMAND.format(rel=rel)
            agent = pkb_generator.agent_prompt(checkout, reference, stem, root=str(checkout), eval_command=command,
                                               settings=settings)
            cases.append({"problem": stem, "hardware": hw, "ours": ours, "agent": agent})
            request.append({"stem": stem, "hardware": settings.hardware, "model": args.model,
                            "precision": settings.precision, "eval_command": command})
    theirs = pkb_side(checkout, request)
    rows = []
    for case, pkb in zip(cases, theirs):
        ours, agent = case["ours"], case["agent"]
        pairs = {"system": (ours.system, pkb["system"]), "user": (ours.user, pkb["user"]),
                 "agent system": (agent.system, pkb["agent_system"]), "agent task": (agent.user, pkb["agent_task"])}
        for part, (a, b) in pairs.items():
            rows.append({"problem": case["problem"], "hardware": case["hardware"], "part": part,
                         "identical": a == b, "characters": len(a), "pkb_characters": len(b),
                         "difference": first_difference(a, b),
                         "diff": "".join(difflib.unified_diff(b.splitlines(True), a.splitlines(True), "pkb",
                                                              "ours"))[:4000]})
    seconds = time.perf_counter() - started
    same = sum(r["identical"] for r in rows)
    summary = {"checkout": str(checkout), "model": args.model, "provider": provider, "files": ours.record["files"],
               "rows": rows, "identical": same, "compared": len(rows), "seconds": round(seconds, 2)}
    table = ["| problem | hardware | part | identical | characters (ours / PKB's) |", "|---|---|---|---|---|"]
    table += [f"| {r['problem']} | {r['hardware']} | {r['part']} | "
              f"{'yes' if r['identical'] else 'NO: ' + r['difference']} | {r['characters']} / {r['pkb_characters']} |"
              for r in rows]
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "identity.json").write_text(json.dumps(summary, indent=1))
        (args.out / "identity.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    print(f"{same} of {len(rows)} texts identical ({seconds:.1f} s)")
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
