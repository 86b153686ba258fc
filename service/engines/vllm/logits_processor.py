"""Hallmark's per-request watermark as a vLLM logits-processor plugin.

Load it with ``LLM(..., logits_processors=[service.engines.vllm.PLUGIN])`` or ``vllm serve
... --logits-processors service.engines.vllm.logits_processor:HallmarkLogitsProcessor``.
Each request names its key in ``SamplingParams.extra_args`` (:mod:`.watermark_args`);
requests without one pass through untouched (the opt-out).

Where it runs, and why it draws the token itself. vLLM 0.32's sampler
(``vllm/v1/sample/sampler.py``) applies, in order: allowed-token and bad-word masks, the
non-argmax-invariant logits processors (min-tokens, logit bias, then custom ones like this
one), penalties, then temperature, min-p, top-k/top-p and the random draw. The watermark
must act on the *final* distribution, so this plugin applies the request's temperature,
top-k and top-p itself (:func:`watermark.processing.process_logits`), draws the token with
Hallmark's batched sampler (:func:`watermark.dispatch.sample`: per-row keys, dual-key
routing and deduplicated positions drawn from the request's seeded ordinary stream) and
sets every other logit to -inf. What vLLM does afterwards cannot change the outcome: a
row with one finite logit stays one-hot under division by a positive temperature, under
top-k/top-p and min-p (the maximum is always kept), and under penalties (which only
scale or shift finite logits), and both its greedy argmax and its random draw pick the
one finite token. Temperature 0 rows are left alone: vLLM's greedy argmax is Hallmark's
unwatermarked greedy choice.

Penalties and min-p would act *after* this plugin, on a distribution the watermark has
already drawn from, so watermarked requests that set them are refused
(:meth:`HallmarkLogitsProcessor.validate_params`), as is ``n > 1`` (its copies would share
key, seed and context, and so repeat one text).
"""

from __future__ import annotations

import logging

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from service.engines.vllm.plugin_state import PluginState, RequestSpec
from service.engines.vllm.watermark_args import WatermarkArgsError, resolve
from watermark import stream
from watermark.key import row_keys

log = logging.getLogger("hallmark.vllm")


def check_sampling(params: SamplingParams) -> None:
    """Refuse sampling options the watermark cannot honour (see the module docstring)."""
    if params.n != 1:
        raise WatermarkArgsError("a watermarked request must have n=1; send n separate requests")
    if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0 or params.repetition_penalty != 1.0:
        raise WatermarkArgsError("presence, frequency and repetition penalties are not supported with "
                                 "the Hallmark watermark; leave them at their defaults")
    if params.min_p != 0.0:
        raise WatermarkArgsError("min_p is not supported with the Hallmark watermark; use top_p or top_k")


def _request_state(params: SamplingParams, prompt_ids: list[int] | None,
                   output_ids: list[int]) -> RequestSpec | None:
    """The request's watermark as plain values, or None (opted out, or greedy: vLLM's
    greedy argmax is Hallmark's unwatermarked greedy choice, so greedy rows are left alone)."""
    watermark = resolve(params.extra_args, params.seed)
    if watermark is None or float(params.temperature) == 0.0:
        return None
    spec = watermark.key.spec
    check_plugin_key(watermark.key)
    keys = row_keys(watermark.key)
    return RequestSpec(key_a=keys.key_a, key_b=keys.key_b, alpha=keys.alpha, stream_key=stream.stream_key(watermark.seed),
                       width=spec.context_width, scope=spec.dedup, max_history=spec.dedup_max_history,
                       temperature=float(params.temperature), top_k=max(int(params.top_k), 0),
                       top_p=float(params.top_p))


def check_plugin_key(key) -> None:
    """The plugin's rows hold 64-bit Philox keys (plugin_state): a 256-bit key is refused
    here, in the front end, with what to do (its text is never generated unwatermarked)."""
    if key.spec.key_bits != 64:
        raise ValueError(f"the vLLM plugin runs 64-bit philox keys only; key {key.fingerprint} uses {key.spec.prf} "
                         "(256-bit): serve it with the local engine, or give the tenant a key with --prf philox")


class _Refused:
    """A request whose key could not be resolved inside the engine (validate_params
    resolves it first, so only a keyring changed in between gets here). A logits processor
    cannot fail one request without killing the engine, so it ends the request at once
    with an end-of-sequence token instead of emitting unwatermarked text."""


class HallmarkLogitsProcessor(LogitsProcessor):
    """Per-request Gumbel-max watermark (see the module docstring)."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        # Runs in vLLM's front end for every request: an error here becomes HTTP 400 (or
        # an exception from AsyncLLM.generate) instead of a failure inside the engine.
        watermark = resolve(sampling_params.extra_args, sampling_params.seed)
        if watermark is not None:
            check_sampling(sampling_params)
            check_plugin_key(watermark.key)

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.device = torch.device(device)
        self._refused: dict[int, _Refused] = {}
        self._eos_ids = _eos_ids(vllm_config)
        slots = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", None) or 64
        capacity = getattr(getattr(vllm_config, "model_config", None), "max_model_len", None) or 4096
        self._state = PluginState(self.device, slots=int(slots), capacity=int(capacity))
        self._state.warm_up()

    def is_argmax_invariant(self) -> bool:
        return False  # it picks the token, so it must also run for greedy batches

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow vLLM's persistent batch (added, then removed, then moved, the order of
        vLLM's own ``process_dict_updates``); per-request state stays in the plugin's slots."""
        if not batch_update:
            return
        for index, params, prompt_ids, output_ids in batch_update.added:
            self._refused.pop(index, None)
            self._state.remove(index)
            entry = self._new_state(params, prompt_ids, output_ids)
            if isinstance(entry, _Refused):
                self._refused[index] = entry
            elif entry is not None:
                self._state.add(index, entry, prompt_ids, output_ids)
        for index in batch_update.removed:
            self._refused.pop(index, None)
            self._state.remove(index)
        for a_index, b_index, direct in batch_update.moved:
            swap = direct == MoveDirectionality.SWAP
            self._state.move(a_index, b_index, swap)
            a_entry, b_entry = self._refused.pop(a_index, None), self._refused.pop(b_index, None)
            if a_entry is not None:
                self._refused[b_index] = a_entry
            if b_entry is not None and swap:
                self._refused[a_index] = b_entry

    def _new_state(self, params: SamplingParams, prompt_ids: list[int] | None,
                   output_ids: list[int]) -> RequestSpec | _Refused | None:
        try:
            return _request_state(params, prompt_ids, output_ids)
        except ValueError as exc:
            log.error("Hallmark: refusing a request inside the engine: %s", exc)
            return _Refused()

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [num_reqs, V] (float32): watermarked rows come back one-hot (0 at the
        drawn token, -inf elsewhere); other rows are unchanged."""
        for row in self._refused:
            if row < logits.shape[0]:
                self._force_end(logits, row)
        self._state.step(logits)
        return logits

    def _force_end(self, logits: torch.Tensor, row: int) -> None:
        keep = logits[row].clone()
        logits[row] = float("-inf")
        for token in self._eos_ids:
            if token < logits.shape[1]:
                logits[row, token] = torch.nan_to_num(keep[token], neginf=0.0)


def _eos_ids(vllm_config) -> tuple[int, ...]:
    config = getattr(getattr(vllm_config, "model_config", None), "hf_text_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
