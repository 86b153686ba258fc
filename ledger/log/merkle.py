"""RFC 9162 Merkle tree hashing and proofs (section 2.1): pure functions, no I/O.

Leaf hash ``SHA-256(0x00 || data)``, node hash ``SHA-256(0x01 || left || right)``, the
root of an empty tree ``SHA-256("")``. A tree of size n splits at k, the largest power of
two below n. Hashes are 32-byte ``bytes``.

Written here rather than taken from a library: pymerkle's proofs are not RFC 9162 audit
paths (its own format, recomputing subtrees leaf by leaf), and sigstore-python verifies
only inclusion, in internal modules, behind a dependency tree the size of Sigstore. What a
log needs is ~150 lines: the proofs as lists of *ranges* (so that the store can read the
complete subtrees they are made of in one query, :func:`subtrees`), the RFC's two
verification algorithms, and the compact range (the roots of the complete subtrees of the
tree's right border) that lets an append touch O(log n) hashes it already holds.
``tests/ledger/log/test_merkle.py`` checks all of it against the Certificate Transparency test
vectors and against a naive tree.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

Range = tuple[int, int]
"""Leaves [start, end) of the tree."""


class ProofError(ValueError):
    """A proof does not verify; the message is the one-line reason."""


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def split(n: int) -> int:
    """The largest power of two strictly below ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


# --- proofs as ranges --------------------------------------------------------------------


def inclusion_ranges(index: int, size: int) -> list[Range]:
    """The ranges whose hashes form PATH(index, D[0:size]) (RFC 9162 2.1.3.1), bottom up."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of size {size}")
    out: list[Range] = []
    start, end = 0, size
    while end - start > 1:
        k = split(end - start)
        if index < start + k:
            out.append((start + k, end))
            end = start + k
        else:
            out.append((start, start + k))
            start += k
    return out[::-1]


def consistency_ranges(old: int, new: int) -> list[Range]:
    """The ranges whose hashes form PROOF(old, D[0:new]) (RFC 9162 2.1.4.1); empty when
    ``old`` is 0 or equals ``new``."""
    if not 0 <= old <= new:
        raise ValueError(f"no consistency proof from size {old} to size {new}")
    if old == 0 or old == new:
        return []
    out: list[Range] = []
    start, end, m, complete = 0, new, old, True
    while m != end - start:
        k = split(end - start)
        if m <= k:
            out.append((start + k, end))
            end = start + k
        else:
            out.append((start, start + k))
            start, m, complete = start + k, m - k, False
    if not complete:
        out.append((start, end))
    return out[::-1]


def subtrees(start: int, end: int) -> list[tuple[int, int]]:
    """The complete subtrees, as (level, index) with leaves [index * 2**level, (index + 1) *
    2**level), whose hashes fold right to left into MTH(D[start:end]), for a range that
    starts on a boundary of its largest power-of-two part (every range of a proof does)."""
    out = []
    while start < end:
        level = (end - start).bit_length() - 1
        while start % (1 << level):
            level -= 1
        out.append((level, start >> level))
        start += 1 << level
    return out


def fold(hashes: Sequence[bytes]) -> bytes:
    """MTH of a range from its :func:`subtrees` hashes: right to left."""
    if not hashes:
        return EMPTY_ROOT
    acc = hashes[-1]
    for value in reversed(hashes[:-1]):
        acc = node_hash(value, acc)
    return acc


def range_hashes(ranges: Sequence[Range], subtree: Callable[[int, int], bytes]) -> list[bytes]:
    """The hash of each range, from ``subtree(level, index)`` (a complete subtree's hash)."""
    return [fold([subtree(level, index) for level, index in subtrees(a, b)]) for a, b in ranges]


# --- compact range: the right border of a growing tree --------------------------------------


def append(border: list[bytes], size: int, leaf: bytes) -> tuple[list[bytes], list[tuple[int, int, bytes]]]:
    """Add ``leaf`` (a leaf hash) to a tree of ``size`` leaves whose border (the roots of its
    complete subtrees, largest first) is ``border``. Returns the new border and the complete
    subtrees of level >= 1 that the leaf completed, as (level, index, hash)."""
    border = list(border)
    completed = []
    node, level, index = leaf, 0, size
    while index & 1:
        node = node_hash(border.pop(), node)
        level, index = level + 1, index >> 1
        completed.append((level, index, node))
    border.append(node)
    return border, completed


def border_ranges(size: int) -> list[tuple[int, int]]:
    """The (level, index) of each complete subtree of a tree's border, largest first."""
    return subtrees(0, size)


def root(border: Sequence[bytes]) -> bytes:
    return fold(border)


# --- verification (RFC 9162 2.1.3.2 and 2.1.4.2) -------------------------------------------


def _check_hashes(proof: Sequence[bytes]) -> None:
    if any(not isinstance(h, bytes) or len(h) != HASH_SIZE for h in proof):
        raise ProofError("a proof hash is not 32 bytes")


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` makes of ``leaf`` (a leaf hash) at ``index`` in a tree of ``size``."""
    _check_hashes([leaf, *proof])
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is not below the tree size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise ProofError("the inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("the inclusion proof is too short for the tree size")
    return r


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root_hash: bytes) -> None:
    if root_from_inclusion(index, size, leaf, proof) != root_hash:
        raise ProofError(f"the inclusion proof of leaf {index} does not lead to the root of size {size}")


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> None:
    """:class:`ProofError` unless ``proof`` shows that the tree of size ``old`` with root
    ``old_root`` is a prefix of the tree of size ``new`` with root ``new_root``."""
    _check_hashes(proof)
    if not 0 <= old <= new:
        raise ProofError(f"size {new} is smaller than size {old}: the log went back")
    if old == new:
        if proof:
            raise ProofError("a consistency proof between equal sizes must be empty")
        if old_root != new_root:
            raise ProofError(f"two different roots for size {old}: a fork")
        return
    if old == 0:
        if proof:
            raise ProofError("a consistency proof from the empty tree must be empty")
        return
    if not proof:
        raise ProofError("the consistency proof is empty")
    path = list(proof)
    if old & (old - 1) == 0:  # old is a power of two: its root is the first node of the path
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is too long")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ProofError("the consistency proof is too short")
    if fr != old_root:
        raise ProofError(f"the consistency proof does not lead to the old root (size {old}): a fork")
    if sr != new_root:
        raise ProofError(f"the consistency proof does not lead to the new root (size {new})")
