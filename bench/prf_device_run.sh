#!/bin/bash
# Issue 36's device run, one call of about 4 minutes (<= 240 s of commands): the 256-bit kernels'
# GPU parity tests (sampler, speculative verification, corpus scan, the GPU scan path), then one
# benchmark process (same CUDA-graph harness, same inputs, every timed configuration checked
# against its reference): the verification kernel and the corpus scan with 256-bit keys beside
# Philox's, text generated through vLLM 0.34's released target kernel on the bundled model and
# detected, the sampler at B = 256 with 256-bit keys beside Philox's, vLLM 0.34's temperature and
# draft sampler, and 0.34's target kernel on the 0.32 comparison grid. Results under $OUT.
#
# Here, first (CPU, once): copy 0.34's kernel files into var/vllm-0.34 (ignored; never committed):
#   bash bench/prf_device_run.sh prepare
# Dry run of the benchmark part on a CPU (Triton's interpreter, tiny sizes):
#   bash bench/prf_device_run.sh smoke
# On the device (carry: .whl var/vllm-0.34; .whl holds the cp312 pydantic wheels, see NOTES.md):
#   bash bench/prf_device_run.sh
set -u
if [ "${1:-}" = prepare ]; then
    WHEEL_DIR=${VLLM_WHEEL_DIR:-/tmp/vllm034}
    mkdir -p "$WHEEL_DIR"
    ls "$WHEEL_DIR"/vllm-0.34.0-*.whl >/dev/null 2>&1 || pip download --no-deps vllm==0.34.0 -d "$WHEEL_DIR"
    (cd "$WHEEL_DIR" && unzip -q -o vllm-0.34.0-*.whl 'vllm/v1/worker/gpu/*' 'vllm/v1/watermarking/*' \
        'vllm-0.34.0.dist-info/METADATA' -d x)
    rm -rf var/vllm-0.34
    .venv/bin/python -m bench.sampler_kernels --prepare-vllm-from "$WHEEL_DIR/x" --vllm-from var/vllm-0.34
    exit 0
fi
SECTIONS=hmac_verify,hmac_keyscan,vllm_generate,hmac_sampler,vllm_temperature,vllm_draft,vllm
if [ "${1:-}" = smoke ]; then
    OUT=${OUT:-/tmp/prf-device-smoke}
    mkdir -p "$OUT"
    TRITON_INTERPRET=1 PYTHONWARNINGS=ignore .venv/bin/python -m bench.sampler_kernels --smoke \
        --only "$SECTIONS" --vllm-from var/vllm-0.34 --skip-pytest --out "$OUT"
    exit $?
fi
OUT=${OUT:?set OUT}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
log() { tee -a "$OUT/log.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv | log
# The image has no pydantic (watermark.spec); the carried wheels, without their dependencies.
pip install -q --no-deps --target var/gpu-site .whl/pydantic-*.whl .whl/pydantic_core-*cp312*.whl \
    .whl/annotated_types-*.whl .whl/typing_inspection-*.whl .whl/typing_extensions-*.whl 2>&1 | tail -2 | log
export PYTHONPATH=$PWD:$PWD/var/gpu-site
# 1. Parity of the 256-bit kernels with their references (bit-exact tokens, routes, counts and
#    scan statistics), and the GPU scan's 256-bit groups against the CPU pass.
#    SIGINT at the limit: pytest still prints its summary of the tests that ran. (The first H100
#    run lost this stage to compiles of the unrolled SHA-256; the rounds are a loop since: 2-8 s a
#    kernel for sm_90 ahead of time on a CPU, tests/watermark/kernels/test_hmac_compile.py.)
timeout --signal=INT 100 python3 -m pytest -v -m gpu -p no:cacheprovider tests/watermark/kernels/test_hmac.py \
    tests/service/test_scan_wide.py > "$OUT/pytest-gpu-hmac.txt" 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed|Interrupt" "$OUT/pytest-gpu-hmac.txt" | tail -30 | log
# 2. One benchmark process, sections in order of priority (a section the budget cannot fit is
#    skipped and says so in $OUT/bench/sampler-h200.json).
timeout --signal=INT 125 python3 -m bench.sampler_kernels --only "$SECTIONS" --vllm-from var/vllm-0.34 --skip-pytest \
    --budget 110 --out "$OUT/bench" 2>&1 | tail -30 | log
