#!/usr/bin/env bash
# Edit -> verdict on one GPU (issue 48; benchmarks/edit_verdict.py), at the repo root of the device machine with
# carry [".whl"]: `bash benchmarks/device/edit_verdict.sh` (one call; about 4-7 minutes).
# For all_reduce then all_gather, a scripted agent (`pkb run --condition agent:check`, W=2, both ranks on the one
# GPU, symmetric memory emulated, untimed) checks a split-layout load_inline candidate, then 5 edits to its kernel
# body, then submits: per check the wall (call -> answer), the compile stage, the build's cache marks and the
# verdict; the median edit -> verdict over the 10 edits and each first build's wall. Outputs in $OUT (default
# /tmp/edit-verdict): table.md, edit_verdict.json, each problem's run log and its run folder (runs/), machine.txt.
# SHAPE (default decode), EDITS (default 5) and PROBLEMS (default "all_reduce all_gather") change the sequence;
# DEVICE=cpu is the plumbing's dry run on a machine without a GPU (PyTorch-only candidates, shape small).
# The whole script ends within TOTAL_S (default 450 s, set-up included): each problem gets an equal share of what
# is left when it starts, and a run cut short still leaves the checks it finished in its folder (read below).
set -u
started=$(date +%s)
TOTAL_S=${TOTAL_S:-450}
OUT=${OUT:-/tmp/edit-verdict}
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-}
EDITS=${EDITS:-5}
PROBLEMS=${PROBLEMS:-all_reduce all_gather}
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  # keeps NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 (set there)
  source benchmarks/device/setup.sh || { echo "set-up failed"; exit 1; }
  command -v nvcc > /dev/null || export PATH=$PATH:/usr/local/cuda/bin
  { nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader; nvcc --version | tail -n 2;
    nproc; } > "$OUT/machine.txt" 2>&1
else
  echo "dry run on cpu" > "$OUT/machine.txt"
fi
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available(), torch.cuda.device_count())" \
  >> "$OUT/machine.txt" 2>&1
env | grep -E "^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)=" >> "$OUT/machine.txt"
: > "$OUT/steps.txt"
left=$(wc -w <<< "$PROBLEMS")
for problem in $PROBLEMS; do  # one after the other: no build or GPU shared between the two sequences
  t0=$(date +%s)
  limit=$(( (started + TOTAL_S - 20 - t0) / left ))  # 20 s kept for the table at the end
  left=$(( left - 1 ))
  timeout -k 10 "$limit" python3 -m benchmarks.edit_verdict --device "$DEVICE" --problems "$problem" \
    --edits "$EDITS" ${SHAPE:+--shape "$SHAPE"} --out "$OUT/$problem" > "$OUT/$problem.txt" 2>&1
  echo "$problem rc=$? $(( $(date +%s) - t0 ))s (limit ${limit}s)" | tee -a "$OUT/steps.txt"
done
# The table over both problems (the median over every edit), read from the run folders.
rm -rf "$OUT/runs" && mkdir -p "$OUT/runs"  # a rerun in the same OUT replaces the last one
for problem in $PROBLEMS; do
  [ -d "$OUT/$problem/runs/edit-verdict-$problem" ] && mv "$OUT/$problem/runs/edit-verdict-$problem" "$OUT/runs/"
done
python3 -m benchmarks.edit_verdict --read "$OUT/runs" --problems $PROBLEMS --device "$DEVICE" ${SHAPE:+--shape "$SHAPE"} \
  --out "$OUT" > "$OUT/table.md" 2>&1
# The run folders in one archive: the device tool brings back no folder deeper than 16 levels or with many files,
# and each check's record (candidates/NNN.json) is what tells where an edit's seconds went.
tar czf "$OUT/runs.tgz" -C "$OUT" runs 2>/dev/null
echo "script wall $(( $(date +%s) - started ))s" >> "$OUT/steps.txt"
cat "$OUT/steps.txt" "$OUT/table.md"
