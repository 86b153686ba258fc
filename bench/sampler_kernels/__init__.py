"""Benchmark of the watermark kernels on one GPU, with the parity checks of the same run.

    python -m bench.sampler_kernels --out DIR        (from the repository root)
    python -m bench.sampler_kernels --quick --out DIR   (~3-4 minutes: parity tests of the
        sampler kernels only, the headline grid, compaction/row-split comparison at B = 256,
        verification and dedup; the sweeps and the warm-up timing are copied from the
        previous results file, marked "not re-run")

1. runs the GPU parity tests (``pytest -m gpu tests/watermark/kernels``), log in DIR;
2. measures: device-to-device copy bandwidth (the read floor), the stage-1 approximation
   error over all 2^24 uniforms, the fused sampler for B in {1, 8, 32, 256, 512}, float32
   and bfloat16, N(0,1) and Zipf(2) logits, single and dual key, against the torch
   reference of the same run (whose tokens every timed configuration is checked against),
   row splits and tile shapes for B = 256, temperature != 1, the pruning potential on
   Zipf(2), speculative verification (B = 64, k = 4), dedup cost against history length,
   and the warm-up registry;
3. writes DIR/sampler-h200.json after every section (a crash leaves the sections before
   it) and prints a compact table last.

Side by side with vLLM (``--vllm-from DIR``): vLLM 0.32's own watermark kernels
(``philox_gumbel_sample``), loaded from an installed vLLM's package files that
``--prepare-vllm-from SITE --vllm-from DIR`` copies into DIR (an ignored folder; nothing of
vLLM is committed: ``vllm/v1/worker/gpu/sample/{watermark,gumbel}.py``,
``vllm/v1/watermarking/prfs/{base,philox}.py``, empty ``__init__.py`` files and a
``vllm/triton_utils.py`` exporting triton, tl, HAS_TRITON), timed in the same harness on
the same logits as ours, with token agreement checked on every configuration.

Timing: CUDA-graph replays of one call per input set, sets rotated so that the logits
read by consecutive calls exceed three times the L2 cache (no call reads from a warm L2);
the median replay over the number of calls. ``eager_us`` is triton.testing.do_bench's
median of single eager calls (host launch overhead included). Needs torch, triton, numpy
and pytest only.

Modules: :mod:`.harness` (settings, the run record, timing, inputs, the summary table),
:mod:`.sampler` (the fused sampler's sections), :mod:`.sections` (device, parity tests,
error bound, verification, dedup, warm-up), :mod:`.vllm_side` (vLLM's kernels beside ours)
and :mod:`.__main__` (the command line).
"""
