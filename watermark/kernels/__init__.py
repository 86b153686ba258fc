"""Triton kernels behind the watermark samplers, each beside its torch reference.

* :mod:`watermark.kernels.philox` -- the PRF ``philox4x32-10-v1`` as Triton building blocks;
* :mod:`watermark.kernels.approximation` -- stage 1 of the race: fast float32 noise, its
  error budget, and the exact float64 values of stage 2;
* :mod:`watermark.kernels.tiles` -- tile layout, loads and lane helpers;
* :mod:`watermark.kernels.race` -- the exact two-stage Gumbel / exponential race over a
  vocabulary chunk, and the plain argmax;
* :mod:`watermark.kernels.reduction` -- the in-kernel cross-block reduction and its workspace;
* :mod:`watermark.kernels.geometry` -- programs per row (launch geometry);
* :mod:`watermark.kernels.error_bound` -- the approximation error measured over all 2^24 uniforms;
* :mod:`watermark.kernels.gumbel` -- the fused batched sampler (``gumbel_sample``) and the
  CUDA paths of :func:`watermark.dispatch.gumbel_argmax` / :func:`~watermark.dispatch.exponential_race`;
* :mod:`watermark.kernels.speculative` -- fused speculative verification;
* :mod:`watermark.kernels.hmac` -- ``hmac-sha256-philox-v1``: SHA-256/HMAC building blocks, the
  rows' HMAC setup and the fused sampler with 256-bit rows;
* :mod:`watermark.kernels.hmac_verify` -- fused speculative verification with 256-bit rows;
* :mod:`watermark.kernels.keyscan` / :mod:`watermark.kernels.keyscan_hmac` -- the corpus scan's
  statistics of many keys over many texts (Philox keys; 256-bit keys);
* :mod:`watermark.kernels.dedup` -- per-request hashed context deduplication on the GPU;
* :mod:`watermark.kernels.registry` -- the specialisations each kernel can be launched
  with, and ``warm_up`` that compiles all of them at engine start.

Every module here imports Triton; import them only where a CUDA device (or Triton's
interpreter, ``TRITON_INTERPRET=1``) is in use. Design notes and measurements: NOTES.md.
"""
