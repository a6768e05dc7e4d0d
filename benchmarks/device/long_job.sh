#!/usr/bin/env bash
# Every device call of a long GPU job, at the repo root: `bash benchmarks/device/long_job.sh JOB S`, JOB `replay`
# (the whole-set replay, docs/pkb.md) or `search` (the offline search, docs/performance.md), with carry
# [".whl", ".pkb", ".gpu"]. If this machine runs no such job yet, it starts one in its own session from a copy
# of the tree (a later call replaces the tree), continuing the carried .gpu/JOB.tgz when there is one: the last
# call's machine may have gone back between calls (it did on 2026-12-02), and then only the work in flight is
# lost. Then it reports every 30 s until the job is done or S seconds pass, and leaves in $OUT the job's folder
# so far (JOB.tgz: copy it to .gpu/JOB.tgz before the next call), its progress and, once done, its results.
job=${1:?replay or search}
limit=${2:-540}
case $job in replay|search) ;; *) echo "unknown job $job"; exit 2;; esac
R=/tmp/$job-out
source benchmarks/device/setup.sh || { echo "set-up failed"; exit 1; }
if [ ! -f $R/START ]; then
  echo "autogroups $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null); cores $(nproc); $(bwrap --version)"
  python3 -c "import pydantic, structlog, langgraph, torch; print('torch', torch.__version__, torch.cuda.is_available())" \
    || exit 1
  nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv,noheader
  rm -rf /tmp/w-$job $R && mkdir -p $R && cp -a . /tmp/w-$job && date +%s > $R/START
  resume=""
  if [ -f .gpu/$job.tgz ]; then
    tar xzf .gpu/$job.tgz -C $R && resume=--resume
  fi
  echo "$job: ${resume:-fresh}" | tee -a $R/MARKS
  setsid nohup bash /tmp/w-$job/benchmarks/device/long_job_segment.sh $job $resume > $R/segment.log 2>&1 < /dev/null &
fi
start=$(cat $R/START)
t0=$(date +%s)
next=0
while :; do
  inc=$(( $(date +%s) - t0 ))
  if [ $inc -ge $next ] || [ -f $R/DONE ]; then
    if [ $job = replay ]; then
      done_so_far="results $(ls $R/runs/replay/samples/*/*/*/result.json 2>/dev/null | wc -l)"
    else
      done_so_far="log: $(tail -n 1 $R/search.log 2>/dev/null | cut -c1-100)"
    fi
    smi=$(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null)
    echo "${inc}s in call; $(( $(date +%s) - start ))s on this machine; $done_so_far; marks: $(tr '\n' ';' < $R/MARKS);" \
      "load $(cut -d' ' -f1 /proc/loadavg); gpu $smi" | tee -a $R/progress.log
    next=$(( next + 30 ))
  fi
  [ -f $R/DONE ] && break
  [ $inc -ge $limit ] && break
  sleep 5
done
# The job's folder so far, its SQLite files copied through SQLite's backup (the job may be writing them).
rm -rf /tmp/stage-$job && mkdir -p /tmp/stage-$job && cp -a $R/runs /tmp/stage-$job/ 2>/dev/null
for db in $(cd $R && find runs -name '*.sqlite' 2>/dev/null); do
  python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
    $R/$db /tmp/stage-$job/$db
done
[ -d /tmp/stage-$job/runs ] && tar czf $OUT/$job.tgz -C /tmp/stage-$job runs
cp $R/progress.log $R/$job.md $R/$job.json $OUT/ 2>/dev/null
tail -c 20000 $R/driver.log > $OUT/$job-driver-tail.log 2>/dev/null
gzip -c $R/$job.log > $OUT/$job.log.gz 2>/dev/null
ls -la $OUT
