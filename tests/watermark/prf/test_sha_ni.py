"""The SHA extensions' compression (watermark.prf.sha_ni) against hashlib: whole SHA-256
hashes of random messages, one message a column, at every interleaving width."""

import hashlib
import os

import numpy as np
import pytest

from watermark.prf import hmac_compiled, sha256, sha_ni

needs_sha = pytest.mark.skipif(not sha_ni.available(), reason="numba's target CPU lacks the SHA extensions")


def _padded_words(message: bytes, nblocks: int) -> np.ndarray:
    """uint32 [16 * nblocks]: SHA-256's padding of message, as big-endian words."""
    padded = message + b"\x80" + bytes(-(len(message) + 9) % 64) + (8 * len(message)).to_bytes(8, "big")
    assert len(padded) == 64 * nblocks
    return np.frombuffer(padded, dtype=">u4").astype(np.uint32)


def _hash_columns(group: int, messages: list[bytes], nblocks: int) -> list[bytes]:
    """SHA-256 of each message through the intrinsic, messages[c] in column c."""
    from numba import njit

    compress = sha_ni.lanes_intrinsic(group)

    @njit
    def run(st, blocks, w):  # pragma: no cover - compiled
        for blk in range(blocks.shape[0] // 16):
            for i in range(16):
                for c in range(blocks.shape[1]):
                    w[i, c] = blocks[16 * blk + i, c]
            for j in range(0, blocks.shape[1], group):
                compress(st, w, j)

    columns = len(messages)
    st = np.repeat(np.array(sha256.IV, dtype=np.uint32)[:, None], columns, axis=1)
    blocks = np.stack([_padded_words(m, nblocks) for m in messages], axis=1)
    run(st, np.ascontiguousarray(blocks), np.zeros((64, columns), np.uint32))
    return [st[:, c].astype(">u4").tobytes() for c in range(columns)]


@needs_sha
@pytest.mark.parametrize("group", [1, 2, sha_ni.GROUP, 8])
@pytest.mark.parametrize("nblocks", [1, 2, 3])
def test_compressions_give_hashlib_sha256(group, nblocks):
    # lengths of every residue mod 4 (odd ones included) across the block count's whole range
    rng = np.random.default_rng(100 * group + nblocks)
    lengths = rng.integers(max(0, 64 * nblocks - 72), 64 * nblocks - 8, 64)
    lengths[:3] = [max(0, 64 * nblocks - 72), 64 * nblocks - 9, 64 * nblocks - 71 if nblocks > 1 else 1]
    messages = [os.urandom(int(n)) for n in lengths]
    assert _hash_columns(group, messages, nblocks) == [hashlib.sha256(m).digest() for m in messages]


@pytest.mark.skipif(bool(os.environ.get("NUMBA_CPU_FEATURES") or os.environ.get("NUMBA_CPU_NAME")),
                    reason="numba told to target another CPU than this one")
def test_the_lane_passes_take_the_extensions_where_the_cpu_has_them():
    import llvmlite.binding as llvm

    has_sha = bool(llvm.get_host_cpu_features().get("sha", False))
    assert hmac_compiled.sha_extensions() is sha_ni.available() is has_sha
    assert hmac_compiled.LANES % sha_ni.GROUP == 0  # a call's columns stay inside the scratch rows
