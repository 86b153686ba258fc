"""Triton kernels behind the watermark samplers, each beside its torch reference.

* :mod:`watermark.kernels.philox` -- the PRF ``philox4x32-10-v1`` as Triton building blocks;
* :mod:`watermark.kernels.race` -- the exact two-stage Gumbel / exponential race over a
  vocabulary chunk and the in-kernel cross-block reduction;
* :mod:`watermark.kernels.gumbel` -- the fused batched sampler (``gumbel_sample``) and the
  CUDA paths of :func:`watermark.dispatch.gumbel_argmax` / :func:`~watermark.dispatch.exponential_race`;
* :mod:`watermark.kernels.speculative` -- fused speculative verification;
* :mod:`watermark.kernels.dedup` -- per-request hashed context deduplication on the GPU;
* :mod:`watermark.kernels.registry` -- the specialisations each kernel can be launched
  with, and ``warm_up`` that compiles all of them at engine start.

Every module here imports Triton; import them only where a CUDA device (or Triton's
interpreter, ``TRITON_INTERPRET=1``) is in use. Design notes and measurements: NOTES.md.
"""
