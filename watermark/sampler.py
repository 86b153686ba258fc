"""The batched watermark sampler: one call per decode step, one row per request.

Rows may belong to different tenants (per-row keys and specs). Per row, in order:

1. greedy rows (temperature 0) take the argmax and carry no watermark;
2. rows that must not be watermarked (a repeated context, an opt-out) take an ordinary
   Gumbel-max draw from the request's seeded stream;
3. dual-key rows pick key B with probability alpha from the request's stream (vLLM's
   routing), else key A; single-key rows use their key;
4. watermarked rows take the Gumbel-max draw under that key and their context.

Steps 2-4 share one Gumbel-max pass: a stream row is a row whose "key" is its stream key
and whose context is its (position, lane) stream context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from watermark import hmac_rows, stream
from watermark.prf import philox, philox_torch
from watermark.gumbel import gumbel_argmax_cpu
from watermark.results import ROUTE_GREEDY, ROUTE_KEY_A, ROUTE_KEY_B, ROUTE_PLAIN, SampleResult

if TYPE_CHECKING:  # watermark.key imports pydantic (the spec), which the GPU image lacks
    from watermark.key import RowKeys
from watermark.transfer import host_tensor



@dataclass(frozen=True)
class SamplerRows:
    """Per-row inputs of one decode step (tensors [B] on the logits' device)."""

    key_a: torch.Tensor
    """int64 bit patterns: the key of a `gumbel` row, key A of a dual-key row."""
    key_b: torch.Tensor
    """int64 bit patterns: key B of a dual-key row (the key itself for `gumbel` rows, see
    :class:`watermark.key.RowKeys`)."""
    alpha: torch.Tensor
    """float32: probability of key B (0 for `gumbel` rows)."""
    contexts: Sequence[Sequence[int]]
    """Each row's watermark context (its last w generated tokens, -1 padded)."""
    watermark: torch.Tensor
    """bool: False draws from the ordinary stream (repeated context or opt-out)."""
    greedy: torch.Tensor
    """bool: temperature 0."""
    stream_keys: torch.Tensor
    """int64 bit patterns of each request's stream key."""
    positions: torch.Tensor
    """int64: each row's position in its request's output (stream counter)."""
    wide: hmac_rows.WideRows | None = None
    """Rows with 256-bit keys (their midstates; their key_a / key_b hold 0), or None when
    every row's key is 64-bit (:mod:`watermark.hmac_rows`)."""


def sampler_rows(keys: Sequence[RowKeys], *, contexts: Sequence[Sequence[int]], watermark: Sequence[bool],
                 greedy: Sequence[bool], stream_keys: Sequence[int], positions: Sequence[int],
                 routed: bool = True, device: torch.device | str = "cpu") -> SamplerRows:
    """The one way to build :class:`SamplerRows` from each row's :func:`watermark.key.row_keys`
    (unsigned keys; stream keys unsigned too). ``routed`` False draws dual-key rows under
    key A whatever alpha (speculative drafts)."""
    return SamplerRows(
        key_a=philox_torch.keys_tensor([hmac_rows.narrow_key(k, "key_a") for k in keys], device),
        key_b=philox_torch.keys_tensor([hmac_rows.narrow_key(k, "key_b") for k in keys], device),
        alpha=host_tensor([k.alpha if routed else 0.0 for k in keys], torch.float32, device),
        contexts=contexts,
        watermark=host_tensor(list(watermark), torch.bool, device),
        greedy=host_tensor(list(greedy), torch.bool, device),
        stream_keys=philox_torch.keys_tensor(list(stream_keys), device),
        positions=host_tensor(list(positions), torch.int64, device),
        wide=hmac_rows.wide_rows(keys, device),
    )


def route_keys(rows: SamplerRows) -> tuple[torch.Tensor, torch.Tensor]:
    """(effective key [B], uses key B [B]) after the dual-key routing coin."""
    coin = stream.stream_coin(rows.stream_keys, rows.positions, stream.LANE_ROUTE)
    use_b = coin < rows.alpha.to(coin.dtype)
    return torch.where(use_b, rows.key_b, rows.key_a), use_b


def row_states(rows: SamplerRows, keys: torch.Tensor, lane: int = stream.LANE_SAMPLE) -> torch.Tensor:
    """States [B, 4]: keyed context states for watermarked rows, stream states for the rest."""
    keyed = philox_torch.context_states_torch(keys, list(rows.contexts))
    stream_ctx = stream.stream_contexts(rows.positions, lane)
    plain = torch.stack(philox_torch.context_state_torch(rows.stream_keys, stream_ctx), dim=-1)
    return torch.where(rows.watermark.unsqueeze(-1), keyed, plain)


def padded_contexts(contexts: Sequence[Sequence[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row contexts as one [B, max width] int64 tensor plus widths [B] int32."""
    width = max((len(c) for c in contexts), default=1)
    table = [list(c) + [0] * (width - len(c)) for c in contexts]
    return (host_tensor(table, torch.int64, device), host_tensor([len(c) for c in contexts], torch.int32, device))


def sample_reference(logits: torch.Tensor, rows: SamplerRows, argmax=gumbel_argmax_cpu,
                     lane: int = stream.LANE_SAMPLE) -> SampleResult:
    """The torch reference (any device; ``argmax`` picks the race, by default the pruned
    numpy one, which moves the rows to the CPU and back)."""
    keys, use_b = route_keys(rows)
    keys = torch.where(rows.watermark, keys, rows.stream_keys)
    states = row_states(rows, keys, lane)
    keys, states = hmac_rows.override_reference(rows.wide, use_b, rows.watermark, rows.contexts, keys, states)
    tokens = argmax(logits, keys, states)
    clean = logits.to(torch.float32)
    clean = torch.where(torch.isnan(clean), torch.full_like(clean, float("-inf")), clean)
    greedy_tokens = torch.argmax(clean, dim=-1)
    tokens = torch.where(rows.greedy, greedy_tokens, tokens)
    routes = torch.where(use_b, ROUTE_KEY_B, ROUTE_KEY_A)
    routes = torch.where(rows.watermark, routes, ROUTE_PLAIN)
    routes = torch.where(rows.greedy, ROUTE_GREEDY, routes).to(torch.int8)
    return SampleResult(tokens=tokens, routes=routes)


def unsigned_keys(values: torch.Tensor) -> list[int]:
    """int64 key bit patterns [B] -> unsigned 64-bit Python ints."""
    return [v + 2**64 if v < 0 else v for v in values.tolist()]


def stream_state_py(stream_key: int, position: int, lane: int) -> tuple[int, int, int, int]:
    return philox.context_state_py(stream_key, (position & philox.MASK32, (position >> 32) & philox.MASK32, lane))


def stream_coin_py(stream_key: int, position: int, lane: int) -> float:
    return philox.uniform_py(philox.word_py(stream_key, stream_state_py(stream_key, position, lane), 0))


def sample_cpu(logits: torch.Tensor, rows: SamplerRows, lane: int = stream.LANE_SAMPLE) -> SampleResult:
    """The CPU path: the rows' keys and states (compiled, or a few plain-int Philox calls per
    row without numba), then one pruned race."""
    from watermark import cpu_race  # numba's compiled passes (same tokens; the numpy race without numba)

    if not cpu_race.available():
        return _sample_cpu_py(logits, rows, lane)
    contexts, widths = padded_contexts(rows.contexts, "cpu")
    return sample_cpu_table(logits, rows, contexts.numpy(), widths.numpy(), lane)


def sample_cpu_table(logits: torch.Tensor, rows: SamplerRows, contexts: np.ndarray, widths: np.ndarray,
                     lane: int = stream.LANE_SAMPLE) -> SampleResult:
    """:func:`sample_cpu` with the contexts as a table: row b's context is the first
    ``widths[b]`` entries of ``contexts`` [B, C] int64 (``rows.contexts`` is not read).
    Needs numba (:func:`watermark.cpu_race.available`)."""
    from watermark import cpu_race

    def unsigned(t: torch.Tensor) -> np.ndarray:
        return t.numpy().view(np.uint64)  # int64 bit patterns

    watermark, greedy = rows.watermark.numpy(), rows.greedy.numpy()
    keys, states, use_b = cpu_race.row_setup(
        unsigned(rows.key_a), unsigned(rows.key_b), rows.alpha.numpy(), unsigned(rows.stream_keys), contexts, widths,
        watermark, rows.positions.numpy(), lane)
    hmac_rows.override_cpu(rows.wide, use_b, watermark, contexts, widths, keys, states)
    routes = np.where(use_b, np.int8(ROUTE_KEY_B), np.int8(ROUTE_KEY_A))
    routes = np.where(watermark, routes, np.int8(ROUTE_PLAIN))
    routes = np.where(greedy, np.int8(ROUTE_GREEDY), routes).astype(np.int8)
    return SampleResult(tokens=torch.from_numpy(_race(logits, keys, states, greedy)), routes=torch.from_numpy(routes))


def _race(logits: torch.Tensor, keys: np.ndarray, states: np.ndarray, greedy) -> np.ndarray:
    """Tokens [B] int64: the argmax for greedy rows, the pruned race for the others."""
    from watermark import cpu_race  # numba's compiled race (same tokens; race_numpy without numba)

    values = logits.to(torch.float32).numpy()
    values = np.where(np.isnan(values), np.float32(-np.inf), values)
    greedy = np.asarray(greedy, dtype=np.bool_)
    if not greedy.any():
        return cpu_race.race(values, keys, states)
    tokens = np.argmax(values, axis=1).astype(np.int64)
    idx = np.flatnonzero(~greedy)
    if len(idx):
        tokens[idx] = cpu_race.race(values[idx], keys[idx], states[idx])
    return tokens


def _sample_cpu_py(logits: torch.Tensor, rows: SamplerRows, lane: int) -> SampleResult:
    """:func:`sample_cpu` without numba: the row setup in plain ints."""
    batch = logits.shape[0]
    key_a, key_b, skeys = unsigned_keys(rows.key_a), unsigned_keys(rows.key_b), unsigned_keys(rows.stream_keys)
    alpha = rows.alpha.tolist()
    watermark, greedy, positions = rows.watermark.tolist(), rows.greedy.tolist(), rows.positions.tolist()
    keys = np.zeros(batch, dtype=np.uint64)
    states = np.zeros((batch, 4), dtype=np.uint64)
    routes, use_bs = [], []
    for b in range(batch):
        # alpha 0 never and alpha 1 always picks key B (the coin lies in (0, 1)).
        use_b = alpha[b] >= 1.0 or (alpha[b] > 0.0 and
                                    stream_coin_py(skeys[b], positions[b], stream.LANE_ROUTE) < alpha[b])
        if greedy[b]:
            routes.append(ROUTE_GREEDY)
        elif not watermark[b]:
            routes.append(ROUTE_PLAIN)
        else:
            routes.append(ROUTE_KEY_B if use_b else ROUTE_KEY_A)
        if watermark[b]:
            key = key_b[b] if use_b else key_a[b]
            state = philox.context_state_py(key, rows.contexts[b])
        else:
            key = skeys[b]
            state = stream_state_py(key, positions[b], lane)
        keys[b] = key
        states[b] = state
        use_bs.append(use_b)
    contexts, widths = padded_contexts(rows.contexts, "cpu")
    hmac_rows.override_cpu(rows.wide, np.array(use_bs, dtype=bool), np.array(watermark, dtype=bool),
                           contexts.numpy(), widths.numpy(), keys, states)
    return SampleResult(tokens=torch.from_numpy(_race(logits, keys, states, greedy)),
                        routes=torch.tensor(routes, dtype=torch.int8))
