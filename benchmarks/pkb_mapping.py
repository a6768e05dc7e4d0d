"""How harness.problems.parallelkernelbench.solutions pairs the files of PKB solution sets with a checkout's
references, as
a table.

    python benchmarks/pkb_mapping.py CHECKOUT SET [SET ...] [--markdown OUT.md] [--old-numbering]

One row per file name, one column per set (how it was matched; '-' where the set has no such file), and
the reference it was paired with. Then two checks that the pairing is right, independent of the matcher:
- signature: every paired file's `solution` has the reference's parameter names (read with ast);
- --old-numbering: the first public commit's sets number files up to 32 like the references and from 34
  up one ahead, with the renames of harness/problems/parallelkernelbench/renames.json; every pairing must agree with
  that rule.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHORT = {"matched": "name", "matched by rename": "rename", "matched by signature": "signature",
         "unmatched": "UNMATCHED"}


def old_numbering_target(file: str, references: Mapping[str, object], renames: dict[str, str]) -> str | None:
    """The reference the first commit's numbering rule gives a file (None: the rule gives none)."""
    m = re.match(r"^(\d+)_(.+)_(cuda|triton|parallelkittens)\.py$", file)
    if m is None:
        return None
    pid, words = int(m.group(1)), m.group(2)
    stem = renames.get(f"{pid}_{words}", f"{pid if pid <= 32 else pid - 1}_{words}")
    return stem if stem in references else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("sets", type=Path, nargs="+")
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--old-numbering", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from harness.problems.parallelkernelbench import checkout, solutions

    problems = checkout.list_problems(args.checkout)
    references = {p.name: p for p in problems}
    renames = solutions.known_renames()
    by_set = {d.name: {m.file: m for m in solutions.match_files(problems, d)} for d in args.sets}
    files = sorted({f for matches in by_set.values() for f in matches}, key=solutions._natural)
    names = list(by_set)
    lines = ["| file | reference | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    problems_found: list[str] = []
    for f in files:
        paired = {by_set[s][f].problem for s in names if f in by_set[s]}
        if len(paired) > 1:
            problems_found.append(f"{f}: paired differently across sets: {sorted(map(str, paired))}")
        cells = [SHORT[by_set[s][f].status] + ("" if by_set[s][f].signature in ("same", "unknown: not a solution",
                                                                                 "unknown: not read",
                                                                                 "unknown: no reference")
                                               else f" ({by_set[s][f].signature})")
                 if f in by_set[s] else "-" for s in names]
        lines.append(f"| {f} | {next(iter(paired)) or '-'} | " + " | ".join(cells) + " |")
    summary = []
    for s in names:
        matches = list(by_set[s].values())
        counts = solutions.tally(matches)
        differs = [m for m in matches if m.matched and m.signature != "same"]
        wrong = []
        if args.old_numbering:
            wrong = [m for m in matches if m.matched and m.problem != old_numbering_target(m.file, references, renames)]
        summary.append(f"- {s}: {len(matches)} files: by name {counts['matched']}, by rename "
                       f"{counts['matched by rename']}, by signature {counts['matched by signature']}, unmatched "
                       f"{counts['unmatched']}; signature differs or unreadable: "
                       f"{', '.join(f'{m.file} ({m.signature})' for m in differs) or 'none'}"
                       + (f"; pairings against the old-numbering rule: {len(wrong)} disagree" if args.old_numbering
                          else ""))
        problems_found += [f"{s}/{m.file}: paired with {m.problem}, the rule says "
                           f"{old_numbering_target(m.file, references, renames)}" for m in wrong]
        problems_found += [f"{s}/{m.file}: {m.line()}" for m in matches if not m.matched]
    text = "\n".join(summary) + "\n\n" + "\n".join(lines) + "\n"
    if problems_found:
        text += "\nFindings:\n" + "\n".join(f"- {p}" for p in problems_found) + "\n"
    if args.markdown:
        args.markdown.write_text(text)
    print(text if not args.markdown else "\n".join(summary) + "\n" + "\n".join(problems_found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
