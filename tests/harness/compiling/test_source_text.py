"""What the harness reads of a candidate's source is what Python runs (issue 45, class 8): a PEP 263
declaration of another encoding than UTF-8 is refused as a compile_error before anything reads the source as
text; the static scan given the file's bytes reads it as import does."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.compiling.compile import compile_candidate
from harness.compiling.source_text import SourceEncodingError, source_text
from harness.judge.static_scan import static_scan

HIDDEN = b"# -*- coding: utf-7 -*-\n# a comment +AAo-import harness.judge\ndef solution(x):\n    return x\n"


def test_utf8_declared_or_not_with_or_without_a_bom_is_read():
    assert source_text(b"x = '\xc3\xa9'\n") == "x = '\u00e9'\n"
    assert source_text(b"# coding: utf-8\nx = 1\r\n") == "# coding: utf-8\nx = 1\n"
    assert source_text(b"# vim: set fileencoding=utf8 :\nx = 1\n").endswith("x = 1\n")
    assert source_text(b"\xef\xbb\xbfx = 1\n") == "x = 1\n"


@pytest.mark.parametrize("raw, says", [
    (HIDDEN, "'utf-7'"),
    (b"#!/usr/bin/env python\n# -*- coding: latin-1 -*-\nx = '\xe9'\n", "'iso-8859-1'"),
    (b"# coding: pkb-no-such-codec\nx = 1\n", "refused"),
    (b"x = '\xe9'\n", "invalid or missing encoding declaration"),  # Python's own words, in the first two lines
    (b"x = 1\ny = 2\nz = '\xe9'\n", "not UTF-8"),
])
def test_any_other_encoding_is_refused(raw: bytes, says: str):
    with pytest.raises(SourceEncodingError, match=says):
        source_text(raw)


def test_the_scan_given_bytes_reads_what_import_runs():
    """Decoded as UTF-8 the import is a comment; Python runs it."""
    assert static_scan(HIDDEN.decode()) == []
    assert [f["flag"] for f in static_scan(HIDDEN)] == ["static:harness_access"]


def test_a_declared_utf7_candidate_is_a_compile_error(tmp_path: Path):
    path = tmp_path / "candidate.py"
    path.write_bytes(HIDDEN)
    outcome = compile_candidate(path, 60.0, "cpu")
    assert not outcome.ok and outcome.verdict == "compile_error" and "'utf-7'" in outcome.message
