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

import threading
from typing import Sequence

from detector.segmentation import Recovered, SegmentationTable, recover as search
from ledger.entries import GenerationEntry
from ledger.kgram_cache import KgramCache
from ledger.kgram_digests import V1, V2, keyed_position_digests, kgram_key

_TABLES: dict[int, tuple[object, SegmentationTable | None]] = {}
_tables_lock = threading.Lock()


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


def recover(session, cache: KgramCache, entry: GenerationEntry, text: str, canonical: Sequence[int],
            table: SegmentationTable | None, secrets: dict[str, int]) -> Recovered | None:
    """``entry``'s token ids, or None where they cannot be proven: the entry records no ids
    hash, or no segmentation of ``text`` hashes to it. ``canonical``: ``text`` as the
    tokenizer encodes it (``text`` must be the entry's output: an exact copy). ``secrets``:
    key id -> watermark secret of the keys in scope (a scheme 1 generation's k-gram key)."""
    target = entry.token_ids_sha256
    if not target:
        return None
    if table is None:  # encode's ids, or nothing
        table = SegmentationTable({}, {}, 0)
    known = None
    if table.longest:
        scheme, recorded = cache.recorded(session, entry.id)
        key = (cache.store_key(session) if scheme == V2
               else kgram_key(secrets[entry.key_id]) if scheme == V1 and entry.key_id in secrets else None)
        if key is not None and recorded:
            def known(window: Sequence[int]) -> bool:
                return keyed_position_digests(window, key)[0] in recorded
    return search(text, canonical, table, target, known)
