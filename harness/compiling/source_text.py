"""A candidate's source as text, exactly as Python will read it, or a refusal.

Python honours a PEP 263 declaration (`# -*- coding: utf-7 -*-`) in a file's first two lines: such a file
decoded as UTF-8 (the static scan, build discovery, the environment check) is another program than the one
import runs; in UTF-7 `+AAo-` is a newline, so a "comment" there is code. Rather than follow every codec
Python accepts, the harness accepts UTF-8 alone (declared or not, a BOM allowed): a source that declares
anything else, or whose bytes are not UTF-8, is refused as a compile_error. Every reader of candidate
source then reads what Python runs. Standard library only: the rank side may import it.
"""

from __future__ import annotations

import codecs
import io
import tokenize

ACCEPTED = ("utf-8", "utf-8-sig")  # codecs' own names of UTF-8, whatever alias declared it (utf8, UTF_8)


class SourceEncodingError(ValueError):
    """The source declares an encoding other than UTF-8, or its bytes are not UTF-8; one line."""


def declared_encoding(raw: bytes) -> str:
    """The encoding Python reads `raw` with (tokenize's normalised name); SourceEncodingError where Python
    itself would refuse the declaration (an unknown codec, a BOM that contradicts it)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as err:
        raise SourceEncodingError(f"the source's encoding declaration is refused: {err.msg}"[:200]) from None
    return encoding


def source_text(raw: bytes) -> str:
    """The text Python runs for `raw`: UTF-8 only (see the module's docstring), newlines as Python reads
    them. SourceEncodingError otherwise."""
    encoding = declared_encoding(raw)
    try:
        known = codecs.lookup(encoding).name
    except LookupError:  # detect_encoding looked it up already; never here
        known = encoding
    if known not in ACCEPTED:
        raise SourceEncodingError(f"the source declares the encoding {encoding[:40]!r}; only UTF-8 source is "
                                  "accepted (what the harness reads must be what Python runs)")
    try:
        text = raw.decode(known)
    except UnicodeDecodeError as err:
        raise SourceEncodingError(f"the source is not UTF-8 (byte {err.start}: {err.reason})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as import reads it
