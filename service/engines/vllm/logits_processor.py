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
from dataclasses import dataclass, field

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from service.engines.vllm.watermark_args import RequestWatermark, WatermarkArgsError, resolve
from watermark import stream
from watermark.prf import philox_torch
from watermark.dedup import ContextDeduper
from watermark.processing import ProcessingParams, process_logits
from watermark.dispatch import sample
from watermark.sampler import SamplerRows

# Output-list entry vLLM uses for a token still in flight under async scheduling; it is
# replaced before the sampler runs, so seeing one here means the context is unknown.
_PLACEHOLDER = -1

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


@dataclass
class _Request:
    """One watermarked request's state, keyed by its row in vLLM's persistent batch."""

    watermark: RequestWatermark = field(repr=False)
    output_ids: list[int]
    """vLLM's live output-token list of the request (it appends as tokens are sampled)."""
    deduper: ContextDeduper
    temperature: float
    top_k: int
    top_p: float
    key_a: int
    key_b: int
    alpha: float
    stream_key: int
    stalled: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def sync(self) -> None:
        """Feed the tokens generated since the last step into the deduper."""
        output = self.output_ids
        while self.deduper.generated < len(output):
            token = output[self.deduper.generated]
            if token == _PLACEHOLDER:
                if not self.stalled:
                    log.error("Hallmark: request with key %s has an in-flight output token at "
                              "sampling time; its watermark context is incomplete",
                              self.watermark.key_id)
                    self.stalled = True
                return
            self.deduper.push(token)


def _request_state(params: SamplingParams, prompt_ids: list[int] | None,
                   output_ids: list[int]) -> _Request | None:
    watermark = resolve(params.extra_args, params.seed)
    if watermark is None:
        return None
    spec = watermark.key.spec
    deduper = ContextDeduper(spec.context_width, spec.dedup, spec.dedup_max_history, prompt=prompt_ids or ())
    if spec.algorithm == "gumbel":
        key_a, key_b, alpha = watermark.key.secret, watermark.key.secret, 0.0
    else:
        key_a, key_b, alpha = watermark.key.key_a, watermark.key.key_b, spec.alpha
    return _Request(watermark=watermark, output_ids=output_ids, deduper=deduper,
                    temperature=float(params.temperature), top_k=max(int(params.top_k), 0),
                    top_p=float(params.top_p), key_a=key_a, key_b=key_b, alpha=alpha,
                    stream_key=stream.stream_key(watermark.seed))


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
        if resolve(sampling_params.extra_args, sampling_params.seed) is not None:
            check_sampling(sampling_params)

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self._rows: dict[int, _Request | _Refused] = {}
        self._eos_ids = _eos_ids(vllm_config)

    def is_argmax_invariant(self) -> bool:
        return False  # it picks the token, so it must also run for greedy batches

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._rows, batch_update, self._new_state)

    def _new_state(self, params: SamplingParams, prompt_ids: list[int] | None,
                   output_ids: list[int]) -> _Request | _Refused | None:
        try:
            return _request_state(params, prompt_ids, output_ids)
        except ValueError as exc:
            log.error("Hallmark: refusing a request inside the engine: %s", exc)
            return _Refused()

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [num_reqs, V] (float32): watermarked rows come back one-hot (0 at the
        drawn token, -inf elsewhere); other rows are unchanged."""
        if not self._rows:
            return logits
        batch: list[tuple[int, _Request]] = []
        for row, state in self._rows.items():
            if row >= logits.shape[0]:
                continue
            if isinstance(state, _Refused):
                self._force_end(logits, row)
                continue
            state.sync()
            if not state.greedy:
                batch.append((row, state))
        if batch:
            self._draw(logits, batch)
        return logits

    def _draw(self, logits: torch.Tensor, batch: list[tuple[int, _Request]]) -> None:
        device = logits.device
        index = torch.tensor([row for row, _ in batch], dtype=torch.int64, device=device)
        requests = [state for _, state in batch]
        params = ProcessingParams(
            temperature=torch.tensor([r.temperature for r in requests], dtype=torch.float32, device=device),
            top_k=torch.tensor([r.top_k for r in requests], dtype=torch.int64, device=device),
            top_p=torch.tensor([r.top_p for r in requests], dtype=torch.float32, device=device),
        )
        rows = sampler_rows(requests, device)
        tokens = sample(process_logits(logits[index], params), rows).tokens
        one_hot = torch.full((len(batch), logits.shape[1]), float("-inf"), dtype=logits.dtype, device=device)
        one_hot.scatter_(1, tokens.view(-1, 1), 0.0)
        logits[index] = one_hot

    def _force_end(self, logits: torch.Tensor, row: int) -> None:
        keep = logits[row].clone()
        logits[row] = float("-inf")
        for token in self._eos_ids:
            if token < logits.shape[1]:
                logits[row, token] = torch.nan_to_num(keep[token], neginf=0.0)


def sampler_rows(requests: list[_Request], device: torch.device | str) -> SamplerRows:
    """The sampler's per-row inputs for these requests' next tokens."""
    return SamplerRows(
        key_a=philox_torch.keys_tensor([r.key_a for r in requests], device),
        key_b=philox_torch.keys_tensor([r.key_b for r in requests], device),
        alpha=torch.tensor([r.alpha for r in requests], dtype=torch.float32, device=device),
        contexts=[r.deduper.context for r in requests],
        watermark=torch.tensor([not r.deduper.next_repeated() for r in requests], dtype=torch.bool, device=device),
        greedy=torch.zeros(len(requests), dtype=torch.bool, device=device),
        stream_keys=philox_torch.keys_tensor([r.stream_key for r in requests], device),
        positions=torch.tensor([r.deduper.generated for r in requests], dtype=torch.int64, device=device),
    )


def _eos_ids(vllm_config) -> tuple[int, ...]:
    config = getattr(getattr(vllm_config, "model_config", None), "hf_text_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
