#!/bin/bash
# Issue 33's device run in one command, most important first; every stage writes what it has
# measured to OUT as it goes, and is time-boxed from what is left of BUDGET seconds, so a slow
# stage (a fresh machine compiles every Triton kernel before the first capture) costs the
# later stages, never the results already written.
#   bash bench/engine_device_run.sh OUT [BUDGET=150] [DEVICE=cuda]
# Stages: 1. bench/engine_cuda.py: 256 on/off alternating, as many rounds (up to 24) as fit in
# 55 s after the engine started; then 16 and 64 (up to 4 rounds each), 512 and 1,024 (one
# each), each size at least one round within 15 s more; batch 1 and single-key 16; one
# profiled round at 256 (GPU busy, kernels); last, the parity set's outputs recorded (no
# baseline tree runs: it would cost a second start). Its JSON is rewritten after every round;
# it may use all but 40 s. 2. bench/engine_http.py at 64 and 256, one round of each mode.
# 3. The engine's GPU tests, if time is left.
# DEVICE=cpu: the same stages on tiny sizes (a dry run of this script on any machine).
# Gateway dependencies: cp312 wheels in .whl/ (carried), installed with --no-deps --target.
set -u
OUT=${1:?usage: engine_device_run.sh OUT [BUDGET] [DEVICE]}
BUDGET=${2:-150}
DEVICE=${3:-cuda}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
START=$(date +%s)
PY=${PYTHON:-python3}
log() { grep --line-buffered -v "Loading weights" | tee -a "$OUT/log.txt"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }
box() { local s=$(($(left) - $1)); [ "$s" -lt 10 ] && s=10; echo "$s"; }  # what is left less $1, 10 s at least
stage() { echo "== $1 at $(($(date +%s) - START)) s, $(left) s left" | log; }

if [ "$DEVICE" = cuda ]; then
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv 2>&1 | log
    SIZES=256,16,64,512,1024 ROUNDS=256=24,16=4,64=4,512=1,1024=1 STOP=55 HTTP=64,256 TOKENS=128 PROFILE=256
else
    SIZES=8,4,16 ROUNDS=8=2,4=1,16=1 STOP=60 HTTP=4,8 TOKENS=16 PROFILE=8
fi
if [ -d .whl ] && ! "$PY" -c "import fastapi, httpx, sqlalchemy, pydantic_settings" 2>/dev/null; then
    stage "installing the gateway's wheels"
    "$PY" -m pip install -q --no-deps --no-index --target .dev/site .whl/*.whl 2>&1 | tail -3 | log
    export PYTHONPATH=$PWD/.dev/site${PYTHONPATH:+:$PYTHONPATH}
fi

stage "1. engine_cuda: $SIZES ($ROUNDS), profile at $PROFILE, batch 1"
timeout --kill-after=5 "$(box 40)" "$PY" bench/engine_cuda.py --device "$DEVICE" --requests "$SIZES" \
    --rounds-at "$ROUNDS" --warmups 1 --stop-rounds-after "$STOP" --grace 15 --tokens "$TOKENS" \
    --profile-at "$PROFILE" --small-rounds 3 --parity-last --parity-out "$OUT/parity-this-tree.json" \
    --out "$OUT/engine-cuda.json" 2>&1 | log

if [ "$(left)" -gt 25 ]; then
    stage "2. engine_http: $HTTP streaming clients, SQLite ledger"
    timeout --kill-after=5 "$(box 5)" "$PY" bench/engine_http.py --device "$DEVICE" --requests "$HTTP" \
        --rounds 1 --tokens "$TOKENS" --out "$OUT/engine-http.json" 2>&1 | log
fi

if [ "$(left)" -gt 30 ] && [ "$DEVICE" = cuda ]; then
    stage "3. the engine's GPU tests"
    timeout --kill-after=5 "$(box 3)" "$PY" -m pytest -q -x -m gpu -p no:cacheprovider \
        tests/service/engines/local/test_static_runner.py 2>&1 | tail -15 | tee "$OUT/pytest-gpu-engine.txt" | log
fi
stage "done"
