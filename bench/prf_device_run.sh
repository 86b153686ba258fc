#!/bin/bash
# Issue 36's device run, one call of about 3 minutes: the 256-bit kernels' GPU parity tests,
# the sampler at B = 256 with 256-bit keys beside the Philox kernel (same CUDA-graph harness,
# same logits), and vLLM 0.34's released kernels beside ours (target sampler at T = 1 and
# T != 1, the 0.34 draft sampler, the 0.32 grid). Results under $OUT.
#
# Here, first (CPU, once): copy 0.34's kernel files into var/vllm-0.34 (ignored; never committed):
#   bash bench/prf_device_run.sh prepare
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
OUT=${OUT:?set OUT}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
log() { tee -a "$OUT/log.txt"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv | log
# The image has no pydantic (watermark.spec); the carried wheels, without their dependencies.
pip install -q --no-deps --target var/gpu-site .whl/pydantic-*.whl .whl/pydantic_core-*cp312*.whl \
    .whl/annotated_types-*.whl .whl/typing_inspection-*.whl .whl/typing_extensions-*.whl 2>&1 | tail -2 | log
export PYTHONPATH=$PWD:$PWD/var/gpu-site
# 1. Parity of the 256-bit kernels with their references (bit-exact tokens and routes).
timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider tests/watermark/kernels/test_hmac.py 2>&1 \
    | tail -15 | tee "$OUT/pytest-gpu-hmac.txt" | log
# 2. 256-bit sampler vs Philox at B = 256 and 1; vLLM 0.34: temperature, draft sampler.
timeout 75 python3 -m bench.sampler_kernels --only hmac_sampler,vllm_temperature,vllm_draft \
    --vllm-from var/vllm-0.34 --skip-pytest --budget 70 --out "$OUT/new" 2>&1 | tail -25 | log
# 3. vLLM 0.34's target kernel on the 0.32 comparison grid (tokens and times beside ours).
timeout 45 python3 -m bench.sampler_kernels --only vllm --vllm-from var/vllm-0.34 --skip-pytest --budget 40 \
    --out "$OUT/grid" 2>&1 | tail -15 | log
