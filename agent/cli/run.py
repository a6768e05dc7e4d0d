"""`pkb run`: run a model (or replay solution files) on problems under one or more conditions, k samples each.

    pkb run --model openai:gpt-5.4 --condition zero-shot,agent --problems collective --samples 3
    pkb run --model openai:my-model --base-url http://localhost:8000/v1 --condition agent:check+compile ...
    pkb run --model replay:solutions/ --problems all_reduce            # scores files, no API key
    pkb run --run-id ID --resume                                       # continues a killed run
    pkb run --run-id ID --retry-infra                                  # judges its infra_error samples again
    pkb run ... --executor ray --ray-address HEAD:6379                 # evaluations on a Ray cluster (docs/ray.md)
    pkb run --model openai:gpt-5.5 --reasoning-effort high ...         # reasoning settings (docs/models.md)
    pkb run --model anthropic:claude-haiku-4-5 --thinking-budget 16000 ...

Everything lands in runs/<id>/ (docs/run-layout.md). With --resume the run's stored config is used; an
option given again must agree with it; the executor is not part of the run, so a run started on one resumes
on the other. Bad input is one line and exit code 2; a run that ends with
unfinished samples (provider outages, internal errors) or samples still in infra_error exits 1 and says how
to continue it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from agent.budgets import Budget
from agent.cli import emulation, sandbox_gate
from agent.cli.common import CliError, Parser
from agent.cli.options import add_executor_arguments, add_source_argument

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a model on problems under conditions (or replay solution files)",
                       description="Run samples of a model on problems; everything goes to runs/<id>/.")
    add_arguments(p)
    p.set_defaults(handler=cmd_run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="openai:MODEL, anthropic:MODEL, replay:DIR or scripted:FILE.json (required, "
                   "but with --resume)")
    p.add_argument("--condition", action="append", default=None,
                   help="zero-shot, agent, agent:<tool>+<tool>, bash (comma-separated or repeated; default zero-shot)")
    p.add_argument("--prompt", default=None,
                   help="pkb-agent (default: this project's prompts), or pkb / pkb:CHECKOUT: ParallelKernelBench's own "
                        "prompt and code rule, assembled from the checkout's kernelgen/ (zero-shot and bash)")
    p.add_argument("--shell-timeout", type=float, default=None,
                   help="bash condition: seconds one shell command may run (default 120; PKB's agent: 900)")
    p.add_argument("--pkb-hardware", default=None, choices=("h100_8", "b200_72", "none"),
                   help="with --prompt pkb: PKB's hardware profile (default h100_8, as its published sets)")
    p.add_argument("--tools", default=None, help="tools of a plain `agent` condition, comma-separated (default: "
                   "all tools)")
    p.add_argument("--problems", nargs="+", default=None,
                   help="names, globs, categories (default: all; replay: the problems the directory solves)")
    add_source_argument(p, help="pkb:PATH to run a ParallelKernelBench checkout's problems (default: this suite)")
    p.add_argument("--samples", type=int, default=None,
                   help="samples per problem and condition (default 1; replay: every file, at most this many)")
    p.add_argument("--run-id", default=None, help="the run's folder name under --runs-dir (default: time + model)")
    p.add_argument("--resume", action="store_true", help="continue the run --run-id: finished samples are kept, "
                   "those that ended in infra_error (the harness's failure) are judged again")
    p.add_argument("--retry-infra", action="store_true",
                   help="judge again only the samples of the run --run-id that ended in infra_error (their earlier "
                        "records are kept in the sample's attempts/)")
    p.add_argument("--precision", default=None,
                   help="with a ParallelKernelBench checkout (--source pkb:PATH or --prompt pkb): bf16 or fp32, the "
                        "inputs' dtype, the tolerance and PKB's prompt (default: the replayed set's, from its folder "
                        "name, else bf16)")
    p.add_argument("--concurrency", type=int, default=1, help="samples run at once (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default cpu")
    p.add_argument("--world-size", type=int, default=None, help="ranks (default 2)")
    emulation.add_argument(p, default=None)
    p.add_argument("--shape", default=None, help="shape name (default: 'small' on cpu, 'default' on cuda)")
    p.add_argument("--base-url", default=None, help="an OpenAI-compatible server (vLLM, SGLang, Together, ...) "
                   "(default: the provider's API)")
    p.add_argument("--api-key-env", default=None, help="the environment variable holding the API key (default: "
                   "the provider's, e.g. OPENAI_API_KEY)")
    p.add_argument("--budget-turns", type=int, default=None, help=f"model calls per sample (default "
                   f"{Budget().max_turns}; 0: no limit)")
    p.add_argument("--budget-tokens", type=int, default=None, help="input and output tokens per sample, each "
                   "(default: no limit)")
    p.add_argument("--budget-input-tokens", type=int, default=None,
                   help="input tokens per sample (default: --budget-tokens, else no limit)")
    p.add_argument("--budget-output-tokens", type=int, default=None,
                   help="output tokens per sample (default: --budget-tokens, else no limit)")
    p.add_argument("--budget-cost", type=float, default=None, help="dollars per sample, needs the model's price "
                   "(default: no limit)")
    p.add_argument("--budget-wall", type=float, default=None, help=f"seconds per sample (default "
                   f"{Budget().max_wall_s:g}; 0: no limit)")
    p.add_argument("--budget-gpu", type=float, default=None, help="GPU seconds per sample (default: no limit)")
    p.add_argument("--prices", default=None, help="price table JSON (default: the packaged agent/prices.json)")
    p.add_argument("--trials", type=int, default=None, help="correctness trials of each evaluation (default 5)")
    p.add_argument("--seed", type=int, default=None, help="the tools' seed; the final scoring uses a fresh one "
                   "(default 0)")
    p.add_argument("--no-timing", action="store_true", help="check correctness only (no speedups)")
    p.add_argument("--evaluations-per-gpu", type=int, default=1,
                   help="with --no-timing on CUDA: evaluations that may hold the same GPUs at once (default 1); "
                        "one that shared and ended in a verdict a neighbour could have caused is judged again alone")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the model's)")
    p.add_argument("--max-reply-tokens", type=int, default=None, help="output-token limit of one model reply "
                   "(default: the provider's)")
    p.add_argument("--reasoning-effort", default=None,
                   help="reasoning effort (OpenAI reasoning_effort; Anthropic adaptive thinking's effort, or a "
                        "thinking budget from the model table for budget models): e.g. low, medium, high "
                        "(default: the model's own)")
    p.add_argument("--thinking-budget", type=int, default=None,
                   help="Anthropic extended thinking's budget_tokens (models that take a budget; at least 1024; "
                        "default: off)")
    p.add_argument("--models", default=None, help="model table JSON (default: the packaged agent/models.json)")
    p.add_argument("--context-window", type=int, default=None,
                   help="the model's context window in tokens (default: the model table's; unknown: not managed)")
    p.add_argument("--context-share", type=float, default=None,
                   help="shorten old candidates once a request passes this share of the window (default 0.5)")
    p.add_argument("--no-prompt-cache", action="store_true",
                   help="send no Anthropic cache breakpoints (to measure what caching saves)")
    p.add_argument("--no-guide", action="store_true",
                   help="leave the programming guide out of the prompt (a condition with the guide tool has it)")
    p.add_argument("--model-retries", type=int, default=5, help="attempts per model call on 429/5xx (default 5)")
    p.add_argument("--runs-dir", default="runs", help="where runs go (default ./runs)")
    sandbox_gate.add_argument(p)
    add_executor_arguments(p)


def cmd_run(args: argparse.Namespace) -> int:
    check_args(args)
    # Deferred: the run needs the model stack and the harness (langchain, langgraph, torch).
    from agent.cli import run_session

    return run_session.execute(args)


def check_args(args: argparse.Namespace) -> None:
    """What the arguments alone show, said before anything heavy is imported (`pkb sweep` checks its cells so)."""
    if args.concurrency < 1:
        raise CliError(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.evaluations_per_gpu < 1:
        raise CliError(f"--evaluations-per-gpu must be at least 1, got {args.evaluations_per_gpu}")
    if args.model_retries < 1:
        raise CliError(f"--model-retries must be at least 1, got {args.model_retries}")
    if args.resume and not args.run_id:
        raise CliError("--resume needs --run-id (the folder name under --runs-dir)")
    if args.retry_infra and not args.run_id:
        raise CliError("--retry-infra needs --run-id (the folder name under --runs-dir)")
    if args.run_id and not RUN_ID.match(args.run_id):
        raise CliError(f"--run-id {args.run_id!r}: use letters, digits, '.', '_' and '-' (no '/')")
    if not (args.resume or args.retry_infra) and not args.model:
        raise CliError("--model is required (openai:MODEL, anthropic:MODEL, replay:DIR or scripted:FILE.json)")
    sandbox_gate.require(args, "pkb run")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m agent.cli.run ...` is `pkb run ...`."""
    parser = Parser(prog="pkb run", description="Run samples of a model on problems.")
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, or a usage error said in one line (agent.cli.common.Parser)
        return done.code if isinstance(done.code, int) else 2
    try:
        return cmd_run(args)
    except CliError as err:
        print(f"pkb: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the run had anything to stop (as `pkb run` says it)
        print("pkb: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
