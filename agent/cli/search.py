"""`pkb search`: an overnight kernel search per problem, with an archive that learns from every kernel tried.

    pkb search --model anthropic:claude-sonnet-5 --problems collective --device cuda --world-size 2 \\
               --budget-gpu-hours 8 --budget-cost 50 --target-fraction 0.8 --run-id night
    pkb search --run-id night --resume                     # after a kill, a reboot, an outage
    pkb search ... --executor ray --ray-address HEAD:6379   # evaluations on a Ray cluster
    pkb report runs/night                                  # the morning report

Everything lands in runs/<id>/ (agent.search.layout; docs/search.md). With --resume the stored config is
used: options that would change it are refused. The live view is a table on the terminal (when stdout is
one) and runs/<id>/live.html, which refreshes itself. Exit codes: 0 when the search ended by its budgets
or stop rules; 1 when it stopped early (model unreachable, provider down, an internal error: --resume
continues); 2 for bad input.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cli import emulation, sandbox_gate
from agent.cli.common import CliError, Parser, console, err_console, leave, plain
from agent.cli.options import add_executor_arguments, executor_from_args
from agent.model_spec import ProviderError, parse_model_spec
from agent.search.config import STRATEGIES, Limits, SearchConfig, StopConfig, StrategyConfig

if TYPE_CHECKING:
    from agent.scheduler import DeviceScheduler
    from agent.search.layout import SearchDir
    from agent.usage import PriceTable
    from harness.problems.problem import Problem

# (option, dest): every option that sets the search's config; refused with --resume.
CONFIG_OPTIONS = (
    ("--model", "model"), ("--problems", "problems"), ("--source", "source"), ("--device", "device"),
    ("--world-size", "world_size"), ("--ranks-per-gpu", "ranks_per_gpu"), ("--shape", "shape"), ("--seed", "seed"),
    ("--trials", "trials"), ("--proposer", "proposer"), ("--proposer-turns", "proposer_turns"),
    ("--no-timing", "no_timing"), ("--phase-timeout", "phase_timeout"), ("--fresh-reference", "fresh_reference"),
    ("--timing-iters", "timing_iters"),
    ("--strategy", "strategy"),
    ("--islands", "islands"), ("--migration-interval", "migration_interval"), ("--top-k", "top_k"),
    ("--explore", "explore"), ("--inspirations", "inspirations"), ("--window", "window"), ("--warmup", "warmup"),
    ("--budget-candidates", "budget_candidates"), ("--budget-gpu-hours", "budget_gpu_hours"),
    ("--budget-cost", "budget_cost"), ("--budget-tokens", "budget_tokens"), ("--budget-hours", "budget_hours"),
    ("--problem-candidates", "problem_candidates"), ("--problem-gpu-hours", "problem_gpu_hours"),
    ("--problem-cost", "problem_cost"), ("--problem-tokens", "problem_tokens"), ("--problem-hours", "problem_hours"),
    ("--target-fraction", "target_fraction"), ("--target-speedup", "target_speedup"), ("--patience", "patience"),
    ("--min-gain", "min_gain"), ("--remeasure", "remeasure"),
    ("--remeasure-top", "remeasure_top"), ("--keep-logs", "keep_logs"),
    ("--base-url", "base_url"), ("--api-key-env", "api_key_env"), ("--prices", "prices"),
    ("--temperature", "temperature"), ("--max-reply-tokens", "max_reply_tokens"), ("--no-guide", "no_guide"),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("search", help="search for the best kernel of each problem (overnight; resumable)",
                       description="Search per problem with an archive of every candidate; runs/<id>/.")
    add_arguments(p)
    p.set_defaults(handler=cmd_search)


def add_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_argument_group("what to search")
    what.add_argument("--model", help="openai:MODEL, anthropic:MODEL, or scripted:mutator[:RATES] (offline); required, "
                      "but with --resume")
    what.add_argument("--problems", nargs="+", help="names, globs or categories (default: all)")
    what.add_argument("--source", help="pkb:PATH to search a ParallelKernelBench checkout's problems (default: "
                                           "this suite)")
    what.add_argument("--device", choices=("cpu", "cuda"), help="default cpu")
    what.add_argument("--world-size", type=int, help="ranks (default 2)")
    emulation.add_argument(what, default=None)
    what.add_argument("--shape", help="shape name (default: 'small' on cpu, 'default' on cuda)")
    what.add_argument("--seed", type=int, help="seed of every draw and of the tools' inputs (default 0)")
    what.add_argument("--trials", type=int, help="correctness trials per evaluation (default 5)")
    what.add_argument("--no-timing", action="store_true", default=None, help="correctness only (nothing to rank by)")
    what.add_argument("--phase-timeout", type=float, help="cap on the harness's load/check/timing limits, "
                      "seconds (default: "
                                                                 "the harness's limits)")
    what.add_argument("--timing-iters", type=int, help="timed iterations per side (default: the device's)")
    what.add_argument("--fresh-reference", action="store_true", default=None,
                      help="time the reference beside every candidate (a shared machine whose speed drifts)")
    how = p.add_argument_group("strategy")
    how.add_argument("--proposer", help="how a candidate is proposed, named like a condition: zero-shot (one model "
                                        "call, default) or agent:<tool>+<tool> (an agent episode that may compile "
                                        "and check before an evaluation is spent)")
    how.add_argument("--proposer-turns", type=int, help="model calls of an agent proposer's episode (default 4)")
    how.add_argument("--strategy", choices=STRATEGIES, help="independent (the control), best_first (default), "
                                                           "islands")
    how.add_argument("--islands", type=int, help="islands (default 3)")
    how.add_argument("--migration-interval", type=int, help="candidates of a problem between migrations (default 6)")
    how.add_argument("--top-k", type=int, help="best_first: pool of a non-greedy pick (default 4)")
    how.add_argument("--explore", type=float, help="best_first: chance of a non-greedy pick (default 0.25)")
    how.add_argument("--inspirations", type=int, help="islands: kernels shown beside the parent (default 1)")
    how.add_argument("--window", type=int, help="candidates in flight (default 2 x evaluation capacity + 1)")
    how.add_argument("--warmup", type=int, help="candidates per problem before the budget follows the gap (default 2)")
    limits = p.add_argument_group("budgets and stop rules (whole search; --problem-*: each problem)")
    # At least one budget or stop rule is required (a search without one would never end).
    limits.add_argument("--budget-candidates", type=int, help="candidates in all (default: no limit)")
    limits.add_argument("--budget-gpu-hours", type=float, help="device hours in all (default: no limit)")
    limits.add_argument("--budget-cost", type=float, help="dollars in all, needs the model's price (default: no limit)")
    limits.add_argument("--budget-tokens", type=int, help="model tokens in all (default: no limit)")
    limits.add_argument("--budget-hours", type=float,
                        help="wall-clock hours, time killed not counted (default: no limit)")
    limits.add_argument("--problem-candidates", type=int, help="candidates per problem (default: no limit)")
    limits.add_argument("--problem-gpu-hours", type=float, help="device hours per problem (default: no limit)")
    limits.add_argument("--problem-cost", type=float, help="dollars per problem (default: no limit)")
    limits.add_argument("--problem-tokens", type=int, help="model tokens per problem (default: no limit)")
    limits.add_argument("--problem-hours", type=float, help="wall-clock hours per problem (default: no limit)")
    limits.add_argument("--target-fraction", type=float,
                        help="stop a problem at this roofline fraction (default: no target)")
    limits.add_argument("--target-speedup", type=float, help="stop a problem at this speedup (default: no target)")
    limits.add_argument("--patience", type=int,
                        help="stop a problem after N candidates without improvement (default: no limit)")
    limits.add_argument("--min-gain", type=float, help="relative gain that counts as improvement (default 0.02)")
    # --rescore-seeds and --rescore-candidates: their names until 2026-12-06 (a sweep file may still use them)
    limits.add_argument("--remeasure", "--rescore-seeds", dest="remeasure", type=int, metavar="K",
                        help="at the end, each top kernel is evaluated afresh K times (fresh seeds, the reference "
                             "timed beside it, the held-out shapes checked); reported: median and interval "
                             "(default 3)")
    limits.add_argument("--remeasure-top", "--rescore-candidates", dest="remeasure_top", type=int, metavar="N",
                        help="the N best distinct kernels by the search's own figure are re-measured per problem; "
                             "the best by re-measured median is reported (default 3)")
    model = p.add_argument_group("model")
    model.add_argument("--base-url", help="an OpenAI-compatible server (default: the provider's API)")
    model.add_argument("--api-key-env", help="the environment variable holding the API key (default: the "
                                             "provider's, e.g. OPENAI_API_KEY)")
    model.add_argument("--prices", help="price table JSON (default: agent/prices.json)")
    model.add_argument("--temperature", type=float, help="sampling temperature (default: the model's)")
    model.add_argument("--max-reply-tokens", type=int, help="output-token limit of one reply (default: the "
                                                            "provider's)")
    model.add_argument("--no-guide", action="store_true", default=None, help="leave the guide out of the prompt")
    run = p.add_argument_group("running")
    run.add_argument("--run-id", help="the search's folder under --runs-dir (default: time + model)")
    run.add_argument("--resume", action="store_true", help="continue the search --run-id where it stopped")
    run.add_argument("--runs-dir", default="runs", help="where searches go")
    run.add_argument("--keep-logs", action="store_true", default=None, help="keep every evaluation's rank logs")
    run.add_argument("--no-live", action="store_true", help="no live table on the terminal (live.html is written)")
    # For tests and benchmarks of the loop: a module with evaluate() (harness.evaluate.evaluate's signature)
    # and optionally bound(problem) -> roofline record, used instead of the harness.
    run.add_argument("--evaluator", help=argparse.SUPPRESS)
    sandbox_gate.add_argument(p)
    add_executor_arguments(p)


# -- config -----------------------------------------------------------------------------------------------
def _given(args: argparse.Namespace) -> list[str]:
    return [option for option, dest in CONFIG_OPTIONS if getattr(args, dest, None) not in (None, False)]


def _model_text(text: str) -> str:
    try:
        spec = parse_model_spec(text)
    except ProviderError as err:
        raise CliError(str(err)) from None
    if spec.provider == "replay":
        raise CliError("pkb search needs a model that writes code: replay:DIR only scores existing files (pkb run)")
    return spec.text


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def config_from_args(args: argparse.Namespace, problems: list[str], capacity: int) -> SearchConfig:
    if not args.model:
        raise CliError("--model is required (openai:MODEL, anthropic:MODEL or scripted:mutator)")
    device = args.device or "cpu"
    positive = {"--trials": args.trials, "--window": args.window, "--islands": args.islands,
                "--world-size": args.world_size, "--remeasure": args.remeasure,
                "--remeasure-top": args.remeasure_top, "--proposer-turns": args.proposer_turns,
                "--ranks-per-gpu": args.ranks_per_gpu}
    for option, value in positive.items():
        if value is not None and value < 1:
            raise CliError(f"{option} must be at least 1, got {value}")
    try:
        return SearchConfig(
            model=_model_text(args.model), problems=problems, source=args.source, device=device,
            world_size=_pick(args.world_size, 2), ranks_per_gpu=_pick(args.ranks_per_gpu, 1),
            proposer=_pick(args.proposer, "zero-shot"), proposer_turns=_pick(args.proposer_turns, 4),
            shape=args.shape or ("default" if device == "cuda" else "small"),
            seed=_pick(args.seed, 0), trials=_pick(args.trials, 5), skip_timing=bool(args.no_timing),
            phase_timeout_s=args.phase_timeout, fresh_reference=bool(args.fresh_reference),
            timing_iters=args.timing_iters,
            strategy=StrategyConfig(**{k: v for k, v in {
                "name": args.strategy, "islands": args.islands, "migration_interval": args.migration_interval,
                "top_k": args.top_k, "explore": args.explore, "inspirations": args.inspirations}.items()
                if v is not None}),
            budget=Limits(candidates=args.budget_candidates, gpu_hours=args.budget_gpu_hours,
                          cost_usd=args.budget_cost, tokens=args.budget_tokens, wall_hours=args.budget_hours),
            per_problem=Limits(candidates=args.problem_candidates, gpu_hours=args.problem_gpu_hours,
                               cost_usd=args.problem_cost, tokens=args.problem_tokens, wall_hours=args.problem_hours),
            stop=StopConfig(**{k: v for k, v in {"target_fraction": args.target_fraction,
                                                 "target_speedup": args.target_speedup, "patience": args.patience,
                                                 "min_gain": args.min_gain}.items() if v is not None}),
            window=_pick(args.window, 2 * capacity + 1), warmup=_pick(args.warmup, 2),
            remeasure=_pick(args.remeasure, 3), remeasure_top=_pick(args.remeasure_top, 3),
            keep_logs=bool(args.keep_logs), base_url=args.base_url,
            api_key_env=args.api_key_env, prices=str(Path(args.prices).resolve()) if args.prices else None,
            temperature=args.temperature, max_reply_tokens=args.max_reply_tokens,
            guide_in_prompt=not args.no_guide,
        )
    except ValueError as err:  # pydantic's ValidationError: the first problem, on one line
        first = str(err).splitlines()
        raise CliError(f"bad search options: {' '.join(first[1:3]) if len(first) > 2 else first[0]}") from None


def _problems(source: str | None, selection: Sequence[str] | None, world_size: int,
              shape: str) -> tuple[list[Problem], list[str]]:
    """The problems to search, and the names of selected ones left out (no such world size)."""
    from agent.cli import source as cli_source  # the suite or a checkout: loads torch

    chosen = cli_source.select_in(cli_source.resolve_source(source), selection)
    usable = [p for p in chosen if p.supports(world_size)]
    if not usable:
        raise CliError(f"no selected problem supports world size {world_size}")
    for p in usable:
        cli_source.check_shape(p, shape)
    return usable, [p.name for p in chosen if p not in usable]


def _prices(config: SearchConfig) -> PriceTable:
    from agent.usage import PriceTableError, load_price_table  # the model stack: when the command runs

    try:
        prices = load_price_table(config.prices)
    except PriceTableError as err:
        raise CliError(str(err)) from None
    spec = parse_model_spec(config.model)
    if (config.budget.cost_usd is not None or config.per_problem.cost_usd is not None) \
            and prices.price(spec.text) is None:
        raise CliError(f"--budget-cost/--problem-cost: the price table {prices.source} has no price for "
                       f"{spec.text}; pass --prices FILE with one")
    return prices


def scheduler_for(device: str, world_size: int, executor: str, ranks_per_gpu: int = 1) -> DeviceScheduler | None:
    from agent.scheduler import DeviceScheduler, SchedulerError  # torch's device count: when it runs

    emulation.check(device, world_size, ranks_per_gpu)
    if executor != "local":
        if ranks_per_gpu > 1:
            raise CliError("--ranks-per-gpu runs on this machine's GPUs: leave --executor at local")
        return None
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise CliError("--device cuda: no CUDA device is visible on this machine")
        emulation.check(device, world_size, ranks_per_gpu, torch.cuda.device_count())
    try:
        return DeviceScheduler(device, world_size, ranks_per_gpu=ranks_per_gpu)
    except SchedulerError as err:
        raise CliError(str(err)) from None


def evaluator_from(name: str | None) -> tuple[Any, Any]:
    if not name:
        return None, None
    try:
        module = importlib.import_module(name)
    except ImportError as err:
        raise CliError(f"--evaluator {name}: {err}") from None
    if not callable(getattr(module, "evaluate", None)):
        raise CliError(f"--evaluator {name}: the module has no evaluate()")
    return module.evaluate, getattr(module, "bound", None)


# -- the command ------------------------------------------------------------------------------------------
def cmd_search(args: argparse.Namespace) -> int:
    # The search loop, the harness and the model stack: loaded when the command runs, not for --help.
    from agent import interrupts
    from agent.executors.ray_cluster import RayExecutor
    from agent.search import live
    from agent.search.layout import SearchDir, SearchError, create, load_config
    from agent.search.loop import INTERNAL_ERROR, Search
    from agent.search.stopping import MODEL_FATAL, PROVIDER_UNAVAILABLE

    if args.resume and not args.run_id:
        raise CliError("--resume needs --run-id (the folder name under --runs-dir)")
    sandbox_gate.require(args, "pkb search")
    directory: SearchDir | None = None
    stored: SearchConfig | None = None
    if args.resume:
        directory = SearchDir(Path(args.runs_dir) / args.run_id)
        try:
            stored = load_config(directory)
        except SearchError as err:
            raise CliError(str(err)) from None
        given = _given(args)
        if given:
            raise CliError(f"--resume continues search {args.run_id} as it was started; leave out {', '.join(given)}")
        device, world_size, shape, ranks_per_gpu = stored.device, stored.world_size, stored.shape, stored.ranks_per_gpu
        problems, skipped = _problems(stored.source, stored.problems, world_size, shape)
    else:
        if not args.model:
            raise CliError("--model is required (openai:MODEL, anthropic:MODEL or scripted:mutator)")
        _model_text(args.model)
        device, world_size = args.device or "cpu", _pick(args.world_size, 2)
        if world_size < 1:
            raise CliError(f"--world-size must be at least 1, got {world_size}")
        shape = args.shape or ("default" if device == "cuda" else "small")
        ranks_per_gpu = _pick(args.ranks_per_gpu, 1)
        problems, skipped = _problems(args.source, args.problems, world_size, shape)
    evaluate, bound = evaluator_from(args.evaluator)
    scheduler = scheduler_for(device, world_size, args.executor, ranks_per_gpu)
    executor = executor_from_args(args, device=device, world_size=world_size, scheduler=scheduler)
    interrupted: KeyboardInterrupt | None = None
    try:
        capacity = max(1, executor.capacity(world_size, device))
        config = stored or config_from_args(args, [p.name for p in problems], capacity)
        if directory is None:
            directory = SearchDir(Path(args.runs_dir) / (args.run_id or _default_run_id(config.model)))
            if directory.header.exists():
                raise CliError(f"search {directory.path} already exists; add --resume to continue it, or pick "
                               "another --run-id")
        prices = _prices(config)
        view = live.LiveView(directory, config, console=console, terminal=console.is_terminal and not args.no_live)
        try:  # builds the model client: a bad key or model stops here, before anything is written
            search = Search(directory, config, problems, executor=executor, evaluate=evaluate, bound=bound,
                            prices=prices, on_change=view.update, topology=_topology(config.device))
        except ProviderError as err:
            raise CliError(str(err)) from None
        if skipped:  # said once every check has passed, so that bad input stays one line
            print(f"pkb: skipping problem(s) without world size {world_size}: {', '.join(skipped)}", file=sys.stderr)
        if stored is None:
            try:
                create(directory, config, problems=problems, executor=executor.name)
            except SearchError as err:
                raise CliError(str(err)) from None
        if isinstance(executor, RayExecutor):
            print(f"pkb: evaluations go to the Ray cluster ({len(executor.nodes)} node(s), room for {capacity} at "
                  "once)", file=sys.stderr)
        def on_interrupt(running: int) -> None:
            view.stop()
            err_console.print(plain(f"pkb: interrupted; stopping {running} running slot(s), everything evaluated is "
                                    "kept (Ctrl-C again ends at once)"))

        search.on_interrupt = on_interrupt
        try:
            with view, interrupts.terminate_as_interrupt():
                if stored is not None:
                    say_what_is_left(directory, config)
                summary = search.run()
        # SearchInterrupted, or Ctrl-C before the search began (a Cancelled of a wait in the main thread arrives
        # as KeyboardInterrupt too: agent.interrupts.terminate_as_interrupt)
        except KeyboardInterrupt as err:
            interrupted = err
    finally:
        executor.close()  # also after Ctrl-C: a Ray instance started for this search is shut down
    resume = f"pkb search --run-id {directory.path.name} --resume --runs-dir {directory.path.parent}"
    if interrupted is not None:
        err_console.print(plain(f"pkb: search {directory.path.name} stopped; continue with: {resume}"))
        leave()
    live.print_summary(directory, config, console)
    console.print(f"stopped: {summary.stop_reason}   live: {directory.live_html}   report: pkb report {directory.path}")
    for line in summary.errors:
        console.print(plain(line), style="red")
    if summary.stop_reason in (MODEL_FATAL, PROVIDER_UNAVAILABLE, INTERNAL_ERROR) or summary.errors:
        console.print(plain(f"continue with: {resume}"))
        return 1
    return 0


def say_what_is_left(directory: SearchDir, config: SearchConfig) -> None:
    """`--resume`: what the search has done and what is left, or that nothing is."""
    from agent.search.archive import EVALUATED, Archive  # the search's archive: when the command runs

    with Archive(directory.archive) as archive:
        candidates = archive.candidates()
        stopped = archive.stops()
    evaluated = sum(1 for c in candidates if c.status == EVALUATED)
    unfinished = len(candidates) - evaluated
    active = [p for p in config.problems if p not in stopped]
    name = directory.path.name
    if not active and not unfinished:
        err_console.print(plain(f"pkb: search {name}: every problem has stopped ({evaluated} candidates evaluated); "
                                "nothing left to search (a re-scoring cut short is finished)"))
        return
    parts = [f"{evaluated} candidates evaluated"]
    if unfinished:
        parts.append(f"{unfinished} unfinished (done first)")
    parts.append(f"still searching: {', '.join(active)}" if active else "every problem has stopped")
    err_console.print(plain(f"pkb: resuming search {name}: " + "; ".join(parts)))


def _default_run_id(model: str) -> str:
    from agent.cli.run_config import default_run_id  # `pkb run`'s config module: when it runs

    return "search-" + default_run_id(model)


def _topology(device: str) -> dict[str, Any] | None:
    if device != "cuda":
        return None
    from agent.runner import topology_record  # the model stack: when the command runs

    return topology_record(device)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m agent.cli.search ...` is `pkb search ...` (without loading the other commands)."""
    parser = Parser(prog="pkb search", description="Search for the best kernel of each problem.")
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, or a usage error said in one line (agent.cli.common.Parser)
        return done.code if isinstance(done.code, int) else 2
    try:
        return cmd_search(args)
    except CliError as err:
        print(f"pkb: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the search had anything to stop (as `pkb search` says it)
        print("pkb: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
