"""Rank 1 never joins the collective, and leaves a child process behind if the harness lets it."""

import os
import subprocess
import sys
import time

import torch.distributed as dist


def solution(x):
    if dist.get_rank() == 1:
        # The token lands in the child's command line, where the test looks for survivors.
        token = os.environ.get("PKB_TEST_CHILD_TOKEN", "pkb-test-orphan")
        subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {token}"])
        time.sleep(600)
    out = x.clone()
    dist.all_reduce(out)
    return out
