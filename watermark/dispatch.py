"""The one place that picks an implementation by device.

Each entry point takes tensors on any device and gives the same tokens everywhere:

* CPU: plain-int row setup and the pruned numpy races (:mod:`watermark.sampler`,
  :mod:`watermark.gumbel`, :mod:`watermark.speculative`);
* CUDA: the fused Triton kernels (:mod:`watermark.kernels`), imported on first use so that
  nothing loads Triton on a machine that never samples on a GPU;
* any other device: the torch references.
"""

from __future__ import annotations

import dataclasses

import torch

from watermark import gumbel, stream
from watermark.results import SampleResult, VerifyResult
from watermark.sampler import SamplerRows, padded_contexts, sample_cpu, sample_cpu_table, sample_reference
from watermark.speculative import VerifyRows, verify_reference


def sample(logits: torch.Tensor, rows: SamplerRows, lane: int = stream.LANE_SAMPLE) -> SampleResult:
    """Processed logits [B, V] give one token per row (see :mod:`watermark.sampler`).

    ``lane`` is the stream lane of unwatermarked rows: speculative drafts use their own
    (LANE_DRAFT) so that a draft and its position's correction never share uniforms.
    """
    if logits.device.type == "cpu":
        return sample_cpu(logits, rows, lane)
    if logits.device.type == "cuda":
        return sample_cuda(logits, rows, lane)
    return sample_reference(logits, rows, lane=lane)


def _sample_cuda_wide(logits: torch.Tensor, rows: SamplerRows, contexts: torch.Tensor, widths: torch.Tensor,
                      lane: int) -> SampleResult:
    """Rows with 256-bit keys on CUDA: the HMAC row setup kernel, then the race with the rows'
    keys and states given (:mod:`watermark.kernels.hmac`)."""
    from watermark.kernels.hmac import gumbel_sample_hmac

    result = gumbel_sample_hmac(logits, temperature=(~rows.greedy).to(torch.float32), key_a=rows.key_a,
                                key_b=rows.key_b, mids_a=rows.wide.mids_a, mids_b=rows.wide.mids_b,
                                wide=rows.wide.wide, alpha=rows.alpha, contexts=contexts, widths=widths,
                                watermark=rows.watermark, stream_keys=rows.stream_keys, positions=rows.positions,
                                lane=lane)
    return SampleResult(tokens=result.tokens, routes=result.routes)


def sample_cuda(logits: torch.Tensor, rows: SamplerRows, lane: int = stream.LANE_SAMPLE) -> SampleResult:
    """The fused Triton sampler: row setup, routing and the race in one launch."""
    from watermark.kernels.gumbel import gumbel_sample

    contexts, widths = padded_contexts(rows.contexts, logits.device)
    if rows.wide is not None:
        return _sample_cuda_wide(logits, rows, contexts, widths, lane)
    # Logits arrive processed: temperature 1 keeps them as they are, 0 marks greedy rows.
    temperature = (~rows.greedy).to(torch.float32)
    result = gumbel_sample(logits, temperature=temperature, key_a=rows.key_a, key_b=rows.key_b, alpha=rows.alpha,
                           contexts=contexts, widths=widths, watermark=rows.watermark, stream_keys=rows.stream_keys,
                           positions=rows.positions, lane=lane)
    return SampleResult(tokens=result.tokens, routes=result.routes)


def sample_padded(logits: torch.Tensor, rows: SamplerRows, contexts: torch.Tensor, widths: torch.Tensor,
                  lane: int = stream.LANE_SAMPLE) -> SampleResult:
    """:func:`sample` with the contexts given as a table on the logits' device: row b's
    context is the first ``widths[b]`` entries of ``contexts`` [B, C] int64 (``rows.contexts``
    is not read). On CUDA nothing is read back to the host (an engine keeps its contexts on
    the device between launches); elsewhere the table becomes the rows' context tuples."""
    if logits.device.type == "cuda":
        from watermark.kernels.gumbel import gumbel_sample

        if rows.wide is not None:
            return _sample_cuda_wide(logits, rows, contexts, widths, lane)
        temperature = (~rows.greedy).to(torch.float32)
        result = gumbel_sample(logits, temperature=temperature, key_a=rows.key_a, key_b=rows.key_b, alpha=rows.alpha,
                               contexts=contexts, widths=widths, watermark=rows.watermark,
                               stream_keys=rows.stream_keys, positions=rows.positions, lane=lane)
        return SampleResult(tokens=result.tokens, routes=result.routes)
    from watermark import cpu_race  # numba, imported where the CPU samples

    if logits.device.type == "cpu" and cpu_race.available():
        return sample_cpu_table(logits, rows, contexts.numpy(), widths.numpy(), lane)
    table = [tuple(row[:w]) for row, w in zip(contexts.tolist(), widths.tolist())]
    return sample(logits, dataclasses.replace(rows, contexts=table), lane)


def gumbel_argmax(logits: torch.Tensor, keys: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Logits [B, V], keys [B] and states [B, 4] give token ids [B]: the Triton kernel on
    CUDA, the pruned numpy path elsewhere."""
    if logits.device.type == "cuda":
        from watermark.kernels import gumbel as gumbel_kernel

        return gumbel_kernel.gumbel_argmax(logits, keys, states)
    return gumbel.gumbel_argmax_cpu(logits, keys, states)


def exponential_race(weights: torch.Tensor, keys: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """The ratio form (argmax w / E) of :func:`gumbel_argmax`, same dispatch."""
    if weights.device.type == "cuda":
        from watermark.kernels import gumbel as gumbel_kernel

        return gumbel_kernel.exponential_race(weights, keys, states)
    return gumbel.exponential_race_cpu(weights, keys, states)


def verify(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
           rows: VerifyRows) -> VerifyResult:
    """target_probs [B, k+1, V], draft_probs [B, k, V], draft_tokens [B, k] -> VerifyResult.
    The fused Triton kernel on CUDA, :func:`watermark.speculative.verify_reference`
    elsewhere (same tokens)."""
    if target_probs.device.type == "cuda":
        return verify_cuda(target_probs, draft_probs, draft_tokens, rows)
    return verify_reference(target_probs, draft_probs, draft_tokens, rows)


def verify_padded(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                  rows: VerifyRows, contexts: torch.Tensor, widths: torch.Tensor) -> VerifyResult:
    """:func:`verify` with the block's contexts as a table on the probabilities' device:
    position j of row b has the first ``widths[b]`` entries of ``contexts[b, j]`` ([B, k+1, C]
    int64; ``rows.contexts`` is not read). Nothing is read back on CUDA."""
    if target_probs.device.type == "cuda":
        return _verify_kernel(target_probs, draft_probs, draft_tokens, rows, contexts, widths)
    table = [[tuple(ctx[:w]) for ctx in block] for block, w in zip(contexts.tolist(), widths.tolist())]
    return verify(target_probs, draft_probs, draft_tokens, dataclasses.replace(rows, contexts=table))


def verify_cuda(target_probs, draft_probs, draft_tokens, rows: VerifyRows) -> VerifyResult:
    batch, k = draft_tokens.shape
    flat, flat_widths = padded_contexts([c for row in rows.contexts for c in row], target_probs.device)
    contexts = flat.reshape(batch, k + 1, -1)
    widths = flat_widths.reshape(batch, k + 1)[:, 0].contiguous()
    return _verify_kernel(target_probs, draft_probs, draft_tokens, rows, contexts, widths)


def _verify_kernel(target_probs, draft_probs, draft_tokens, rows: VerifyRows, contexts: torch.Tensor,
                   widths: torch.Tensor) -> VerifyResult:
    """The Philox verification kernel, or (rows with 256-bit keys) the HMAC positions' setup
    and its twin (:mod:`watermark.kernels.hmac_verify`)."""
    args = dict(key_b=rows.key_b, key_coin=rows.key_coin, keyed_coin=rows.keyed_coin, contexts=contexts,
                widths=widths, watermark=rows.watermark, greedy=rows.greedy, stream_keys=rows.stream_keys,
                positions=rows.positions)
    if rows.wide is not None:
        from watermark.hmac_rows import coin_mids
        from watermark.kernels.hmac_verify import verify_hmac

        out = verify_hmac(target_probs, draft_probs, draft_tokens, **args, wide=rows.wide.wide,
                          mids_b=rows.wide.mids_b, mids_coin=coin_mids(rows.wide))
    else:
        from watermark.kernels.speculative import verify as verify_kernel

        out = verify_kernel(target_probs, draft_probs, draft_tokens, **args)
    return VerifyResult(tokens=out.tokens, num_accepted=out.num_accepted, routes=out.routes)
