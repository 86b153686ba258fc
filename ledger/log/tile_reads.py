"""Reading the log's tiles and entry bundles (ledger.log.tiles) from the store.

A tile is one range read of the stored complete subtrees (log_leaves at level 0, log_nodes
above). An entry bundle holds each leaf's data, the input to its leaf hash
(ledger.log.leaves): for a ledger entry ``0x01 || entry_hash || kgrams_sha256`` (the entry's
hash from its row, the commitment from its leaf), for a signing-key event ``0x02 || event``.
Hashes and public keys only, as the leaves themselves: no text, no tenant, no ids.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from keys.models import LedgerEntry, LogLeaf, LogNode
from ledger.log.leaves import SIGNING_KEY, entry_leaf
from ledger.log.tiles import Tile, bundle


class TileMissing(LookupError):
    """The store lacks a hash or leaf the tile needs (a tampered or truncated store)."""


def tile_hashes(session: Session, tile: Tile) -> bytes:
    """The tile's hashes, concatenated (32 bytes each)."""
    first, last = tile.first(), tile.first() + tile.width
    level = tile.subtree_level()
    if level == 0:
        rows = session.execute(select(LogLeaf.idx, LogLeaf.leaf_hash)
                               .where(LogLeaf.idx >= first, LogLeaf.idx < last).order_by(LogLeaf.idx)).all()
    else:
        rows = session.execute(select(LogNode.idx, LogNode.hash)
                               .where(LogNode.level == level, LogNode.idx >= first, LogNode.idx < last)
                               .order_by(LogNode.idx)).all()
    if [r[0] for r in rows] != list(range(first, last)):
        raise TileMissing(f"the store lacks hashes of {tile.path}")
    return b"".join(bytes(r[1]) for r in rows)


def entry_bundle(session: Session, tile: Tile) -> bytes:
    """The entry bundle of level-0 tile ``tile`` (``tile.entries``)."""
    first, last = tile.first(), tile.first() + tile.width
    rows = session.execute(
        select(LogLeaf.idx, LogLeaf.kind, LogLeaf.kgrams_sha256, LogLeaf.data, LedgerEntry.entry_hash)
        .outerjoin(LedgerEntry, LedgerEntry.id == LogLeaf.entry_id)
        .where(LogLeaf.idx >= first, LogLeaf.idx < last).order_by(LogLeaf.idx)).all()
    if [r.idx for r in rows] != list(range(first, last)):
        raise TileMissing(f"the store lacks leaves of {tile.path}")
    entries = []
    for row in rows:
        if row.kind == "entry":
            if row.entry_hash is None or row.kgrams_sha256 is None:
                raise TileMissing(f"leaf {row.idx}'s entry is missing from the store")
            entries.append(entry_leaf(row.entry_hash, row.kgrams_sha256))
        else:
            entries.append(bytes([SIGNING_KEY]) + bytes(row.data or b""))
    return bundle(entries)
