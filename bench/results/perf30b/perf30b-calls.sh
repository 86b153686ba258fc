#!/bin/bash
# Deterministic: calls per request of the signature and the tokeniser (cProfile ncalls over 8 profiled requests).
PY=/work/wt/perf30b/.venv/bin/python
for tier in public tenant; do for tree in base this; do
  dir=/tmp/perf30b-base; [ $tree = this ] && dir=/work/wt/perf30b
  echo "== tier $tier tree $tree"
  (cd $dir && nice -n 5 $PY -m bench.detect_profile --route --tier $tier --distinct --repeats 8 --profile --top 0 \
     --filter "state.py:[0-9]+\(sign\)|tokenize_with_offsets|encode\)" 2>/dev/null | grep -E "function calls|state.py.*\(sign\)|tokenize_with_offsets" | grep -v "^ *$")
done; done
