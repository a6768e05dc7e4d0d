#!/usr/bin/env bash
# One segment of a long job, in its own session, from the tree's copy (started by long_job.sh):
# `long_job_segment.sh replay|search [--resume]`; marks its end in /tmp/JOB-out/DONE. JOB_ARGS adds options
# (`--device cpu --limit 2`: the dry run of these scripts on a CPU machine). REPLAY_BUDGET_S (1450) is the whole
# replay's wall over all its segments; SEARCH_MINUTES (10.5) the search's budget, which pkb search counts over
# its sessions itself; REPLAY_SET names the recorded set of .pkb/first (GPT-5.5's by default).
job=$1
resume=${2:-}
cd "$(dirname "$0")/../.." || exit 1
R=/tmp/$job-out
source benchmarks/device/setup.sh || { echo "set-up failed" >> $R/MARKS; echo 1 > $R/DONE; exit 1; }
if [ $job = replay ]; then
  used=$(python3 -c "import json, pathlib; p = pathlib.Path('$R/runs/replay-segments.json')
print(int(sum(s['wall_s'] for s in json.loads(p.read_text()))) if p.exists() else 0)")
  budget=$(( ${REPLAY_BUDGET_S:-1450} - used ))
  echo "replay: ${used} s in earlier segments, ${budget} s left" >> $R/MARKS
  [ $budget -gt 0 ] || { echo 0 > $R/DONE; exit 0; }
  python3 benchmarks/gpu_pkb_replay.py --checkout .pkb/first \
    --set .pkb/first/${REPLAY_SET:-solutions_cuda_bf16_h100_8_openai_gpt-5.5} --out $R --concurrency "${REPLAY_CONCURRENCY:-14}" \
    --evaluations-per-gpu 4 --budget-s $budget $resume ${JOB_ARGS:-} > $R/driver.log 2>&1
else
  python3 benchmarks/gpu_offline_search.py --out $R --minutes "${SEARCH_MINUTES:-10.5}" $resume ${JOB_ARGS:-} \
    > $R/driver.log 2>&1
fi
rc=$?
echo "$job rc=$rc at $(( $(date +%s) - $(cat $R/START) ))s" >> $R/MARKS
echo $rc > $R/DONE
