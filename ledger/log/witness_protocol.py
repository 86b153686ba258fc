"""The tlog-witness v1.0.0 wire format (c2sp.org/tlog-witness): the ``add-checkpoint``
request body and the 409 answer's body. Pure functions, shared by the log's client
(service.witnessing) and the witness (ledger.log.cosigning_witness).

A request is ``old <size>\\n``, up to 63 base64 consistency-proof hashes one a line, an
empty line, then the checkpoint (a signed note). A 409 answers ``<size>\\n`` with
``Content-Type: text/x.tlog.size``: the size the witness last cosigned.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Sequence

SIZE_TYPE = "text/x.tlog.size"
MAX_PROOF = 63
_OLD = re.compile(r"old (0|[1-9][0-9]{0,18})")
_SIZE = re.compile(r"(0|[1-9][0-9]{0,18})\n")


class ProtocolError(ValueError):
    """A malformed request or answer (a 400); the message is the one-line reason."""


def request_body(old: int, proof: Sequence[bytes], note: str) -> bytes:
    if len(proof) > MAX_PROOF:
        raise ProtocolError("a consistency proof has at most 63 hashes")
    lines = [f"old {old}"] + [base64.b64encode(h).decode() for h in proof]
    return ("\n".join(lines) + "\n\n" + note).encode("utf-8")


def parse_request(body: bytes) -> tuple[int, list[bytes], str]:
    """(old size, proof, checkpoint note) of a request body."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("the request is not UTF-8") from None
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise ProtocolError("no empty line between the proof and the checkpoint")
    lines = head.split("\n")
    match = _OLD.fullmatch(lines[0])
    if match is None:
        raise ProtocolError("the first line is not 'old <size>'")
    if len(lines) - 1 > MAX_PROOF:
        raise ProtocolError("more than 63 consistency proof lines")
    proof = []
    for line in lines[1:]:
        try:
            value = base64.b64decode(line, validate=True)
        except binascii.Error:
            value = b""
        if len(value) != 32:
            raise ProtocolError("a consistency proof line is not a base64 SHA-256 hash")
        proof.append(value)
    return int(match.group(1)), proof, note


def parse_size(body: bytes) -> int:
    match = _SIZE.fullmatch(body.decode("ascii", "replace"))
    if match is None:
        raise ProtocolError("a 409 answer's body is not '<size>\\n'")
    return int(match.group(1))
