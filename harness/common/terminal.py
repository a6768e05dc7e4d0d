"""Text from a candidate or a model, made safe to print on a terminal.

A candidate's error message, its output, a transcript, even a file name are the candidate's to choose: an
escape sequence in them is obeyed by the terminal that prints it. A failing candidate's message once moved
the cursor up and printed a green "verdict: correct" over `pkb eval`'s real verdict. `terminal_safe`
removes what a terminal would obey rather than show: ESC sequences (CSI, OSC, DCS and the other string
controls, two-byte escapes), every other C0 control but newline and tab (carriage return and backspace
rewrite a line), DEL, the C1 controls (U+0080-U+009F; U+009B is a CSI on its own), and the Unicode
bidirectional overrides and isolates that show text in another order than it is (U+202E). HTML, markdown
and LaTeX output escape text their own way; rich markup (`[bold]`) is escaped by agent.cli.common.escape.
Standard library only.
"""

from __future__ import annotations

import re

_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI: ESC [ parameters intermediates final
    r"|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC, DCS, SOS, PM, APC: up to BEL or ST (or the end)
    r"|\x1b[ -/]*[0-~]?"  # any other escape: ESC, intermediates, final (ESC 7, ESC ( B, ESC c)
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # the one-character C1 CSI with its parameters
    r"|[\x9d\x90\x98\x9e\x9f][^\x07\x9c\x1b]*(?:\x07|\x9c)?"  # C1 OSC, DCS, SOS, PM, APC strings
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # the other C0 controls (but \t and \n), DEL, C1
    r"|[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"  # bidirectional marks, embeddings, overrides, isolates
)


def terminal_safe(text: str) -> str:
    """`text` without anything a terminal would obey instead of showing (see the module's docstring);
    newlines and tabs are kept."""
    return _ESCAPES.sub("", text)
