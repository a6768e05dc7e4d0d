"""Summarize replays of PKB solution sets (`pkb run --model replay:SET --source pkb:CHECKOUT`) for
docs/measurements/pkb-runs.md.

    python benchmarks/pkb_replay_summary.py RUN_DIR [RUN_DIR ...]

Per run: files of the set and how they were matched (replay_matches.json), samples finished or not, the
verdicts, samples whose record carries an internal error (a crashed sample), and how many samples
harness.compiling.requirements.environment_issue would have made `infra_error` on this machine (the reason, counted).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def summarize(run: Path) -> str:
    sys.path.insert(0, str(REPO))
    from harness.compiling.requirements import environment_issue
    from harness.problems.registry import load_problem_spec

    config = json.loads((run / "run.json").read_text())["config"]
    matches = json.loads((run / "replay_matches.json").read_text())
    verdicts: Counter[str] = Counter()
    issues: Counter[str] = Counter()
    unfinished, crashed, total = [], [], 0
    checkout = Path(config["source"][len("pkb:"):])
    for sample in sorted(run.glob("samples/*/*/*/sample.json")):
        total += 1
        record = json.loads(sample.read_text())
        if record.get("status") != "finished":
            unfinished.append(record["problem"])
            continue
        if record.get("error"):
            crashed.append(f"{record['problem']}: {record['error']}")
        verdicts[record["verdict"]] += 1
        final = sample.parent / "final.py"
        reference = checkout / "reference" / f"{record['problem']}.py"
        if final.exists() and reference.exists():
            problem = load_problem_spec(f"pkb:{checkout.resolve()}::{reference.name}")
            issue = environment_issue(problem, final, config["device"])
            if issue:
                issues[issue.split(" (")[0]] += 1
    lines = [f"- {Path(matches['directory']).name}: {len(matches['files'])} files, "
             + ", ".join(f"{k} {v}" for k, v in matches["counts"].items())
             + f"; {total} samples, {total - len(unfinished)} finished"
             + f"; verdicts: {', '.join(f'{v} {n}' for v, n in verdicts.most_common())}"
             + f"; crashed samples: {len(crashed)}"
             + f"; environment_issue would say: {', '.join(f'{k}: {n}' for k, n in issues.most_common()) or 'nothing'}"]
    lines += [f"  - unfinished: {p}" for p in unfinished] + [f"  - crashed: {c}" for c in crashed]
    return "\n".join(lines)


def main() -> int:
    for run in sys.argv[1:]:
        print(summarize(Path(run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
