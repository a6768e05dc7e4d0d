#!/usr/bin/env bash
# Profiling on one GPU with two ranks sharing it (issue 48; docs/profiling.md, "Ranks that share a GPU"), at the repo
# root of the device machine with carry [".whl"]: `bash benchmarks/device/profile_emulated.sh` (about 4-6 minutes).
#   1. `pkb profile --world-size 2 --ranks-per-gpu 2 --device cuda` on the one-shot all-reduce expert, Nsight Compute on
#      rank 0: the table as people read it (cli.txt), then the same as JSON with the agent's metric set (cli.json);
#   2. `pkb run` with a scripted model (no API key) whose script calls the profile tool on the same expert, then
#      submits it: the tool's answer as the model read it (agent_profile.txt) and the sample's files (agent/).
# Both must show Nsight Compute's counters (a `ncu kernel ...` line; a `one_shot_all_reduce: ...us/call` line) and the
# emulation's caveats. Everything lands in $OUT (default /tmp/profile-emulated), with each step's exit code in
# steps.txt. STEPS picks the steps (default "cli cli_json agent"; e.g. STEPS=agent in a second call if one call's
# 10 minutes run out). DEVICE=cpu is the plumbing's dry run on a machine without a GPU (no emulation, no Nsight, a
# PyTorch-only candidate, shape small: 3.5 minutes on a busy two-core machine).
set -u
OUT=${OUT:-/tmp/profile-emulated}
DEVICE=${DEVICE:-cuda}
STEPS=" ${STEPS:-cli cli_json agent} "
mkdir -p "$OUT"
if [ "$DEVICE" = cuda ]; then
  source benchmarks/device/setup.sh || { echo "set-up failed"; exit 1; }
  command -v ncu > /dev/null || export PATH=$PATH:/usr/local/cuda/bin
  expert=problems/collective/solutions/all_reduce__one_shot.py
  place=(--device cuda --world-size 2 --ranks-per-gpu 2)
  shape=default
  { nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader; echo "ncu: $(command -v ncu)";
    ncu --version 2>&1 | tail -n 1; } > "$OUT/machine.txt" 2>&1
else
  expert=tests/candidates/correct_all_gather_sum.py
  place=(--device cpu --world-size 2)
  shape=small
  echo "dry run on cpu" > "$OUT/machine.txt"
fi
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available(), torch.cuda.device_count())" \
  >> "$OUT/machine.txt" 2>&1
: > "$OUT/steps.txt"
step() {  # step NAME OUTFILE COMMAND...: runs it (if STEPS names it), keeps its output, exit code and wall seconds
  local name=$1 file=$2 t0 rc
  shift 2
  [[ $STEPS == *" $name "* ]] || return 0
  t0=$(date +%s)
  "$@" > "$OUT/$file" 2> "$OUT/$name.err"
  rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s: $*" | tee -a "$OUT/steps.txt"
}

# 1. pkb profile: the expert, ncu on rank 0 (the default rank), the default metric sets, then the agent's set as JSON.
step cli cli.txt python3 -m agent.cli profile --problem all_reduce --solution "$expert" "${place[@]}" --shape $shape \
  --ncu-budget 120
step cli_json cli.json python3 -m agent.cli profile --problem all_reduce --solution "$expert" "${place[@]}" \
  --shape $shape --ncu-budget 120 --ncu-metrics agent --json

# 2. A scripted agent: one profile call, then submit. Its final scoring is untimed (emulated times are no speedups).
python3 - "$expert" "$OUT/script.json" <<'EOF'
import json, pathlib, sys
source = pathlib.Path(sys.argv[1]).read_text()
steps = [["tool", "profile", {"source": source}], ["tool", "submit", {"source": source}]]
pathlib.Path(sys.argv[2]).write_text(json.dumps(steps))
EOF
[[ $STEPS == *" agent "* ]] && rm -rf "$OUT/runs"
step agent agent_run.txt python3 -m agent.cli run --model "scripted:$OUT/script.json" --condition agent:profile \
  --problems all_reduce "${place[@]}" --shape $shape --no-timing --runs-dir "$OUT/runs" --run-id profile-emulated
[[ $STEPS == *" agent "* ]] && python3 - "$OUT" <<'EOF'
import json, pathlib, shutil, sys
out = pathlib.Path(sys.argv[1])
samples = sorted((out / "runs" / "profile-emulated" / "samples").glob("*/*/*"))
if not samples:
    sys.exit("no sample folder: see agent_run.txt and agent.err")
sample = samples[0]
shutil.copytree(sample, out / "agent", dirs_exist_ok=True)
events = out / "runs" / "profile-emulated" / "events.jsonl"
if events.is_file():
    shutil.copy2(events, out / "agent" / "events.jsonl")
transcript = json.loads((sample / "transcript.json").read_text())
answers = [m.get("content", "") for m in transcript if m.get("role") == "tool" and m.get("name") == "profile"]
(out / "agent_profile.txt").write_text("\n\n".join(str(a) for a in answers) + "\n")
print(f"{len(answers)} profile answer(s) in {sample}")
EOF

# What the integrator reads first: each output's Nsight and emulation lines.
{
  for f in cli.txt agent_profile.txt; do
    echo "== $f"
    [ -f "$OUT/$f" ] && grep -E "emulated|Nsight|ncu |us/call|not read|not collected" "$OUT/$f" | cut -c1-240
  done
  echo "== cli.json"
  [ -f "$OUT/cli.json" ] && python3 -c "import json, sys; r = json.load(open(sys.argv[1])); n = r.get('ncu') or {}
print('ncu', n.get('status'), [(k['name'][:40], k['metrics'].get('gpu__time_duration.sum')) for k in n.get('kernels', [])][:3])
print('emulation', len(r.get('emulation', [])), 'lines; ranks_per_gpu', r.get('ranks_per_gpu'))" "$OUT/cli.json"
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
