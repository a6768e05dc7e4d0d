"""`pkb report RUN [RUN ...] [--format md|html|json|tex] [--out PATH] [--k K] [--baseline B] [--all-pairs] [--force]`:
agent.report's numbers, laid out. A RUN may be a sweep's folder (`pkb sweep`): its cells, each model's pooled
over seeds (agent.sweep.report)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from agent.cli.common import CliError, check_out_path, console, plain, terminal_safe
from agent.rundir import is_run_dir, write_out_text

if TYPE_CHECKING:
    from agent.report.run_reader import Run

SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html", ".json": "json", ".tex": "tex"}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="metrics and report of one or more runs (several runs: side by side)")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (runs/<run_id>)")
    p.add_argument("--format", choices=("md", "html", "json", "tex"), default=None,
                   help="output format (default: from --out's suffix, else md); tex: the compact comparison table "
                        "as LaTeX")
    p.add_argument("--out", default=None, help="write here instead of stdout (md: figures go to <stem>_figures/; "
                   "default: stdout)")
    p.add_argument("--k", type=int, default=None, help="k of pass@k and fast_p@k (default: samples per problem)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap intervals and permutation tests")
    p.add_argument("--baseline", default=None,
                   help="the condition (or arm label) the others are compared with (default: zero-shot where "
                        "present, else the first condition)")
    p.add_argument("--all-pairs", action="store_true",
                   help="compare every two arms that share the model or the condition (Holm-corrected)")
    p.add_argument("--force", action="store_true",
                   help="compare runs whose manifests differ in more than the compared factor (marked †)")
    p.set_defaults(handler=cmd_report)


def runs_inside(folder: Path, limit: int = 5) -> list[str]:
    """Names of run directories directly inside `folder` (the user gave runs/ instead of runs/<id>)."""
    try:
        found = sorted(p.name for p in folder.iterdir() if is_run_dir(p))
    except OSError:
        return []
    return found[:limit] + (["..."] if len(found) > limit else [])


def load_runs(paths: list[str], *, force: bool = False) -> list[Run]:
    from agent.report.run_reader import RunFormatError, read_run  # pydantic models: when the command runs
    from agent.sweep import report as sweep_report  # a sweep's cells, pooled per model

    runs = []
    for path in paths:
        try:
            if sweep_report.is_sweep(Path(path)):
                runs.extend(sweep_report.pooled_runs(Path(path), force=force))
            else:
                runs.append(read_run(Path(path)))
        except sweep_report.SweepReportError as err:
            raise CliError(str(err)) from None
        except RunFormatError as err:
            inside = runs_inside(Path(path)) if Path(path).is_dir() else []
            hint = f"; it holds runs: {', '.join(inside)} (give one of those)" if inside else ""
            raise CliError(f"{err}{hint}") from None
    return runs


def output_format(fmt: str | None, out: str | None) -> str:
    if fmt:
        return fmt
    if out:
        return SUFFIX_FORMATS.get(Path(out).suffix.lower(), "md")
    return "md"


def cmd_report(args: argparse.Namespace) -> int:
    if args.k is not None and args.k < 1:
        raise CliError(f"--k must be at least 1, got {args.k}")
    if args.out:
        check_out_path(args.out)  # a folder, a device, a FIFO nobody reads: said before any work
    for path in args.runs:  # before the report's imports (the search's pull in the model stack)
        if not Path(path).is_dir():
            raise CliError(f"{path}: no such directory" if not Path(path).exists() else f"{path}: not a directory")
    from agent.search import report as search_report  # the search's own run layout

    if any(search_report.is_search(Path(p)) for p in args.runs):  # `pkb search` runs: their own report
        return cmd_search_report(args)
    # Deferred: numpy, and matplotlib for the figures, are the report's alone.
    from agent.report.build import ReportError, build, to_json
    from agent.report.figures import write_figures
    from agent.report.html import to_html
    from agent.report.markdown import to_markdown
    from agent.report.paper import to_latex

    runs = load_runs(args.runs, force=args.force)
    try:
        built = build(runs, k=args.k, seed=args.seed, baseline=args.baseline, all_pairs=args.all_pairs,
                      force=args.force)
    except ReportError as err:
        raise CliError(str(err)) from None
    fmt = output_format(args.format, args.out)
    out = Path(args.out) if args.out else None
    if fmt == "json":
        text = to_json(built)
    elif fmt == "tex":
        text = to_latex(built)
    elif fmt == "html":
        text = to_html(built)
    else:
        links: dict[str, str] | None = None  # on stdout: the tables only
        if out is not None:  # markdown cannot carry images: they go next to it, linked relatively
            folder = out.parent / f"{out.stem}_figures"
            try:
                written = write_figures(built, folder)
            except OSError as err:
                raise CliError(f"cannot write the figures to {folder}: {err.strerror or err}") from None
            links = {stem: f"{folder.name}/{path.name}" for stem, path in written.items()}
        text = to_markdown(built, links)
    if out is None:
        print(terminal_safe(text))  # candidate text inside a report never steers the terminal
        return 0
    try:
        write_out_text(out, text)  # a regular file replaced atomically; a link's target written, never the link
    except OSError as err:
        raise CliError(f"cannot write {out}: {err.strerror or err}") from None
    console.print(plain(f"wrote {out} ({fmt}, k={built.k}, {len(built.arms)} condition(s))"))
    for line in built.data.get("incomplete", []):  # said on the terminal too: the file's headline says it first
        console.print(plain(f"incomplete: {line}"))
    return 0


def cmd_search_report(args: argparse.Namespace) -> int:
    """The morning report of one or more search runs (agent.search.report), one after the other."""
    from agent.search import report as search_report  # the search's own run layout: when it runs

    not_search = [p for p in args.runs if not search_report.is_search(Path(p))]
    if not_search:
        raise CliError(f"{', '.join(not_search)}: not search runs; report search runs and sample runs separately")
    fmt = output_format(args.format, args.out)
    if fmt == "tex":
        raise CliError("--format tex is the comparison table of sample runs; a search's report is md, html or json")
    out = Path(args.out) if args.out else None
    try:
        texts = [search_report.render(Path(p), fmt, out) for p in args.runs]
    except (search_report.SearchReportError, ValueError, OSError) as err:
        raise CliError(str(err)) from None
    text = texts[0] if len(texts) == 1 else ("[" + ",".join(texts) + "]" if fmt == "json" else "\n\n".join(texts))
    if out is None:
        print(terminal_safe(text))  # candidate text inside a report never steers the terminal
        return 0
    try:
        write_out_text(out, text)
    except OSError as err:
        raise CliError(f"cannot write {out}: {err.strerror or err}") from None
    console.print(plain(f"wrote {out} ({fmt}, {len(texts)} search run(s))"))
    return 0

