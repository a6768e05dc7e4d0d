"""compile_error: a load_inline C++ extension with a syntax error (a missing ';'), built at import."""

import torch
from torch.utils.cpp_extension import load_inline

_SOURCE = """
#include <torch/extension.h>
torch::Tensor doubled(torch::Tensor x) { return x * 2 }
"""

_ext = load_inline(name="pkb_test_missing_semicolon", cpp_sources=_SOURCE, functions=["doubled"], verbose=False)


def solution(x):
    return _ext.doubled(x)
