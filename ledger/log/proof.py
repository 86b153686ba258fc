"""Offline proofs of logging (c2sp.org/tlog-proof@v1): a leaf's index, its inclusion proof
and the checkpoint it is proved against (with the witnesses' cosignatures), as one text::

    c2sp.org/tlog-proof@v1
    [extra <base64>]
    index <n>
    <base64 hash>            (the inclusion proof, leaf's sibling first)
    ...
    <empty line>
    <checkpoint note>

Verified against a tlog-policy (ledger.log.policy) with no network: the checkpoint is signed
by a log the policy lists and cosigned by its quorum, then the proof binds the leaf hash
(computed by the caller from what it holds: a receipt's entry) to the checkpoint's root.
Pure functions.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Sequence

from ledger.log import merkle
from ledger.log.note import Checkpoint
from ledger.log.policy import Policy, PolicyError

HEADER = "c2sp.org/tlog-proof@v1"
_INDEX = re.compile(r"index (0|[1-9][0-9]{0,18})")


class TlogProofError(ValueError):
    """A proof does not parse or verify; the message is the one-line reason."""


@dataclass(frozen=True)
class TlogProof:
    index: int
    hashes: tuple[bytes, ...]
    note: str
    extra: bytes | None = None


def format_proof(index: int, hashes: Sequence[bytes], note: str, extra: bytes | None = None) -> str:
    lines = [HEADER]
    if extra is not None:
        lines.append("extra " + base64.b64encode(extra).decode())
    lines.append(f"index {index}")
    lines += [base64.b64encode(h).decode() for h in hashes]
    return "\n".join(lines) + "\n\n" + note


def parse_proof(text: str) -> TlogProof:
    if not isinstance(text, str):
        raise TlogProofError("a tlog-proof is text")
    head, sep, note = text.partition("\n\n")
    lines = head.split("\n")
    if not sep or lines[0] != HEADER:
        raise TlogProofError(f"not a {HEADER} proof")
    extra = None
    at = 1
    try:
        if len(lines) > at and lines[at].startswith("extra "):
            extra = base64.b64decode(lines[at][6:], validate=True)
            at += 1
        match = _INDEX.fullmatch(lines[at]) if len(lines) > at else None
        if match is None:
            raise TlogProofError("the proof has no 'index <n>' line")
        hashes = tuple(base64.b64decode(line, validate=True) for line in lines[at + 1:])
    except binascii.Error:
        raise TlogProofError("a proof line is not base64") from None
    if any(len(h) != merkle.HASH_SIZE for h in hashes) or len(hashes) > 63:
        raise TlogProofError("an inclusion proof is at most 63 SHA-256 hashes")
    return TlogProof(int(match.group(1)), hashes, note, extra)


def verify_proof(text: str, leaf_hash: bytes, policy: Policy) -> tuple[Checkpoint, dict[str, int], TlogProof]:
    """The checkpoint, the witnesses that cosigned it and the parsed proof, once the
    checkpoint satisfies ``policy`` (log signature, witness quorum) and the leaf with hash
    ``leaf_hash`` is included in it; :class:`TlogProofError` otherwise."""
    proof = parse_proof(text)
    try:
        checkpoint, _, cosigned = policy.verify(proof.note)
    except PolicyError as exc:
        raise TlogProofError(str(exc)) from None
    try:
        merkle.verify_inclusion(proof.index, checkpoint.size, leaf_hash, proof.hashes, checkpoint.root)
    except merkle.ProofError as exc:
        raise TlogProofError(f"the entry is not in the log: {exc}") from None
    return checkpoint, cosigned, proof
