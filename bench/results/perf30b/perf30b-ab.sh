#!/bin/bash
# A/B: base = main 68cbe80 (git archive into /tmp/perf30b-base, this branch's bench file copied in),
# this = /work/wt/perf30b. Same venv python; each run from its tree's root (cwd first on sys.path).
PY=/work/wt/perf30b/.venv/bin/python
OUT=/work/wt/perf30b/bench/results/detect-profile-perf30b-ab.jsonl
for round in 1 2; do
  for tier in tenant public expert; do
    for tree in base this; do
      dir=/tmp/perf30b-base; [ $tree = this ] && dir=/work/wt/perf30b
      echo "== round $round tier $tier tree $tree $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
      (cd $dir && BENCH_TREE=$tree nice -n 5 $PY -m bench.detect_profile --route --tier $tier --distinct --repeats 100 2>/dev/null | tail -1 | sed "s/^{/{\"tree\": \"$tree\", \"round\": $round, /" | tee -a $OUT)
    done
  done
done
