"""The `vllm` engine: Hallmark's watermark inside vLLM, in two modes.

* **Per-request keys** (no speculation): vLLM runs Hallmark's logits-processor plugin
  (:mod:`.logits_processor`), which applies each request's own tenant key. In-process the
  gateway hands the key material to the engine sealed (:mod:`.sealing`); a remote
  ``vllm serve`` resolves a key id against its own 0600 keyring file (:mod:`.keyring`).
* **Engine key** (speculation, e.g. DeepSeek MTP): vLLM's built-in ``dual_key_gumbel``
  under one key that Hallmark derives and records in the store (:mod:`.engine_key`).

Nothing here imports vLLM at package import: the adapter and the plugin import it when
they run, so the rest of Hallmark works without the ``vllm`` extra.
"""

from __future__ import annotations

# How vLLM names the plugin class (``--logits-processors`` / ``LLM(logits_processors=...)``).
PLUGIN = "service.engines.vllm.logits_processor:HallmarkLogitsProcessor"
