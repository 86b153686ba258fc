#!/bin/sh
# Alternates the untouched tree (a187a9b, /work/wt/base-kgram30) and this branch, same .venv:
#   sh bench/results/detect-kgram-index/alternate.sh PAIRS > log
PY=/work/wt/kgram30/.venv/bin/python
H=/work/wt/kgram30/bench/results/detect-kgram-index
P=/work/wt/kgram30/bench/results/detect-perf30d-perfE  # perfE's replay (micro.py), run as it is
for i in $(seq 1 ${1:-3}); do
  for tree in /work/wt/base-kgram30 /work/wt/kgram30; do
    cd $tree
    echo "== pair $i $tree load $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$tree nice -n 5 $PY -m bench.detect_profile --route --tier expert --distinct --repeats 300 2>/dev/null | tail -1
    PYTHONPATH=$tree nice -n 5 $PY $P/micro.py 2>/dev/null | grep MICRO
    PYTHONPATH=$tree nice -n 5 $PY $H/floor_sql.py 2>/dev/null | grep FLOOR
  done
done
