"""What the bash condition's shell limits cost per command (issue 45, class 1): the wall time of one command
through tools.bash.run_shell (the sandbox with its limits: a memory cgroup where one can be made, the
tmpfs sizes, the watch thread), against the same sandbox started the way it was before the limits (bwrap
alone, no cgroup, no watch), interleaved; and the harness process's memory (its peak RSS) after each
series.

    python benchmarks/shell_limits_overhead.py [--repeats 30] [--command true]

Prints one JSON object: per variant the median, p10 and p90 seconds per command, and the RSS figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.common.paths import REPO_ROOT  # noqa: E402
from harness.config import EvalConfig  # noqa: E402
from harness.launch.sandbox import SandboxPolicy, clean_environment, probe  # noqa: E402
from harness.problems.registry import get, load_suite  # noqa: E402
from harness.records.cache_dir import cache_root  # noqa: E402
from tools import bash  # noqa: E402
from tools.base import ToolContext, ToolSettings  # noqa: E402


def unlimited(folder: Path, command: str) -> float:
    """The shell as tools.bash ran it before its limits (its code then, less the output's bounds): the same
    sandbox without sizes, no cgroup, no watch; the file-size and core limits, the timed wait."""
    policy = SandboxPolicy(scratch=folder, hide=(REPO_ROOT, cache_root()))
    env = clean_environment(dict(os.environ), folder)
    env.update({"HOME": str(folder), "PWD": str(folder)})
    started = time.perf_counter()
    proc = subprocess.Popen(policy.bwrap_command(["/bin/bash", "-c", command], folder), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            preexec_fn=_old_rlimits)
    assert proc.stdout is not None
    proc.stdout.read()
    if proc.wait(timeout=60) != 0:
        raise RuntimeError("the command failed")
    return time.perf_counter() - started


def _old_rlimits() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 30, 2 << 30))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def limited(ctx: ToolContext, command: str) -> float:
    started = time.perf_counter()
    done = bash.run_shell(ctx, command, 60.0)
    if done["exit_code"] != 0:
        raise RuntimeError(f"the command failed: {done}")
    return time.perf_counter() - started


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median_s": round(statistics.median(ordered), 4), "p10_s": round(ordered[len(ordered) // 10], 4),
            "p90_s": round(ordered[(len(ordered) * 9) // 10], 4), "n": len(ordered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--command", default="true")
    args = parser.parse_args()
    if probe().backend != "bwrap":
        raise SystemExit(f"no sandbox here: {probe().reason}")
    work = Path(tempfile.mkdtemp(prefix="pkb-shell-bench-"))
    ctx = ToolContext(problem=get(load_suite(), "all_reduce"), settings=ToolSettings(2, "cpu", "small"),
                      config=EvalConfig(trials=2), workdir=work)
    folder = bash.prepare(ctx, {})
    times: dict[str, list[float]] = {"without_limits": [], "with_limits": []}
    rss: dict[str, int] = {"start_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    limited(ctx, args.command)  # warm: the first cgroup, the probe
    for _ in range(args.repeats):
        times["without_limits"].append(unlimited(folder, args.command))
        times["with_limits"].append(limited(ctx, args.command))
    rss["end_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    series = {name: summary(values) for name, values in times.items()}
    out: dict[str, object] = dict(series)
    out["added_median_s"] = round(series["with_limits"]["median_s"] - series["without_limits"]["median_s"], 4)
    out["harness_peak_rss_kib"] = rss
    out["command"] = args.command
    out["limits"] = bash.shell_limits(ctx).record()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
