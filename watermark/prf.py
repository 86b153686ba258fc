"""The watermark PRF ``philox4x32-10-v1``: Philox-4x32-10 over (key, context, token).

Philox-4x32-10 is the counter-based generator of Salmon, Moraes, Dror and Shaw,
"Parallel random numbers: as easy as 1, 2, 3" (SC'11): multipliers 0xD2511F53 and
0xCD9E8D57, Weyl key bumps 0x9E3779B9 and 0xBB67AE85, ten rounds, no bump after the last.
The input mapping below is the one vLLM >= 0.32 uses, so keys and text move between the
two systems unchanged (golden vectors: ``shared/golden/philox4x32-10-v1.json``):

* A 64-bit key splits into k0 (low 32 bits) and k1 (high 32 bits).
* Context state: start from (0x574D4358, w, 0, 0) for context width w. For each block of
  four context entries at offset o (token ids mod 2^32, -1 before the first generated
  token; a missing entry at block position i is 0xFFFFFFFF - i), XOR the block into the
  state and run Philox with key (k0 XOR o, k1).
* Token v's word: Philox on counter (v >> 2, s0, s1, s2) with key (k0 XOR s3,
  k1 XOR 0x574D544B), output word number v & 3.
* Uniform: ((word >> 8) + 1) / (2^24 + 1), computed in float64 and rounded to float32.

Two implementations share these constants: a torch one (any device, per-row keys) that
the samplers and the Triton kernels' parity tests use, and a numpy one for the CPU, where
uint64 arithmetic holds a 32x32-bit product exactly and detection runs fastest.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

VERSION = "philox4x32-10-v1"
NAME = "philox"

MASK32 = 0xFFFFFFFF
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
CONTEXT_DOMAIN = 0x574D4358
TOKEN_DOMAIN = 0x574D544B
UNIFORM_DENOMINATOR = 2**24 + 1
MAX_KEY = 2**64 - 1


def check_key(key: int) -> int:
    """Return ``key`` if it is a valid 64-bit PRF key, else raise ValueError."""
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key <= MAX_KEY:
        raise ValueError("a watermark key must be an integer in [0, 2**64 - 1]")
    return key


def derive_key(key: int, domain: str | bytes) -> int:
    """Sub-key: the first 8 bytes (big-endian) of SHA-256(domain || key as 8 bytes big-endian)."""
    check_key(key)
    tag = domain.encode() if isinstance(domain, str) else domain
    digest = hashlib.sha256(tag + key.to_bytes(8, "big")).digest()
    return int.from_bytes(digest[:8], "big")


def key_words(key: int) -> tuple[int, int]:
    check_key(key)
    return key & MASK32, key >> 32


def to_signed64(key: int) -> int:
    """The int64 whose bit pattern is the unsigned 64-bit ``key`` (torch has no uint64 math)."""
    check_key(key)
    return key - 2**64 if key >= 2**63 else key


def from_signed64(value: int) -> int:
    return value + 2**64 if value < 0 else value


def keys_tensor(keys: list[int] | tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    """Per-row keys [B] as int64 bit patterns, the form every torch entry point takes."""
    return torch.tensor([to_signed64(k) for k in keys], dtype=torch.int64, device=device)


def block_padding(index: int) -> int:
    """The value of a missing context entry at block position ``index`` (1, 2 or 3)."""
    return MASK32 - index


# --------------------------------------------------------------------------- torch


def _mulhilo_torch(values: torch.Tensor, multiplier: int) -> tuple[torch.Tensor, torch.Tensor]:
    # values < 2^32 in int64. Split the constant so every partial product stays < 2^49.
    high_part = values * (multiplier >> 16)
    low_part = values * (multiplier & 0xFFFF)
    lower = ((high_part & 0xFFFF) << 16) + low_part
    return (high_part >> 16) + (lower >> 32), lower & MASK32


def philox_torch(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox-4x32-10 on int64 tensors holding 32-bit words (broadcastable shapes)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_index in range(PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo_torch(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo_torch(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if round_index != PHILOX_ROUNDS - 1:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def split_keys_torch(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 key bit patterns [B] -> (k0, k1) as int64 tensors of 32-bit words."""
    return keys & MASK32, (keys >> 32) & MASK32


def context_state_torch(
    keys: torch.Tensor, contexts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys [B] (int64 bit patterns) and contexts [B, w] give the four state words [B]."""
    if contexts.dim() != 2 or keys.shape != contexts.shape[:1]:
        raise ValueError("contexts must be [B, w] and keys [B]")
    width = contexts.shape[1]
    contexts = contexts.to(torch.int64) & MASK32
    k0, k1 = split_keys_torch(keys.to(contexts.device))
    zeros = torch.zeros_like(k0)
    state = (zeros + CONTEXT_DOMAIN, zeros + width, zeros, zeros)
    for offset in range(0, width, 4):
        block = [
            contexts[:, offset + i] if offset + i < width else zeros + block_padding(i)
            for i in range(4)
        ]
        counter = tuple(s ^ b for s, b in zip(state, block))
        state = philox_torch(counter, (k0 ^ offset, k1))
    return state


def context_states_torch(keys: torch.Tensor, contexts: list) -> torch.Tensor:
    """Per-row contexts of possibly different widths give states [B, 4] (int64 words).

    Rows of one width are computed together; a batch may mix tenants and specs.
    """
    batch = len(contexts)
    states = torch.zeros((batch, 4), dtype=torch.int64, device=keys.device)
    by_width: dict[int, list[int]] = {}
    for row, ctx in enumerate(contexts):
        by_width.setdefault(len(ctx), []).append(row)
    for width, rows in by_width.items():
        idx = torch.tensor(rows, dtype=torch.int64, device=keys.device)
        ctx = torch.tensor([list(contexts[r]) for r in rows], dtype=torch.int64, device=keys.device)
        states[idx] = torch.stack(context_state_torch(keys[idx], ctx.reshape(len(rows), width)), dim=-1)
    return states


def words_from_state_torch(keys: torch.Tensor, state: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Keys [B], states [B, 4] and token_ids [V] (or [B, T]) give words [B, V] (or [B, T])."""
    k0, k1 = split_keys_torch(keys.to(state.device))
    tokens = token_ids.to(device=state.device, dtype=torch.int64) & MASK32
    if tokens.dim() == 1:
        tokens = tokens.unsqueeze(0)
    col = lambda t: t.unsqueeze(-1)  # noqa: E731 - broadcast row words over tokens
    s0, s1, s2, s3 = state.unbind(-1)
    out = philox_torch(
        (tokens >> 2, col(s0), col(s1), col(s2)),
        (col(k0 ^ s3), col(k1 ^ TOKEN_DOMAIN)),
    )
    lane = tokens & 3
    word = torch.where(lane == 0, out[0], out[1])
    word = torch.where(lane == 2, out[2], word)
    word = torch.where(lane == 3, out[3], word)
    return word.expand(keys.shape[0], -1) if word.shape[0] != keys.shape[0] else word


def words_torch(keys: torch.Tensor, contexts: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Raw PRF words as int64 in [0, 2^32).

    keys [B] and contexts [B, w] with token_ids [V] give [B, V]; token_ids [B, T] give [B, T].
    """
    state = torch.stack(context_state_torch(keys, contexts), dim=-1)
    return words_from_state_torch(keys, state, token_ids)


def uniforms_from_words_torch(words: torch.Tensor) -> torch.Tensor:
    """Words -> float32 uniforms in (0, 1) on the 24-bit grid."""
    mantissa = (words & MASK32) >> 8
    return ((mantissa.to(torch.float64) + 1.0) / UNIFORM_DENOMINATOR).to(torch.float32)


def uniforms_torch(keys: torch.Tensor, contexts: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    return uniforms_from_words_torch(words_torch(keys, contexts, token_ids))


# --------------------------------------------------------------------------- numpy

_U64 = np.uint64
_NP_MASK = _U64(MASK32)
_NP_M0 = _U64(PHILOX_M0)
_NP_M1 = _U64(PHILOX_M1)
_NP_32 = _U64(32)


def _key_schedule(k0, k1):
    """Round keys for Philox; k0/k1 are uint64 arrays or numpy scalars."""
    keys = []
    for _ in range(PHILOX_ROUNDS):
        keys.append((k0, k1))
        k0 = (k0 + _U64(PHILOX_W0)) & _NP_MASK
        k1 = (k1 + _U64(PHILOX_W1)) & _NP_MASK
    return keys


def philox_numpy(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 on uint64 arrays holding 32-bit words; 32x32 products are exact in uint64."""
    for rk0, rk1 in _key_schedule(k0, k1):
        p0 = c0 * _NP_M0
        p1 = c2 * _NP_M1
        c0, c1, c2, c3 = (p1 >> _NP_32) ^ c1 ^ rk0, p1 & _NP_MASK, (p0 >> _NP_32) ^ c3 ^ rk1, p0 & _NP_MASK
    return c0, c1, c2, c3


def context_state_numpy(k0, k1, contexts: np.ndarray):
    """Context state words for contexts [N, w] (any integer dtype; -1 allowed).

    k0/k1 are uint64 scalars (one key) or arrays [N] (one key per row).
    """
    n, width = contexts.shape
    ctx = contexts.astype(np.int64, copy=False).astype(np.uint64) & _NP_MASK
    state = [np.full(n, CONTEXT_DOMAIN, _U64), np.full(n, width, _U64), np.zeros(n, _U64), np.zeros(n, _U64)]
    for offset in range(0, width, 4):
        counter = [
            state[i] ^ (ctx[:, offset + i] if offset + i < width else _U64(block_padding(i)))
            for i in range(4)
        ]
        state = list(philox_numpy(*counter, k0 ^ _U64(offset), k1))
    return state


def words_numpy(key: int, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """One key; contexts [N, w] and tokens [N] give the N words (uint64 in [0, 2^32))."""
    k0, k1 = (_U64(w) for w in key_words(key))
    return words_for_rows_numpy(k0, k1, contexts, tokens)


def words_for_rows_numpy(k0, k1, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Like :func:`words_numpy` with k0/k1 uint64 scalars or per-row arrays [N]."""
    s0, s1, s2, s3 = context_state_numpy(k0, k1, contexts)
    tok = tokens.astype(np.int64, copy=False).astype(np.uint64) & _NP_MASK
    out = philox_numpy(tok >> _U64(2), s0, s1, s2, k0 ^ s3, k1 ^ _U64(TOKEN_DOMAIN))
    lane = (tok & _U64(3)).astype(np.intp)
    return np.choose(lane, out)


def uniforms_from_words_numpy(words: np.ndarray) -> np.ndarray:
    return (((words >> _U64(8)).astype(np.float64) + 1.0) / UNIFORM_DENOMINATOR).astype(np.float32)


class PhiloxPRF:
    """``philox4x32-10-v1`` bound to one key, for callers that score token ids on the CPU."""

    version = VERSION

    def __init__(self, key: int) -> None:
        self._k0, self._k1 = (_U64(w) for w in key_words(key))

    def __repr__(self) -> str:  # never show the key
        return f"PhiloxPRF(version={VERSION!r})"

    def words(self, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Contexts [N, w] and tokens [N] give words [N] (uint64 holding 32-bit values)."""
        return words_for_rows_numpy(self._k0, self._k1, np.asarray(contexts), np.asarray(tokens))

    def uniforms(self, contexts: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return uniforms_from_words_numpy(self.words(contexts, tokens))


# --------------------------------------------------------------------------- python ints
# Per-row scalars (a row's context state, a routing coin) on the CPU: a handful of values per
# decode step, where a plain-int Philox beats dozens of tiny tensor operations.


def philox_py(c0: int, c1: int, c2: int, c3: int, k0: int, k1: int) -> tuple[int, int, int, int]:
    for _ in range(PHILOX_ROUNDS):
        p0 = c0 * PHILOX_M0
        p1 = c2 * PHILOX_M1
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def context_state_py(key: int, context) -> tuple[int, int, int, int]:
    """The context state of one row (key an unsigned 64-bit int, context a sequence of ints)."""
    k0, k1 = key & MASK32, key >> 32
    width = len(context)
    state = (CONTEXT_DOMAIN, width, 0, 0)
    for offset in range(0, width, 4):
        block = [(int(context[offset + i]) & MASK32) if offset + i < width else block_padding(i) for i in range(4)]
        state = philox_py(state[0] ^ block[0], state[1] ^ block[1], state[2] ^ block[2], state[3] ^ block[3],
                          k0 ^ offset, k1)
    return state


def word_py(key: int, state: tuple[int, int, int, int], token: int) -> int:
    k0, k1 = key & MASK32, key >> 32
    token &= MASK32
    out = philox_py(token >> 2, state[0], state[1], state[2], k0 ^ state[3], k1 ^ TOKEN_DOMAIN)
    return out[token & 3]


def uniform_py(word: int) -> float:
    """The float32 uniform of a word, as a Python float (exactly the float32 value)."""
    return float(np.float32(((word >> 8) + 1) / UNIFORM_DENOMINATOR))
