"""Sampler rows under 256-bit keys (``hmac-sha256-philox-v1``): what they carry and how their
keys and states are made.

A row's 256-bit key travels as its HMAC midstates (16 words, :mod:`watermark.prf.sha256`),
computed once per key on the host. Each step, a watermarked row's HMAC over its context
gives a per-context 64-bit Philox key and state (:mod:`watermark.prf.hmac_philox`); from
there the race is the Philox race every sampler already runs (its token stage takes a key
and a state). So the samplers change in one place: where a row's (key, state) is set up.
The row's ``key_a`` / ``key_b`` tensors hold 0 for such rows (never used as keys).

``hmac-sha256-v1`` (vLLM's per-token HMAC) is not sampled here: one HMAC per vocabulary entry
per step. Its keys detect (:mod:`watermark.prf.hmac_sha256`); generating with them is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from watermark.prf import HMAC_PHILOX_V1, KEY_BITS, hmac_philox
from watermark.transfer import host_tensor

if TYPE_CHECKING:
    from watermark.key import RowKeys

MID_WORDS = 16


@dataclass(frozen=True)
class WideRows:
    """Per-row HMAC midstates of key A and key B (int64 tensors [B, 16] holding uint32 words;
    zeros for 64-bit rows) and which rows have 256-bit keys ([B] bool)."""

    mids_a: torch.Tensor
    mids_b: torch.Tensor
    wide: torch.Tensor
    mids_coin: torch.Tensor | None = None
    """[B, 16] midstates of the keyed acceptance coin's key (speculative verification with
    ``keyed_coin``); None where no row verifies with a keyed coin (the plain samplers)."""


def is_wide(keys: "RowKeys") -> bool:
    """Whether a row's keys are 256-bit (refusing PRFs the samplers cannot run)."""
    if KEY_BITS[keys.prf] == 64:
        return False
    if keys.prf != HMAC_PHILOX_V1:
        raise ValueError(f"generation with prf {keys.prf} is not supported (one HMAC per vocabulary entry per "
                         f"token); use {HMAC_PHILOX_V1} for 256-bit keys that generate")
    return True


def narrow_key(keys: "RowKeys", which: str) -> int:
    """The 64-bit value a row's key tensor holds: the key, or 0 for a 256-bit row."""
    return 0 if is_wide(keys) else getattr(keys, which)


def wide_rows(keys: Sequence["RowKeys"], device: torch.device | str = "cpu") -> WideRows | None:
    """The rows' midstates, or None when every row has a 64-bit key (nothing changes then)."""
    flags = [is_wide(k) for k in keys]
    if not any(flags):
        return None
    zero = (0,) * MID_WORDS
    mids_a = [hmac_philox.midstates(k.key_a) if f else zero for k, f in zip(keys, flags)]
    mids_b = [hmac_philox.midstates(k.key_b) if f else zero for k, f in zip(keys, flags)]
    mids_coin = [hmac_philox.midstates(k.key_coin) if f else zero for k, f in zip(keys, flags)]
    return WideRows(mids_a=host_tensor(mids_a, torch.int64, device), mids_b=host_tensor(mids_b, torch.int64, device),
                    wide=host_tensor(flags, torch.bool, device), mids_coin=host_tensor(mids_coin, torch.int64, device))


def context_key_states(mids: torch.Tensor, rows: Sequence[int],
                       contexts: Sequence[Sequence[int]]) -> list[tuple[int, tuple[int, ...]]]:
    """(Philox key as an unsigned int, state) of each ``contexts[i]`` under row ``rows[i]``'s
    midstates in ``mids`` [B, 16]: the compiled HMAC pass in one call where numba is present
    (speculative verification asks for up to k + 1 per row and step), else the pure-Python HMAC
    from the midstates."""
    if not len(rows):
        return []
    table = mids.cpu().numpy()[list(rows)].astype(np.uint32)
    from watermark.prf import hmac_compiled

    if hmac_compiled.compiled() is None:  # pragma: no cover - exercised where numba is missing
        return [hmac_philox.context_key_state_from_midstates(tuple(int(v) for v in table[i]), list(c))
                for i, c in enumerate(contexts)]
    widths = np.array([len(c) for c in contexts], dtype=np.int64)
    padded = np.zeros((len(contexts), max(1, int(widths.max()))), dtype=np.int64)
    for i, c in enumerate(contexts):
        padded[i, :len(c)] = c
    keys, states = hmac_compiled.philox_key_states(table, padded, widths)
    return [(int(k), tuple(int(v) for v in st)) for k, st in zip(keys, states)]


def coin_mids(wide: WideRows) -> torch.Tensor:
    """The keyed coin's midstates, refusing rows made without them."""
    if wide.mids_coin is None:
        raise ValueError("256-bit rows verified with a keyed coin need mids_coin (hmac_rows.wide_rows makes it)")
    return wide.mids_coin


def override_cpu(wide: WideRows | None, use_b: np.ndarray, watermark: np.ndarray, contexts: np.ndarray,
                 widths: np.ndarray, keys: np.ndarray, states: np.ndarray) -> None:
    """Replace, in place, the (key, state) of watermarked 256-bit rows by their HMAC-derived
    ones: keys [B] uint64, states [B, 4] uint64; contexts [B, C] with widths [B]."""
    if wide is None:
        return
    rows = np.flatnonzero(wide.wide.cpu().numpy() & np.asarray(watermark, dtype=bool))
    if not len(rows):
        return
    mids = np.where(np.asarray(use_b, dtype=bool)[rows, None], wide.mids_b.cpu().numpy()[rows],
                    wide.mids_a.cpu().numpy()[rows]).astype(np.uint32)
    from watermark.prf import hmac_compiled

    if hmac_compiled.compiled() is None:  # pragma: no cover - exercised where numba is missing
        for i, row in enumerate(rows):
            k, s = hmac_philox.context_key_state_from_midstates(tuple(int(v) for v in mids[i]),
                                                                 contexts[row, :widths[row]].tolist())
            keys[row], states[row] = k, s
        return
    k, s = hmac_compiled.philox_key_states(mids, np.asarray(contexts)[rows], np.asarray(widths)[rows])
    keys[rows], states[rows] = k, s


def override_reference(wide: WideRows | None, use_b: torch.Tensor, watermark: torch.Tensor,
                       contexts: Sequence[Sequence[int]], keys: torch.Tensor, states: torch.Tensor):
    """The torch reference's (keys [B] int64, states [B, 4]) with watermarked 256-bit rows'
    replaced (hashlib-free pure-Python HMAC from the midstates: the independent reference)."""
    if wide is None:
        return keys, states
    keys, states = keys.clone(), states.clone()
    flags = (wide.wide & watermark).tolist()
    ub = use_b.tolist()
    for row, flag in enumerate(flags):
        if flag:
            mids = (wide.mids_b if ub[row] else wide.mids_a)[row].tolist()
            k, s = hmac_philox.context_key_state_from_midstates(tuple(mids), list(contexts[row]))
            keys[row] = k - 2**64 if k >= 2**63 else k
            states[row] = torch.tensor(s, dtype=states.dtype)
    return keys, states
