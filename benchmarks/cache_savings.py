"""Input tokens a 30-turn agent session bills with and without prompt caching, per provider.

The session is the scripted one of tests/agent/test_model_apis.py, run through the real loop (LangGraph,
LangChain, the SDKs, HTTP) against the local fake servers of tests/fakes, with this suite's real prompts
(system prompt with the guide, tool schemas, the all_reduce task) and a real expert kernel as every
candidate (problems/collective/solutions/all_reduce__two_shot_push.py); the tool answers are the real
tools' renderings of made-up verdicts. The servers count tokens with tiktoken (cl100k_base, the only
encoding available offline; Claude's own tokenizer gives other counts) and cache as the real APIs do
(tests/fakes: OpenAI's automatic prefix cache, Anthropic's breakpoints). Costs are priced with the
packaged agent/prices.json.

    python benchmarks/cache_savings.py [--turns 30] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import prompts  # noqa: E402
from agent.conditions import parse_condition  # noqa: E402
from agent.rundir import RunDir  # noqa: E402
from agent.runner import RunConfig, Runner, create_run  # noqa: E402
from agent.scheduler import DeviceScheduler  # noqa: E402
from agent.usage import load_price_table  # noqa: E402
from harness.config import EvalConfig  # noqa: E402
from harness.problems.registry import get, load_suite  # noqa: E402
from tests.fakes.anthropic_api import AnthropicFake, AnthropicModel  # noqa: E402
from tests.fakes.openai_api import OpenAIFake, OpenAIModel  # noqa: E402
from tests.fakes.session import EXPERT, FakeExecutor, session_brain  # noqa: E402
from tools.render import count_tokens, tokenizer_name  # noqa: E402

CONDITION = "agent:bench+check+compile"  # the guide is in the system prompt: the largest stable prefix
MODELS = {"openai": "openai:gpt-5.5", "anthropic": "anthropic:claude-opus-4-8"}


def session(wire: str, turns: int, cached: bool, root: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    model = MODELS[wire]
    name = model.partition(":")[2]
    if wire == "openai":
        fake: Any = OpenAIFake(brain=session_brain(turns, thinking=False),
                               models={name: OpenAIModel(1_050_000, reasoning=True)}, cache=cached, count=count_tokens)
        url, extra = "/v1", {}
    else:
        fake = AnthropicFake(brain=session_brain(turns, thinking=False), models={name: AnthropicModel(1_000_000)},
                             count=count_tokens)
        url, extra = "", {"prompt_cache": cached}
    with fake:
        config = RunConfig(model=model, conditions=[CONDITION], samples=1, problems=["all_reduce"],
                           budgets={"max_turns": turns + 5, "max_wall_s": 3600.0}, trials=2, model_attempts=1,
                           base_url=fake.url + url, **extra)
        run_dir = RunDir(root / f"{wire}-{cached}")
        prices = load_price_table()
        create_run(run_dir, config, prices)
        runner = Runner(run_dir, config, [get(load_suite(), "all_reduce")], prices=prices, executor=FakeExecutor(),
                        eval_config=EvalConfig(trials=2), scheduler=DeviceScheduler("cpu", 2, cpu_slots=1))
        summary = runner.run()
        if not summary.complete or summary.errors or summary.fatal:
            raise SystemExit(f"{wire}: the session did not finish: {summary}")
        record = summary.records[0]
        return record, list(fake.usages)


def pieces() -> dict[str, int]:
    """tiktoken sizes of what every request repeats, and of what each turn adds."""
    problem = get(load_suite(), "all_reduce")
    tools = list(parse_condition(CONDITION).bound_tools)
    return {"system prompt (with the guide)": count_tokens(prompts.render_system(tools, True)),
            "task (all_reduce)": count_tokens(prompts.render_task(problem, "small", 2, None, include_guide=False)),
            "candidate (expert kernel, 4.5 KB)": count_tokens(EXPERT.read_text())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--out", default=None, help="write the results as JSON into this folder")
    args = parser.parse_args(argv)
    prices = load_price_table()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for wire in ("openai", "anthropic"):
            price = prices.price(MODELS[wire])
            assert price is not None
            for cached in (False, True):
                record, usages = session(wire, args.turns, cached, Path(tmp))
                u = record["usage"]
                reads, writes = u["cache_read_tokens"], u["cache_write_tokens"]
                uncached = u["input_tokens"] - reads - writes
                read_rate = price.cache_read if price.cache_read is not None else price.input
                write_rate = price.cache_write if price.cache_write is not None else price.input
                billed = uncached + reads * read_rate / price.input + writes * write_rate / price.input
                rows.append({"provider": wire, "model": MODELS[wire], "caching": cached, "turns": record["turns"],
                             "input_tokens": u["input_tokens"], "uncached": uncached, "cache_reads": reads,
                             "cache_writes": writes, "billed_input_equivalent": round(billed),
                             "input_cost_usd": round((uncached * price.input + reads * read_rate
                                                      + writes * write_rate) / 1e6, 4),
                             "cost_usd": u["cost_usd"], "last_request_tokens": max(
                                 x.get("prompt_tokens", 0) or (x.get("input_tokens", 0) + x.get(
                                     "cache_read_input_tokens", 0) + x.get("cache_creation_input_tokens", 0))
                                 for x in usages)})
    sizes = pieces()
    print(f"tokenizer: {tokenizer_name()}; prices: {prices.source} ({prices.version})")
    for what, n in sizes.items():
        print(f"  {what}: {n:,} tokens")
    header = ("provider", "caching", "turns", "input_tokens", "uncached", "cache_reads", "cache_writes",
              "billed_input_equivalent", "input_cost_usd", "cost_usd", "last_request_tokens")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        cells = [f"{row[h]:,}" if isinstance(row[h], int) and not isinstance(row[h], bool) else str(row[h])
                 for h in header]
        print("| " + " | ".join(cells) + " |")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "cache_savings.json").write_text(json.dumps({"pieces": sizes, "rows": rows,
                                                            "tokenizer": tokenizer_name()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
