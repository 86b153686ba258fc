"""A graph-capturable forward of our own for the bundled model architectures
(DeepSeek-V3.2-style MLA + lightning indexer + MoE, and Llama for the draft), over static,
preallocated KV caches. It reuses the loaded transformers module's weights and submodules
(linear layers, norms); what it replaces is the control flow that cannot be captured in a
CUDA graph: the dynamic cache, mask construction, data-dependent expert loops, host reads.

Every function here has fixed shapes for a fixed (batch, inputs, cache columns) and never
reads a tensor on the host, so one call can be captured and replayed per batch bucket.
``tests/service/engines/local/model/`` checks the logits against transformers' own.
"""

from service.engines.local.model.static_cache import StaticCache, forward

__all__ = ["StaticCache", "forward"]
