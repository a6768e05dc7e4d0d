"""compile_error: a load_inline C++ extension with a syntax error (a missing ';'), built at import.

Its source includes no torch header (`no_implicit_headers=True`), so the compiler meets the error at once
rather than after torch's headers (about 20 s on 2 cores): what the tests that use it look at is the verdict
and the compiler's line, not the headers.
"""

from torch.utils.cpp_extension import load_inline

_SOURCE = """
int doubled(int x) { return x * 2 }
"""

_ext = load_inline(name="pkb_test_missing_semicolon", cpp_sources=_SOURCE, functions=["doubled"],
                   no_implicit_headers=True, verbose=False)


def solution(x):
    return x * _ext.doubled(1)
