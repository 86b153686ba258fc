"""A recorded generation's own token ids, for the text the ledger cites as its exact copy.

A text is scored as the tokenizer encodes it, but the model wrote other tokens about half the
time (merged newline+indent tokens, ``Ġdisplay`` + ``s``), and each changed token takes the
watermark of the tokens whose context it is (issue 30: up to 17 orders of magnitude). The
ledger stores no token ids; it records their SHA-256 and the keyed digests of their 8-grams.
:func:`recover` finds the ids whose bytes are the text, whose 8-grams the generation recorded
and whose SHA-256 it recorded (detector.segmentation), so the exact copy is scored on what the
model wrote, and only when that is proven.
"""

from __future__ import annotations

import struct
import threading
from typing import Sequence

from detector.segmentation import Recovered, SegmentationTable, recover as search
from ledger.entries import GenerationEntry
from ledger.kgram_cache import KgramCache
from ledger.kgram_digests import DIGEST_BITS, K, V1, V2, hmac_states, kgram_key

_TABLES: dict[int, tuple[object, SegmentationTable | None]] = {}
_tables_lock = threading.Lock()
_RECOVERED: dict[tuple[str, str, str], Recovered | None] = {}
RECOVERED_MAX = 4096
"""Recoveries kept (a generation's ids, or that none were found, for its recorded hashes):
a text checked again skips the search. Proven once, they stay proven (entries are append-only
and both hashes are part of the key)."""


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte (what a ByteLevel BPE vocabulary spells
    its tokens' bytes with)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = 0
    out = {chr(b): b for b in printable}
    for b in range(256):
        if b not in printable:
            out[chr(256 + extra)] = b
            extra += 1
    return out


def _eos_ids(tokenizer, engine) -> list[int]:
    ids = set(getattr(engine, "eos_ids", None) or ())
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    return sorted(ids)


def segmentation_table(tokenizer, engine=None) -> SegmentationTable | None:
    """The :class:`~detector.segmentation.SegmentationTable` of a transformers tokenizer whose
    fast backend is a byte-level BPE (built once per tokenizer; gateway start builds it,
    service.warmup); None for other tokenizers (their ids are then only recovered when
    ``encode`` gives them)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    found = _TABLES.get(id(backend))
    if found is not None and found[0] is backend:
        return found[1]
    table = None
    if backend is not None and type(backend.decoder).__name__ == "ByteLevel":
        alphabet = _byte_alphabet()
        added = set(backend.get_added_tokens_decoder())
        pieces = {}
        for token, token_id in backend.get_vocab(with_added_tokens=False).items():
            if token_id not in added and all(c in alphabet for c in token):
                pieces[token_id] = bytes(alphabet[c] for c in token)
        table = SegmentationTable.of(pieces, _eos_ids(tokenizer, engine))
    with _tables_lock:
        _TABLES[id(backend)] = (backend, table)
    return table


def _membership(key: bytes, recorded: set[int]):
    """Whether an 8-gram's digest under ``key`` is in ``recorded``: HMAC-SHA256 from the key's
    two padded states, copied per 8-gram (ledger.kgram_digests.keyed_position_digests's
    digests, without re-deriving the states each call)."""
    inner, outer = hmac_states(key)
    shift = 64 - DIGEST_BITS

    def known(window: Sequence[int]) -> bool:
        mac = inner.copy()
        mac.update(struct.pack(f">{K}I", *window))
        final = outer.copy()
        final.update(mac.digest())
        return int.from_bytes(final.digest()[:8], "big") >> shift in recorded

    return known


def recover(session, cache: KgramCache, entry: GenerationEntry, text: str, canonical: Sequence[int],
            table: SegmentationTable | None, secrets: dict[str, int]) -> Recovered | None:
    """``entry``'s token ids, or None where they cannot be proven: the entry records no ids
    hash, or no segmentation of ``text`` hashes to it. ``canonical``: ``text`` as the
    tokenizer encodes it (``text`` must be the entry's output: an exact copy). ``secrets``:
    key id -> watermark secret of the keys in scope (a scheme 1 generation's k-gram key)."""
    target = entry.token_ids_sha256
    if not target:
        return None
    memo_key = (entry.id, target, entry.output_sha256)
    if memo_key in _RECOVERED:
        return _RECOVERED[memo_key]
    found, definitive = _search(session, cache, entry, text, canonical, table, secrets, target)
    if definitive:  # not a search cut short for want of the k-gram key in this scope
        if len(_RECOVERED) >= RECOVERED_MAX:
            _RECOVERED.clear()
        _RECOVERED[memo_key] = found
    return found


def _search(session, cache: KgramCache, entry: GenerationEntry, text: str, canonical: Sequence[int],
            table: SegmentationTable | None, secrets: dict[str, int], target: str) -> tuple[Recovered | None, bool]:
    """The ids, and whether the answer holds for any scope (the search had the k-grams)."""
    if table is None:  # encode's ids, or nothing
        table = SegmentationTable({}, {}, 0)
    known = None
    if table.longest:
        scheme, recorded = cache.recorded(session, entry.id)
        key = (cache.store_key(session) if scheme == V2
               else kgram_key(secrets[entry.key_id]) if scheme == V1 and entry.key_id in secrets else None)
        if key is not None and recorded:
            known = _membership(key, recorded)
    found = search(text, canonical, table, target, known)
    return found, found is not None or known is not None
