#!/bin/bash
# Alternated: base (a187a9b) and route30, PAIRS pairs of the in-process route bench.
OUT=/work/wt/route30/bench/results/detect-route30.jsonl
PY=/work/wt/route30/.venv/bin/python
for r in 1 2 3 4; do
  for tree in base-route30 route30; do
    cd /work/wt/$tree && git log --oneline -1 | cut -c1-7 > /tmp/route30/head_$tree
    PYTHONPATH=. nice -n 5 $PY -m bench.detect_profile --route --tier expert --distinct --repeats 300 2>/dev/null \
      | grep '^{' | sed "s/^{/{\"tree\": \"$tree@$(cat /tmp/route30/head_$tree)\", \"round\": $r, /" >> $OUT
  done
done
echo done > /tmp/route30/alt.done
