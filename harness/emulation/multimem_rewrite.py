"""Rewrite a CUDA source so that its multimem instructions become ordinary accesses to every rank's memory.

NVLink multicast never runs on these machines (docs/emulation.md). A kernel written for it issues
`multimem.ld_reduce`, `multimem.st` or `multimem.red` on an address of the handle's multicast window; under
emulation that window is a reserved, unmapped range (harness.emulation.multicast_layout), and each such
inline-asm statement is replaced here by C++ that does the same operation over every rank's unicast buffer:

    multimem.ld_reduce{.sem}{.scope}.op{.acc::f32}{.vec}.type d, [a]   ->  ld{.sem}{.scope}.global of every rank,
                                                                          reduced in rank order 0..W-1
    multimem.st{.sem}{.scope}{.vec}.type [a], b                         ->  st{.sem}{.scope}.global to every rank
    multimem.red{.sem}{.scope}.op{.vec}.type [a], b                     ->  red (or a compare-and-swap loop where
                                                                          PTX has no red for the type) on every rank

The memory-ordering qualifiers are kept as written on each per-rank access, so ptxas judges them as it
judged the original; a type, operation or vector width the PTX ISA does not allow for the instruction
becomes a `static_assert` that fails the build with the instruction's name, as the original fails it.
Reductions without `.acc::f32` round to the type after each rank; with it they accumulate in f32.

The rewritten code finds the ranks' buffers in a device table (layout: multicast_layout) through a
`__device__` pointer that the harness sets once per built module with the injected `pkb_mc_bind`.

What is not rewritten is reported, never guessed: a template built with macros, an asm statement with
other instructions beside the multimem one, predicated or unknown forms, operands other than `%N` and
`[%N+imm]`, multimem outside an asm statement (libcu++'s `cuda::ptx::multimem_*`), multicast objects.

Pure Python (standard library): the trusted side uses it to judge a source, the build hook to rewrite.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from harness.emulation import multicast_layout as layout

# -- what the PTX ISA allows (ptxas 13.0 for sm_90a, every combination tried) ---------------------------
_ADD_VEC = {2: "f32 f16 f16x2 bf16 bf16x2", 4: "f32 f16 f16x2 bf16 bf16x2", 8: "f16 bf16"}
_MINMAX_VEC = {2: "f16 f16x2 bf16 bf16x2", 4: "f16 f16x2 bf16 bf16x2", 8: "f16 bf16"}
_BITWISE = {1: "b32 b64"}
_VALID: dict[tuple[str, str], dict[int, str]] = {
    ("ld_reduce", "add"): {1: "u32 u64 s32 f32 f64 f16x2 bf16x2", **_ADD_VEC},
    ("ld_reduce", "min"): {1: "u32 u64 s32 s64 f16x2 bf16x2", **_MINMAX_VEC},
    ("ld_reduce", "max"): {1: "u32 u64 s32 s64 f16x2 bf16x2", **_MINMAX_VEC},
    ("red", "add"): {1: "u32 u64 s32 f32 f64 f16x2 bf16x2", **_ADD_VEC},
    ("red", "min"): {1: "u32 u64 s32 s64", **_MINMAX_VEC},
    ("red", "max"): {1: "u32 u64 s32 s64", **_MINMAX_VEC},
    ("st", ""): {1: "b32 b64 u32 u64 s32 s64 f32 f64 f16x2 bf16x2", **_ADD_VEC},
    **{(kind, op): _BITWISE for kind in ("ld_reduce", "red") for op in ("and", "or", "xor")},
}
_ACC_F32_TYPES = ("f16", "bf16", "f16x2", "bf16x2")  # .acc::f32 only with .add on these
KINDS = ("ld_reduce", "st", "red")
SEMS = ("weak", "relaxed", "acquire", "release")
SCOPES = ("cta", "cluster", "gpu", "sys")
OPS = ("add", "min", "max", "and", "or", "xor")
TYPES = ("b32", "b64", "u32", "u64", "s32", "s64", "f32", "f64", "f16", "f16x2", "bf16", "bf16x2")
_WORD64 = ("b64", "u64", "s64", "f64")
_HALF = {"f16": "f16x2", "bf16": "bf16x2"}  # 16-bit elements travel in pairs, as one 32-bit word

# Outside asm: calls that issue multimem or create multicast objects, which no text rewrite can serve.
_FOREIGN = re.compile(r"\b(?:ptx\s*::\s*multimem_\w+|cuMulticast\w*|cudaMulticast\w*|nvshmemx?_\w*mc\w*)")
# In a string literal outside asm statements: a multimem opcode with its qualifiers (a raw PTX module, a macro
# an asm template is built from); prose such as "uses multimem.ld_reduce" names no qualifier.
_INSTRUCTION_LIKE = re.compile(r"multimem\.(?:ld_reduce|st|red)(?:\.[A-Za-z0-9_:]+)+")


@dataclass(frozen=True)
class Opcode:
    """One multimem opcode, as written: `multimem.ld_reduce.relaxed.sys.global.add.v4.bf16x2`."""

    spelling: str
    kind: str
    sem: str
    scope: str
    op: str
    acc_f32: bool
    vec: int
    type: str

    def invalid(self) -> str:
        """Why the PTX ISA rejects this combination ('' when it allows it)."""
        allowed = _VALID.get((self.kind, self.op), {}).get(self.vec, "").split()
        if self.type not in allowed:
            width = f".v{self.vec}." if self.vec > 1 else "."
            return f"{self.spelling}: .{self.op or 'st'} with {width}{self.type} is not a valid PTX instruction"
        if self.acc_f32 and (self.kind != "ld_reduce" or self.op != "add" or self.type not in _ACC_F32_TYPES):
            return f"{self.spelling}: .acc::f32 is only valid for ld_reduce.add on f16/bf16 types"
        return ""

    @property
    def word_type(self) -> str:
        """The type of one transferred word: 16-bit elements are packed in pairs."""
        return _HALF.get(self.type, self.type)

    @property
    def words(self) -> int:
        return self.vec // 2 if self.type in _HALF else self.vec

    @property
    def word_bits(self) -> int:
        return 64 if self.type in _WORD64 else 32


def parse_opcode(spelling: str) -> Opcode | str:
    """The parsed opcode, or why it is not a form this module emulates."""
    parts = spelling.split(".")
    if len(parts) < 3 or parts[0] != "multimem" or parts[1] not in KINDS:
        return f"{spelling}: not a multimem ld_reduce, st or red"
    kind, rest = parts[1], parts[2:]
    sem = scope = op = ""
    acc_f32 = False
    vec = 1
    if rest[-1] not in TYPES:
        return f"{spelling}: type .{rest[-1]} is not emulated"
    type_ = rest.pop()
    for q in rest:
        if q in SEMS and not sem and not (scope or op):
            sem = q
        elif q in SCOPES and not scope and not op:
            scope = q
        elif q == "global":
            continue
        elif q in OPS and not op and kind != "st":
            op = q
        elif q == "acc::f32" and not acc_f32:
            acc_f32 = True
        elif q in ("v2", "v4", "v8") and vec == 1:
            vec = int(q[1:])
        else:
            return f"{spelling}: qualifier .{q} is not emulated"
    if kind != "st" and not op:
        return f"{spelling}: no reduction operation"
    return Opcode(spelling, kind, sem, scope, op, acc_f32, vec, type_)


# -- the C++ around the asm statements -------------------------------------------------------------------
@dataclass(frozen=True)
class Operand:
    constraint: str  # as written, without quotes: "=r", "l", "+f"
    expr: str
    name: str = ""  # the [name] of a named operand


@dataclass(frozen=True)
class Unrewritable:
    """A construct left as it was: the source must not be built under emulation."""

    construct: str
    line: int
    why: str

    def describe(self) -> str:
        return f"line {self.line}: {self.construct!r}: {self.why}"


@dataclass
class RewriteResult:
    """The rewritten source; the instructions rewritten (spelling -> count); what could not be."""

    source: str
    rewritten: Counter[str] = field(default_factory=Counter)
    unrewritable: list[Unrewritable] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)  # kept as build errors, as the originals fail to build

    @property
    def complete(self) -> bool:
        return not self.unrewritable

    @property
    def changed(self) -> bool:
        return bool(self.rewritten) or bool(self.invalid)


class _NotRewritable(Exception):
    def __init__(self, construct: str, why: str) -> None:
        super().__init__(why)
        self.construct = construct
        self.why = why


def _skip_quoted(text: str, i: int) -> int:
    """The index after the string or character literal that starts at text[i]."""
    quote = text[i]
    i += 1
    while i < len(text) and text[i] != quote:
        if text[i] == "\\":
            i += 1
        elif text[i] == "\n":
            return i  # an unterminated literal ends at the line (the compiler will say so)
        i += 1
    return i + 1


def _skip_comment(text: str, i: int) -> int:
    if text.startswith("//", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    end = text.find("*/", i + 2)
    return len(text) if end < 0 else end + 2


def _code_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every comment ('comment'), literal ('string'), else 'code' run."""
    spans: list[tuple[int, int, str]] = []
    i = start = 0
    while i < len(text):
        c = text[i]
        if c in "\"'" and not (c == "'" and i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
            spans.append((start, i, "code"))
            end = _skip_quoted(text, i)
            spans.append((i, end, "string"))
            i = start = end
        elif text.startswith("//", i) or text.startswith("/*", i):
            spans.append((start, i, "code"))
            end = _skip_comment(text, i)
            spans.append((i, end, "comment"))
            i = start = end
        else:
            i += 1
    spans.append((start, len(text), "code"))
    return [s for s in spans if s[0] < s[1]]


_ASM = re.compile(r"\b(?:asm|__asm__|__asm)\b(?:\s+(?:volatile|__volatile__|__volatile|inline|goto)\b)*\s*\(")


def _bracket_code(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, character, bracket depth after it) of every character of `text` from `start` that is code: the
    contents of literals and comments are stepped over."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c in "\"'":
            i = _skip_quoted(text, i)
            continue
        if text.startswith("//", i) or text.startswith("/*", i):
            i = _skip_comment(text, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        yield i, c, depth
        i += 1


def _matching_paren(text: str, open_at: int) -> int:
    for i, c, depth in _bracket_code(text, open_at):
        if c in ")]}" and depth == 0:
            return i
    raise _NotRewritable(text[open_at:open_at + 60], "unbalanced parentheses in an asm statement")


def _split_top(text: str, separator: str) -> list[str]:
    """`text` split at `separator` outside brackets, literals and comments."""
    parts: list[str] = []
    start = 0
    for i, c, depth in _bracket_code(text):
        if c == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "r": "\r", "0": "\0"}
_LITERAL = re.compile(r'\s*(?:u8|L|u|U)?"((?:[^"\\\n]|\\.)*)"\s*', re.DOTALL)
_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)


def _template(section: str) -> str:
    """The asm template: adjacent string literals only (a macro in it cannot be read)."""
    text = _COMMENTS.sub(" ", section)
    out, at = [], 0
    while at < len(text):
        m = _LITERAL.match(text, at)
        if m is None or m.end() == at:
            if text[at:].strip():
                raise _NotRewritable(section.strip()[:80], "the asm template is built with macros or expressions")
            break
        out.append(re.sub(r"\\(.)", lambda e: _ESCAPES.get(e.group(1), e.group(1)), m.group(1)))
        at = m.end()
    return "".join(out)


_OPERAND = re.compile(r'^\s*(?:\[\s*(?P<name>\w+)\s*\]\s*)?"(?P<c>[^"]*)"\s*\((?P<expr>.*)\)\s*$', re.DOTALL)


def _operands(section: str) -> list[Operand]:
    if not section.strip():
        return []
    out = []
    for piece in _split_top(section, ","):
        m = _OPERAND.match(piece)
        if m is None:
            raise _NotRewritable(piece.strip()[:80], "an asm operand that is not \"constraint\"(expression)")
        out.append(Operand(m.group("c").strip(), m.group("expr").strip(), m.group("name") or ""))
    return out


_REF = re.compile(r"^%(?:(\d+)|\[(\w+)\])$")
_ADDRESS = re.compile(r"^\[\s*(%\d+|%\[\w+\])\s*(?:\+\s*(-?(?:0x[0-9a-fA-F]+|\d+))\s*)?\]$")


def _lookup(ref: str, operands: list[Operand], construct: str) -> Operand:
    m = _REF.match(ref.strip())
    if m is None:
        raise _NotRewritable(construct, f"operand {ref.strip()!r} is not %N or %[name]")
    if m.group(1) is not None:
        index = int(m.group(1))
        if index >= len(operands):
            raise _NotRewritable(construct, f"operand %{index} does not exist")
        return operands[index]
    found = [o for o in operands if o.name == m.group(2)]
    if not found:
        raise _NotRewritable(construct, f"operand %[{m.group(2)}] does not exist")
    return found[0]


def _register_list(text: str) -> list[str]:
    text = text.strip()
    if text.startswith("{") and text.endswith("}"):
        return [t.strip() for t in text[1:-1].split(",")]
    return [text]


@dataclass(frozen=True)
class _Statement:
    opcode: Opcode
    address: Operand
    offset: int
    values: list[Operand]  # ld_reduce: destinations; st, red: sources (one per element)


def _width_mismatch(st: _Statement) -> str:
    """Why the operands' registers cannot hold the instruction's elements ('' when they can): ptxas rejects
    the original then, and the rewrite keeps that build error."""
    op = st.opcode
    fits = "h" if op.type in _HALF else ("ld" if op.word_bits == 64 else "rf")
    wrong = [v.constraint for v in st.values if v.constraint.lstrip("=&+") not in fits]
    return f"{op.spelling}: operand constraint {wrong[0]!r} does not fit .{op.type}" if wrong else ""


def _parse_statement(template: str, operands: list[Operand]) -> _Statement:
    """The multimem statement of an asm template (_NotRewritable when it is not one this emulates)."""
    body = template.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    instructions = [s.strip() for s in re.split(r"[;\n]", body) if s.strip()]
    if len(instructions) != 1:
        raise _NotRewritable(template.strip()[:100], "an asm statement with other instructions beside multimem")
    text = instructions[0]
    if text.startswith("@"):
        raise _NotRewritable(text[:100], "a predicated multimem instruction")
    spelling, _, rest = re.sub(r"\s+", " ", text, count=1).partition(" ")
    parsed = parse_opcode(spelling.strip())
    if isinstance(parsed, str):
        raise _NotRewritable(text[:100], parsed)
    pieces = _split_top(rest, ",")
    if len(pieces) != 2:
        raise _NotRewritable(text[:100], "expected two operands")
    address_text, value_text = (pieces[1], pieces[0]) if parsed.kind == "ld_reduce" else (pieces[0], pieces[1])
    m = _ADDRESS.match(address_text.strip())
    if m is None:
        raise _NotRewritable(text[:100], f"address {address_text.strip()!r} is not [%N] or [%N+offset]")
    address = _lookup(m.group(1), operands, text[:100])
    values = [_lookup(r, operands, text[:100]) for r in _register_list(value_text)]
    if len(values) != parsed.vec:
        raise _NotRewritable(text[:100], f"{len(values)} registers for a .v{parsed.vec} instruction")
    for v in values:
        letter = v.constraint.lstrip("=&+")
        if parsed.kind == "ld_reduce" and not v.constraint.startswith("="):
            raise _NotRewritable(text[:100], f"destination constraint {v.constraint!r} is not an output")
        if v.constraint.startswith("+") or letter not in "rfldh" or len(letter) != 1:
            raise _NotRewritable(text[:100], f"operand constraint {v.constraint!r} is not emulated")
    if address.constraint != "l":
        raise _NotRewritable(text[:100], f"address constraint {address.constraint!r} is not an input")
    return _Statement(parsed, address, int(m.group(2) or "0", 0), values)


# -- generated code ----------------------------------------------------------------------------------------
_WORD_C = {32: "unsigned int", 64: "unsigned long long"}
_REG = {32: "r", 64: "l"}


def _qualifiers(op: Opcode) -> str:
    return "".join(f".{q}" for q in (op.sem, op.scope) if q)


def _input_word(value: Operand) -> str:
    letter = value.constraint.lstrip("=&+")
    return {"r": f"(unsigned int)({value.expr})", "f": f"__float_as_uint({value.expr})",
            "l": f"(unsigned long long)({value.expr})", "d": f"(unsigned long long)__double_as_longlong({value.expr})",
            "h": f"(unsigned int)(unsigned short)({value.expr})"}[letter]


def _assign_output(value: Operand, word: str) -> str:
    letter = value.constraint.lstrip("=&+")
    converted = {"r": word, "f": f"__uint_as_float({word})", "l": word,
                 "d": f"__longlong_as_double((long long)({word}))", "h": f"(unsigned short)({word})"}[letter]
    return f"({value.expr}) = {converted};"


def _words_of_inputs(op: Opcode, values: list[Operand]) -> list[str]:
    words = [_input_word(v) for v in values]
    if op.type in _HALF:  # two 16-bit elements per word, the first in the low half (little-endian)
        return [f"(({words[i]}) | (({words[i + 1]}) << 16))" for i in range(0, len(words), 2)]
    return words


def _assign_outputs(op: Opcode, values: list[Operand], acc: str) -> list[str]:
    if op.type in _HALF:
        return [_assign_output(v, f"({acc}[{i // 2}] >> {16 * (i % 2)}) & 0xffffu") for i, v in enumerate(values)]
    return [_assign_output(v, f"{acc}[{i}]") for i, v in enumerate(values)]


def _vector_access(mnemonic: str, op: Opcode, data: str, address: str, store: bool) -> str:
    """One inline-asm ld or st of the op's words at `address` (a C++ expression)."""
    n, bits = op.words, op.word_bits
    vec = f".v{n}" if n > 1 else ""
    regs = ", ".join(f"%{i + (1 if store else 0)}" for i in range(n))
    regs = f"{{{regs}}}" if n > 1 else regs
    addr_ref = "%0" if store else f"%{n}"
    operands = f"[{addr_ref}], {regs}" if store else f"{regs}, [{addr_ref}]"
    text = f"{mnemonic}{vec}.b{bits} {operands};"
    datas = ", ".join(f'"{"" if store else "="}{_REG[bits]}"({data}[{i}])' for i in range(n))
    if store:
        return f'asm volatile("{text}" :: "l"({address}), {datas} : "memory");'
    return f'asm volatile("{text}" : {datas} : "l"({address}) : "memory");'


def _combine(op: Opcode, acc: str, x: str) -> str:
    """The C++ expression of `acc` combined with `x` (one word) by the op, in the word's type."""
    return f"::pkb_mc::{op.op}_{op.word_type}({acc}, {x})"


def _red_word(op: Opcode, address: str, word: str) -> str:
    """One word of a multimem.red on one rank: PTX red where it exists, else a compare-and-swap loop."""
    t = op.word_type
    q = _qualifiers(op)
    if t in ("f16x2", "bf16x2") and op.op in ("min", "max"):
        cas = f"atom{q}.global.cas.b32"
        return (f"{{ unsigned int pkb_mc_old = *(volatile unsigned int*)({address}), pkb_mc_seen; "
                f"do {{ const unsigned int pkb_mc_new = {_combine(op, 'pkb_mc_old', word)}; "
                f'asm volatile("{cas} %0, [%1], %2, %3;" : "=r"(pkb_mc_seen) : "l"({address}), "r"(pkb_mc_old), '
                f'"r"(pkb_mc_new) : "memory"); if (pkb_mc_seen == pkb_mc_old) break; pkb_mc_old = pkb_mc_seen; '
                f"}} while (true); }}")
    ptx_type = {"f16x2": "noftz.f16x2", "bf16x2": "noftz.bf16x2"}.get(t, t)
    reg = _REG[op.word_bits]
    return f'asm volatile("red{q}.global.{op.op}.{ptx_type} [%0], %1;" :: "l"({address}), "{reg}"({word}) : "memory");'


def _generate(st: _Statement) -> str:
    op = st.opcode
    word = _WORD_C[op.word_bits]
    n = op.words
    nbytes = n * op.word_bits // 8
    head = (f"/* pkb-emulated {op.spelling} */ const unsigned long long pkb_mc_a = "
            f"(unsigned long long)({st.address.expr}) + {st.offset}; "
            f"const ::pkb_mc::Window pkb_mc_w = ::pkb_mc::window(pkb_mc_a, {nbytes}); ")
    per_rank = "for (unsigned int pkb_mc_r = 0; pkb_mc_r < pkb_mc_w.world; ++pkb_mc_r) { " \
               "const unsigned long long pkb_mc_p = ::pkb_mc::at(pkb_mc_w, pkb_mc_r, pkb_mc_a); "
    q = _qualifiers(op)
    if op.kind == "ld_reduce":
        load = _vector_access(f"ld{q}.global", op, "pkb_mc_x", "pkb_mc_p", store=False)
        if op.acc_f32:
            acc_decl = f"float2 pkb_mc_acc[{n}];"
            step = (f"const float2 pkb_mc_f = ::pkb_mc::widen_{op.word_type}(pkb_mc_x[pkb_mc_i]); "
                    "if (pkb_mc_r == 0) pkb_mc_acc[pkb_mc_i] = pkb_mc_f; else { pkb_mc_acc[pkb_mc_i].x += pkb_mc_f.x; "
                    "pkb_mc_acc[pkb_mc_i].y += pkb_mc_f.y; }")
            finish = (f"{word} pkb_mc_out[{n}]; for (int pkb_mc_i = 0; pkb_mc_i < {n}; ++pkb_mc_i) "
                      f"pkb_mc_out[pkb_mc_i] = ::pkb_mc::narrow_{op.word_type}(pkb_mc_acc[pkb_mc_i]); ")
            result = "pkb_mc_out"
        else:
            acc_decl = f"{word} pkb_mc_acc[{n}];"
            step = (f"pkb_mc_acc[pkb_mc_i] = pkb_mc_r == 0 ? pkb_mc_x[pkb_mc_i] : "
                    f"{_combine(op, 'pkb_mc_acc[pkb_mc_i]', 'pkb_mc_x[pkb_mc_i]')};")
            finish, result = "", "pkb_mc_acc"
        body = (f"{acc_decl} {per_rank}{word} pkb_mc_x[{n}]; {load} "
                f"for (int pkb_mc_i = 0; pkb_mc_i < {n}; ++pkb_mc_i) {{ {step} }} }} {finish}"
                + " ".join(_assign_outputs(op, st.values, result)))
    else:
        words = _words_of_inputs(op, st.values)
        values = f"const {word} pkb_mc_v[{n}] = {{{', '.join(words)}}}; "
        if op.kind == "st":
            action = _vector_access(f"st{q}.global", op, "pkb_mc_v", "pkb_mc_p", store=True)
        else:
            action = " ".join(_red_word(op, f"pkb_mc_p + {i * op.word_bits // 8}", f"pkb_mc_v[{i}]")
                              for i in range(n))
        body = f"{values}{per_rank}{action} }}"
    return f"do {{ {head}{body} }} while (0)"


def _invalid_code(why: str) -> str:
    message = why.replace("\\", "/").replace('"', "'")
    return f'do {{ static_assert(sizeof(int) == 0, "{message}"); }} while (0)'


def _line_breaks(span: str) -> str:
    """The span's line breaks, continuations kept: the rewrite keeps every line number and macro intact."""
    return "".join(m.group(0) for m in re.finditer(r"\\?\r?\n", span))


# -- the prelude -------------------------------------------------------------------------------------------
_COMBINE_C = """
#define PKB_MC_FN __device__ __forceinline__
typedef unsigned int u32;
typedef unsigned long long u64;
PKB_MC_FN u32 add_u32(u32 a, u32 b) { return a + b; }
PKB_MC_FN u32 add_s32(u32 a, u32 b) { return a + b; }
PKB_MC_FN u64 add_u64(u64 a, u64 b) { return a + b; }
PKB_MC_FN u32 min_u32(u32 a, u32 b) { return a < b ? a : b; }
PKB_MC_FN u32 max_u32(u32 a, u32 b) { return a > b ? a : b; }
PKB_MC_FN u32 min_s32(u32 a, u32 b) { return (int)a < (int)b ? a : b; }
PKB_MC_FN u32 max_s32(u32 a, u32 b) { return (int)a > (int)b ? a : b; }
PKB_MC_FN u64 min_u64(u64 a, u64 b) { return a < b ? a : b; }
PKB_MC_FN u64 max_u64(u64 a, u64 b) { return a > b ? a : b; }
PKB_MC_FN u64 min_s64(u64 a, u64 b) { return (long long)a < (long long)b ? a : b; }
PKB_MC_FN u64 max_s64(u64 a, u64 b) { return (long long)a > (long long)b ? a : b; }
PKB_MC_FN u32 and_b32(u32 a, u32 b) { return a & b; }
PKB_MC_FN u32 or_b32(u32 a, u32 b) { return a | b; }
PKB_MC_FN u32 xor_b32(u32 a, u32 b) { return a ^ b; }
PKB_MC_FN u64 and_b64(u64 a, u64 b) { return a & b; }
PKB_MC_FN u64 or_b64(u64 a, u64 b) { return a | b; }
PKB_MC_FN u64 xor_b64(u64 a, u64 b) { return a ^ b; }
PKB_MC_FN u32 add_f32(u32 a, u32 b) { return __float_as_uint(__fadd_rn(__uint_as_float(a), __uint_as_float(b))); }
PKB_MC_FN u64 add_f64(u64 a, u64 b) {
  return (u64)__double_as_longlong(__dadd_rn(__longlong_as_double((long long)a), __longlong_as_double((long long)b)));
}
PKB_MC_FN __half2 as_h2(u32 w) {
  return __halves2half2(__ushort_as_half((unsigned short)(w & 0xffffu)), __ushort_as_half((unsigned short)(w >> 16)));
}
PKB_MC_FN u32 of_h2(__half2 h) {
  return (u32)__half_as_ushort(__low2half(h)) | ((u32)__half_as_ushort(__high2half(h)) << 16);
}
PKB_MC_FN __nv_bfloat162 as_b2(u32 w) {
  return __halves2bfloat162(__ushort_as_bfloat16((unsigned short)(w & 0xffffu)),
                            __ushort_as_bfloat16((unsigned short)(w >> 16)));
}
PKB_MC_FN u32 of_b2(__nv_bfloat162 h) {
  return (u32)__bfloat16_as_ushort(__low2bfloat16(h)) | ((u32)__bfloat16_as_ushort(__high2bfloat16(h)) << 16);
}
PKB_MC_FN u32 add_f16x2(u32 a, u32 b) { return of_h2(__hadd2(as_h2(a), as_h2(b))); }
PKB_MC_FN u32 min_f16x2(u32 a, u32 b) { return of_h2(__hmin2(as_h2(a), as_h2(b))); }
PKB_MC_FN u32 max_f16x2(u32 a, u32 b) { return of_h2(__hmax2(as_h2(a), as_h2(b))); }
PKB_MC_FN u32 add_bf16x2(u32 a, u32 b) { return of_b2(__hadd2(as_b2(a), as_b2(b))); }
PKB_MC_FN u32 min_bf16x2(u32 a, u32 b) { return of_b2(__hmin2(as_b2(a), as_b2(b))); }
PKB_MC_FN u32 max_bf16x2(u32 a, u32 b) { return of_b2(__hmax2(as_b2(a), as_b2(b))); }
PKB_MC_FN float2 widen_f16x2(u32 w) { return __half22float2(as_h2(w)); }
PKB_MC_FN float2 widen_bf16x2(u32 w) { return __bfloat1622float2(as_b2(w)); }
PKB_MC_FN u32 narrow_f16x2(float2 f) { return of_h2(__floats2half2_rn(f.x, f.y)); }
PKB_MC_FN u32 narrow_bf16x2(float2 f) { return of_b2(__floats2bfloat162_rn(f.x, f.y)); }
#undef PKB_MC_FN
"""

PRELUDE_MARK = "// pkb-agent: multimem emulated with unicast accesses (docs/emulation.md)"
# Ends the prelude: the compiler counts the candidate's lines from 1 again, under a name that is no file. Under
# the file's own name gcc would print the rewritten file's line (the prelude's text) beside the candidate's
# line number: an error at a candidate's include showed a line of the prelude (Gemini 3 Pro's 4_reduce).
LINE_RESET = '#line 1 "cuda.cu (as written, before the multimem rewrite)"'
BIND_SYMBOL = "pkb_mc_bind"


def prelude() -> str:
    """The C++ every rewritten source starts with: the table lookup, the combine functions, the binder.
    Generated from multicast_layout's constants (the one definition of the table's layout)."""
    return f"""{PRELUDE_MARK}
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
namespace pkb_mc {{
static __device__ const unsigned long long* table;  // set by {BIND_SYMBOL}: the emulation's window table
struct Window {{ unsigned long long base, size, world; const unsigned long long* bases; }};
__device__ __forceinline__ Window window(unsigned long long a, unsigned long long nbytes) {{
  const unsigned long long* t = table;
  if (t == nullptr || t[0] != {layout.MAGIC}ULL) __trap();  // not bound: no emulated multicast here
  for (unsigned long long i = 0; i < t[1] && i < {layout.MAX_WINDOWS}ULL; ++i) {{
    const unsigned long long* w = t + {layout.HEADER_WORDS} + i * {layout.WINDOW_WORDS};
    if (w[0] <= a && a + nbytes <= w[0] + w[1]) return Window{{w[0], w[1], w[2], w + 3}};
  }}
  __trap();  // outside every window: a real multicast access there faults too
  return Window{{0, 0, 0, nullptr}};
}}
__device__ __forceinline__ unsigned long long at(const Window& w, unsigned int r, unsigned long long a) {{
  return w.bases[r] + (a - w.base);
}}
{_COMBINE_C}}}  // namespace pkb_mc
extern "C" __attribute__((visibility("default"))) int {BIND_SYMBOL}(unsigned long long table) {{
  const unsigned long long* p = reinterpret_cast<const unsigned long long*>(table);
  return (int)cudaMemcpyToSymbol(pkb_mc::table, &p, sizeof(p));
}}
{LINE_RESET}
"""


# -- the rewrite -------------------------------------------------------------------------------------------
def _line_of(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def _foreign(text: str, asm_spans: list[tuple[int, int]]) -> list[Unrewritable]:
    """Multimem or multicast reached outside asm statements: nothing here can rewrite those."""
    out = []
    for start, end, kind in _code_spans(text):
        if kind == "comment":
            continue
        for m in (_FOREIGN if kind == "code" else _INSTRUCTION_LIKE).finditer(text, start, end):
            if any(a <= m.start() < b for a, b in asm_spans):
                continue  # judged with its asm statement
            why = "a multimem instruction outside an asm statement (a PTX string, a macro)" if kind == "string" else \
                "a library call that issues multimem or creates multicast objects"
            out.append(Unrewritable(m.group(0), _line_of(text, m.start()), why))
    return out


def rewrite(source: str) -> RewriteResult:
    """`source` with every multimem asm statement emulated (and the prelude in front when any was)."""
    result = RewriteResult(source=source)
    pieces: list[str] = []
    at = 0
    spans = [s for s in _code_spans(source) if s[2] == "code"]
    consumed_to = 0
    asm_spans: list[tuple[int, int]] = []
    for start, end, _ in spans:
        for m in _ASM.finditer(source, start, end):
            if m.start() < consumed_to:
                continue
            open_at = m.end() - 1
            try:
                close = _matching_paren(source, open_at)
            except _NotRewritable as err:
                result.unrewritable.append(Unrewritable(err.construct, _line_of(source, m.start()), err.why))
                continue
            inner = source[open_at + 1:close]
            consumed_to = close + 1
            asm_spans.append((m.start(), consumed_to))
            if "multimem" not in inner:
                continue
            line = _line_of(source, m.start())
            try:
                sections = _split_top(re.sub(r"\\\r?\n", " ", inner), ":")  # a macro's continuations
                template = _template(sections[0])
                if "multimem" not in template:
                    raise _NotRewritable(inner.strip()[:100], "multimem named in an asm statement's operands")
                operands = _operands(sections[1] if len(sections) > 1 else "") + \
                    _operands(sections[2] if len(sections) > 2 else "")
                statement = _parse_statement(template, operands)
            except _NotRewritable as err:
                result.unrewritable.append(Unrewritable(err.construct, line, err.why))
                continue
            why = statement.opcode.invalid() or _width_mismatch(statement)
            code = _invalid_code(why) if why else _generate(statement)
            if why:
                result.invalid.append(why)
            else:
                result.rewritten[statement.opcode.spelling] += 1
            pieces.append(source[at:m.start()])
            pieces.append(code + _line_breaks(source[m.start():close + 1]))
            at = close + 1
    pieces.append(source[at:])
    result.unrewritable.extend(_foreign(source, asm_spans))
    if result.changed:
        result.source = prelude() + "".join(pieces)
    return result
