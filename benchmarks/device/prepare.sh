#!/usr/bin/env bash
# On the CPU machine, once per checkout, at the repo root: what the GPU machine's calls carry (the device tool's
# `carry`), in folders git ignores: .whl (the wheels of wheels.txt for Python 3.12, and Debian's bubblewrap with
# libcap, for the sandbox) and .pkb/first (ParallelKernelBench's first public commit, from the stored mirror).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for d in /.whl/ /.pkb/ /.gpu/; do grep -qxF "$d" .git/info/exclude || echo "$d" >> .git/info/exclude; done
mkdir -p .whl .gpu
platforms=()
for n in 5 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
grep -v '^#' benchmarks/device/wheels.txt | xargs python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl
(cd .whl && apt-get download bubblewrap libcap2)
mirror=${PKB_MIRROR:-/work/.mirror/togethercomputer+ParallelKernelBench/repo}
if [ ! -d .pkb/first ]; then
  mkdir -p .pkb/first
  git --git-dir="$mirror" archive "$(git --git-dir="$mirror" rev-list --max-parents=0 HEAD)" | tar -x -C .pkb/first
fi
du -sh .whl .pkb
