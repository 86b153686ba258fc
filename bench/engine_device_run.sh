#!/bin/bash
# Issue 33's device run: the baseline tree ($1, main as shipped to the device) and this tree
# on one card, in one call; results under $2. Each stage has its own time limit, so a slow
# stage leaves the others' results.
#   bash bench/engine_device_run.sh ROOT OUT [short]
# ``short``: what fits a device budget of about two minutes: parity, 16 and 256 only.
ROOT=$1
OUT=$2
export PYTHONUNBUFFERED=1
log() { grep -v "Loading weights" | tee -a "$OUT/log.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv | log
if [ "$3" = short ]; then
    timeout 50 python3 bench/engine_cuda.py --tree "$ROOT" --requests 256 --rounds 1 --small-rounds 3 \
        --profile-at 0 --parity-out "$OUT/parity-baseline.json" --out "$OUT/engine-baseline.json" 2>&1 | log
    timeout 70 python3 bench/engine_cuda.py --requests 16,256 --rounds 8 --small-rounds 3 --profile-at 0 \
        --parity-check "$OUT/parity-baseline.json" --out "$OUT/engine-cuda.json" 2>&1 | log
    exit 0
fi
# 1. Baseline: the parity set recorded, 16 and 256 rounds, batch 1.
timeout 75 python3 bench/engine_cuda.py --tree "$ROOT" --requests 16,256 --rounds 2 --small-rounds 3 \
    --profile-at 0 --parity-out "$OUT/parity-baseline.json" --out "$OUT/engine-baseline.json" 2>&1 | log
# 2. This tree: parity against 1, 24 rounds each at 16/64/256, 2 at 512/1024, a profiled round.
timeout 200 python3 bench/engine_cuda.py --requests 16,64,256,512,1024 --rounds 24 --big-rounds 2 \
    --small-rounds 3 --profile-at 256 --parity-check "$OUT/parity-baseline.json" \
    --out "$OUT/engine-cuda.json" 2>&1 | log
# 3. End to end: 64 and 256 streaming clients against the engine alone, SQLite ledger.
timeout 80 python3 bench/engine_http.py --requests 64,256 --rounds 2 --out "$OUT/engine-http.json" 2>&1 | log
# 4. The engine's GPU tests.
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/service/engines/local/test_static_runner.py \
    -k "graph_engine_is_batch or block_graphs_replay" 2>&1 | tail -15 | tee "$OUT/pytest-gpu-engine.txt" | log
