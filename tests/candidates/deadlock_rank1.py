"""Rank 1 never joins the collective, and leaves a child process behind if the harness lets it."""

import os
import subprocess
import sys
import time

import torch.distributed as dist


def solution(x):
    if dist.get_rank() == 1:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        marker = os.environ.get("PKB_TEST_CHILD_PID_FILE")
        if marker:
            with open(marker, "w") as f:
                f.write(str(child.pid))
        time.sleep(600)
    out = x.clone()
    dist.all_reduce(out)
    return out
