"""Reading the candidate file out of a model's text reply."""

from __future__ import annotations

import re

_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)[^\n]*$")
PYTHON_TAGS = frozenset({"python", "py", "python3"})


def _fenced_blocks(text: str) -> list[tuple[str, str, bool]]:
    """(language, body, closed) for each fenced block, CommonMark-style: a closing fence uses the opening
    character at least as many times; an unclosed block runs to the end of the text."""
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _OPEN.match(lines[i])
        if not match or (match.group(1)[0] == "`" and "`" in lines[i].strip()[len(match.group(1)):]):
            i += 1
            continue
        fence, lang = match.group(1), match.group(2).lower()
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        body = []
        i += 1
        while i < len(lines) and not close.match(lines[i]):
            body.append(lines[i])
            i += 1
        closed = i < len(lines)
        blocks.append((lang, "\n".join(body), closed))
        i += 1
    return blocks


def extract_code(reply_text: str | None) -> str | None:
    """The candidate file in a text reply: the last ```python block, or else the only (untagged) fenced block.

    None when there is no such block, when several untagged blocks leave it ambiguous, or when the
    block is empty. An unclosed last block (a reply cut off by the token limit) still counts: it is the
    code the model produced, and the harness will say it does not compile.
    """
    if not reply_text:
        return None
    blocks = [b for b in _fenced_blocks(reply_text) if b[1].strip()]
    python = [b for b in blocks if b[0] in PYTHON_TAGS]
    if python:
        chosen = python[-1]
    elif len(blocks) == 1 and not blocks[0][0]:  # one untagged block; a ```cuda or ```bash one is not the file
        chosen = blocks[0]
    else:
        return None
    return chosen[1].strip("\n") + "\n"
