#!/bin/bash
# Deterministic side: cProfile of 40 requests per tier and tree (distinct texts), function calls and stages.
PY=/work/wt/perf30b/.venv/bin/python
for tier in tenant public; do
  for tree in base this; do
    dir=/tmp/perf30b-base; [ $tree = this ] && dir=/work/wt/perf30b
    echo "== tier $tier tree $tree $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd $dir && nice -n 5 $PY -m bench.detect_profile --route --tier $tier --distinct --repeats 40 --profile --top 0 2>/dev/null \
      | grep -E "function calls|^\| (route|  access|request|tokenise|report|detector|ledger look)" )
  done
done
