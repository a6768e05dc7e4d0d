"""The tunable sites of a kernel's source, and edits that change one of them, for the stochastic scripted model.

Two kinds of site:
- annotated: `NAME = value  # tunable: v1, v2, ...` at the start of a line; the ladder is the listed values
  (agent/search/cpu_kernels are written this way);
- found: integer literals of the places expert solutions tune by hand (problems/*/solutions/): the block
  size of a `launch(kernel, grid, THREADS, ...)` call, and the divisors and caps inside a `want=` keyword
  (`want=max(1, min(n16 // 256, 132))`), plus module-level `UPPER = <int>` constants. Their ladder is the
  value halved, doubled and quadrupled (a quarter too, for powers of two), which is how a person tunes them.

A found site may have linked spans that must always hold the same value, so that an edit gives a kernel
that still compiles and launches: a module-level constant and the `#define NAME value` of the CUDA source
it mirrors (`THREADS = 256` and `#define THREADS 256`), and a block size written as a literal at its
launch sites and in the kernel's `__launch_bounds__(N)` (launching more threads than the bound fails).
Every launch site and bound with the same literal is one site.

An edit replaces the literal's characters and nothing else, so the rest of the file stays byte for byte.
"""

from __future__ import annotations

import ast
import re
import threading
from dataclasses import dataclass

_ANNOTATED = re.compile(r"^(?P<name>[A-Z_][A-Z0-9_]*)[ \t]*=[ \t]*(?P<value>[^#\n]*?)[ \t]*#[ \t]*tunable:"
                        r"[ \t]*(?P<choices>[^\n]+)$", re.MULTILINE)
_UPPER = re.compile(r"^[A-Z][A-Z0-9_]*$")
# CPython 3.11 can fail ast.parse run from two threads at once (SystemError: "AST constructor recursion depth
# mismatch", seen in this project's tests); the search's worker threads parse kernels and prompts concurrently.
AST_LOCK = threading.RLock()


def parse(source: str) -> ast.Module:
    with AST_LOCK:
        return ast.parse(source)


@dataclass(frozen=True)
class Tunable:
    name: str  # the constant's name, or "line N: what" for a found site
    value: str  # the literal as written
    choices: tuple[str, ...]  # the ladder, in order; value is one of them
    start: int  # character offsets of the literal in the source
    end: int
    annotated: bool
    links: tuple[tuple[int, int], ...] = ()  # other spans that always hold the same value (see the module doc)

    @property
    def index(self) -> int:
        return self.choices.index(self.value) if self.value in self.choices else 0


def find_tunables(source: str) -> list[Tunable]:
    """Every tunable site of `source`, annotated ones first, in file order within each kind."""
    annotated = [_annotated(m) for m in _ANNOTATED.finditer(source)]
    taken = {t.start for t in annotated}
    found = [t for t in _found(source) if t.start not in taken and not _inside(t, annotated)]
    return annotated + found


def by_name(source: str) -> dict[str, Tunable]:
    """The annotated tunables of `source` by name."""
    return {t.name: t for t in find_tunables(source) if t.annotated}


def set_value(source: str, tunable: Tunable, value: str) -> str:
    """`source` with the tunable's literal (and its linked spans) replaced by `value` (the offsets must come
    from this very source)."""
    spans = sorted({(tunable.start, tunable.end), *tunable.links}, reverse=True)
    for start, end in spans:
        if source[start:end] != tunable.value:
            raise ValueError(f"tunable {tunable.name} is not at {start}..{end} of this source")
    for start, end in spans:  # from the end, so earlier offsets stay valid
        source = source[:start] + value + source[end:]
    return source


def skeleton(source: str) -> str:
    """The source with every annotated tunable's value blanked: two files of one family have the same one."""
    out, last = [], 0
    for t in sorted((t for t in find_tunables(source) if t.annotated), key=lambda t: t.start):
        out.append(source[last:t.start])
        last = t.end
    out.append(source[last:])
    return "".join(out)


def _annotated(match: re.Match[str]) -> Tunable:
    value = match.group("value")
    choices = tuple(c.strip() for c in match.group("choices").split(",") if c.strip())
    if value not in choices:
        choices = (value, *choices)
    return Tunable(match.group("name"), value, choices, match.start("value"), match.end("value"), True)


def _inside(t: Tunable, spans: list[Tunable]) -> bool:
    return any(s.start <= t.start < s.end for s in spans)


def _ladder(value: int, cap: int | None = None) -> tuple[str, ...]:
    if value >= 4 and value & (value - 1) == 0:  # a power of two: quarter .. quadruple
        steps = [value // 4, value // 2, value, value * 2, value * 4]
    else:
        steps = [max(1, value // 2), value, value * 2]
    return tuple(str(v) for v in sorted(set(steps)) if v >= 1 and (cap is None or v <= max(cap, value)))


def _found(source: str) -> list[Tunable]:
    try:
        tree = parse(source)
    except (SyntaxError, ValueError):
        return []
    starts = _line_starts(source)
    sites: dict[int, Tunable] = {}
    block_sizes: dict[str, list[tuple[int, int, int]]] = {}  # literal -> (start, end, line) of each launch site

    def span(node: ast.AST) -> tuple[int, int] | None:
        if not (isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 2):
            return None
        start = starts[node.lineno - 1] + _char_col(source, starts[node.lineno - 1], node.col_offset)
        end = starts[node.end_lineno - 1] + _char_col(source, starts[node.end_lineno - 1],  # type: ignore[operator]
                                                      node.end_col_offset)  # type: ignore[arg-type]
        return (start, end) if source[start:end] == str(node.value) else None  # hex, underscores: left alone

    def add(node: ast.expr, what: str, cap: int | None = None, links: tuple[tuple[int, int], ...] = ()) -> None:
        where = span(node)
        if where is None:
            return
        start, end = where
        value = source[start:end]
        sites[start] = Tunable(f"line {node.lineno}: {what}", value, _ladder(int(value), cap), start, end, False,
                               links)

    for statement in tree.body:  # module-level UPPER = <int>, with the CUDA source's #define of the same name
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name) and _UPPER.match(statement.targets[0].id):
            name = statement.targets[0].id
            literal = span(statement.value)
            mirrors = () if literal is None else _define_spans(source, name, source[literal[0]:literal[1]])
            add(statement.value, name, cap=1024 if mirrors and name.startswith("THREADS") else None, links=mirrors)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name.endswith("launch") and len(node.args) >= 3:
            where = span(node.args[2])
            if where is not None:
                block_sizes.setdefault(source[where[0]:where[1]], []).append((*where, node.lineno))
        for keyword in node.keywords:
            if keyword.arg == "want":
                for inner in ast.walk(keyword.value):
                    if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.FloorDiv):
                        add(inner.right, "work per block")
                    elif isinstance(inner, ast.Call) and getattr(inner.func, "id", "") == "min":
                        for arg in inner.args:
                            add(arg, "block cap")
    for value, launches in block_sizes.items():  # one site per block size: its launches and its kernels' bounds
        (start, end, line), others = launches[0], launches[1:]
        bounds = tuple((m.start(1), m.end(1)) for m in re.finditer(rf"__launch_bounds__\(\s*({value})\s*[,)]", source))
        links = tuple((a, b) for a, b, _ in others) + bounds
        sites[start] = Tunable(f"line {line}: threads per block", value, _ladder(int(value), 1024), start, end, False,
                               links)  # 1024: CUDA's limit per block
    return sorted(sites.values(), key=lambda t: t.start)


def _define_spans(source: str, name: str, value: str) -> tuple[tuple[int, int], ...]:
    """The value spans of `#define NAME value` lines (in the CUDA source strings a module embeds)."""
    return tuple((m.start(1), m.end(1)) for m in re.finditer(rf"(?m)^[ \t]*#define[ \t]+{name}[ \t]+({value})\b",
                                                              source))


def _line_starts(source: str) -> list[int]:
    starts = [0]
    for i, ch in enumerate(source):
        if ch == "\n":
            starts.append(i + 1)
    return starts


def _char_col(source: str, line_start: int, byte_col: int) -> int:
    """ast's column offsets count UTF-8 bytes; string offsets count characters."""
    line_end = source.find("\n", line_start)
    line = source[line_start:line_end if line_end >= 0 else len(source)]
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", "ignore"))
