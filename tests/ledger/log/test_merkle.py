"""RFC 9162 hashing and proofs (ledger.log.merkle) against the Certificate Transparency test
vectors (tests/data/rfc6962-vectors.json), a naive tree, and corrupted proofs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ledger.log import merkle
from ledger.log.merkle import ProofError

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "data" / "rfc6962-vectors.json").read_text())
LEAVES = [merkle.leaf_hash(bytes.fromhex(x)) for x in VECTORS["leaves"]]
ROOTS = [bytes.fromhex(x) for x in VECTORS["roots"]]


def mth(leaves: list[bytes]) -> bytes:
    """RFC 9162's MTH, by its definition."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = merkle.split(len(leaves))
    return merkle.node_hash(mth(leaves[:k]), mth(leaves[k:]))


class Tree:
    """An in-memory log built with merkle.append, answering subtree reads from what the
    appends completed (as the store does)."""

    def __init__(self, leaves: list[bytes]) -> None:
        self.leaves = list(leaves)
        self.nodes: dict[tuple[int, int], bytes] = {}
        self.border: list[bytes] = []
        for i, leaf in enumerate(leaves):
            self.border, completed = merkle.append(self.border, i, leaf)
            self.nodes.update(((level, index), h) for level, index, h in completed)

    def subtree(self, level: int, index: int) -> bytes:
        return self.leaves[index] if level == 0 else self.nodes[level, index]

    def inclusion(self, index: int, size: int) -> list[bytes]:
        return merkle.range_hashes(merkle.inclusion_ranges(index, size), self.subtree)

    def consistency(self, old: int, new: int) -> list[bytes]:
        return merkle.range_hashes(merkle.consistency_ranges(old, new), self.subtree)


def test_roots_of_the_test_vectors():
    tree = Tree(LEAVES)
    for size in range(1, 9):
        assert mth(LEAVES[:size]) == ROOTS[size - 1]
        assert merkle.fold([tree.subtree(*s) for s in merkle.subtrees(0, size)]) == ROOTS[size - 1]
    assert merkle.root(tree.border) == ROOTS[-1]
    assert merkle.fold([]).hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@pytest.mark.parametrize("case", VECTORS["inclusion"], ids=lambda c: f"leaf{c['leaf']}-size{c['size']}")
def test_inclusion_vectors(case):
    index, size = case["leaf"] - 1, case["size"]
    proof = [bytes.fromhex(h) for h in case["proof"]]
    assert Tree(LEAVES).inclusion(index, size) == proof
    merkle.verify_inclusion(index, size, LEAVES[index], proof, ROOTS[size - 1])
    for bad_index, bad_size in ((index + 1, size), (index ^ 2, size), (index, size * 2), (index, size // 2)):
        if (bad_index, bad_size) != (index, size) and 0 <= bad_index < bad_size:
            with pytest.raises(ProofError):
                merkle.verify_inclusion(bad_index, bad_size, LEAVES[index], proof, ROOTS[size - 1])
    with pytest.raises(ProofError):
        merkle.verify_inclusion(index, size, merkle.leaf_hash(b"WrongLeaf"), proof, ROOTS[size - 1])
    with pytest.raises(ProofError):
        merkle.verify_inclusion(index, size, LEAVES[index], proof + [ROOTS[0]], ROOTS[size - 1])
    for i in range(len(proof)):
        flipped = list(proof)
        flipped[i] = bytes([flipped[i][0] ^ 8]) + flipped[i][1:]
        with pytest.raises(ProofError):
            merkle.verify_inclusion(index, size, LEAVES[index], flipped, ROOTS[size - 1])
    if proof:
        with pytest.raises(ProofError):
            merkle.verify_inclusion(index, size, LEAVES[index], proof[:-1], ROOTS[size - 1])


@pytest.mark.parametrize("case", VECTORS["consistency"], ids=lambda c: f"{c['size1']}-{c['size2']}")
def test_consistency_vectors(case):
    old, new = case["size1"], case["size2"]
    proof = [bytes.fromhex(h) for h in case["proof"]]
    assert Tree(LEAVES).consistency(old, new) == proof
    merkle.verify_consistency(old, new, ROOTS[old - 1], ROOTS[new - 1], proof)
    if not proof:
        return
    probes = [(old - 1, new, ROOTS[old - 1], ROOTS[new - 1], proof),
              (old + 1, new, ROOTS[old - 1], ROOTS[new - 1], proof),
              (old, new * 2, ROOTS[old - 1], ROOTS[new - 1], proof),
              (old, new, ROOTS[new - 1], ROOTS[old - 1], proof),
              (old, new, ROOTS[old - 1], ROOTS[new - 1], []),
              (old, new, ROOTS[old - 1], ROOTS[new - 1], proof + [ROOTS[0]]),
              (old, new, ROOTS[old - 1], ROOTS[new - 1], [ROOTS[0]] + proof),
              (old, new, ROOTS[old - 1], ROOTS[new - 1], proof[:-1])]
    for i in range(len(proof)):
        flipped = list(proof)
        flipped[i] = bytes([flipped[i][0] ^ 16]) + flipped[i][1:]
        probes.append((old, new, ROOTS[old - 1], ROOTS[new - 1], flipped))
    for probe in probes:
        if probe[0] < 1 or probe[0] > probe[1]:
            continue
        with pytest.raises(ProofError):
            merkle.verify_consistency(*probe[:4], probe[4])


def test_edge_cases_of_consistency():
    some = hashlib.sha256(b"x").digest()
    merkle.verify_consistency(0, 5, some, ROOTS[4], [])
    merkle.verify_consistency(3, 3, ROOTS[2], ROOTS[2], [])
    with pytest.raises(ProofError, match="fork"):
        merkle.verify_consistency(3, 3, ROOTS[2], ROOTS[3], [])
    with pytest.raises(ProofError, match="went back"):
        merkle.verify_consistency(4, 3, ROOTS[3], ROOTS[2], [])
    with pytest.raises(ProofError, match="empty"):
        merkle.verify_consistency(0, 3, some, ROOTS[2], [some])


def test_every_proof_of_a_70_leaf_log_matches_the_definition():
    leaves = [merkle.leaf_hash(i.to_bytes(4, "big")) for i in range(70)]
    tree = Tree(leaves)
    roots = [mth(leaves[:n]) for n in range(71)]
    for n in range(1, 71):
        assert merkle.root(Tree(leaves[:n]).border) == roots[n]
        for i in range(n):
            merkle.verify_inclusion(i, n, leaves[i], tree.inclusion(i, n), roots[n])
        for m in range(0, n + 1):
            merkle.verify_consistency(m, n, roots[m], roots[n], tree.consistency(m, n))


def test_the_newest_leafs_proof_is_the_previous_border_reversed():
    """What the sequencer hands a receipt without reading anything: PATH(n-1, D[n])."""
    leaves = [merkle.leaf_hash(bytes([i])) for i in range(40)]
    border: list[bytes] = []
    tree = Tree(leaves)
    for n in range(1, 41):
        assert list(reversed(border)) == tree.inclusion(n - 1, n)
        border, _ = merkle.append(border, n - 1, leaves[n - 1])
