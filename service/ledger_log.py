"""The transparency log's public answers (no token): the latest published checkpoint and
proofs. Hashes only: a proof names leaf indexes and hashes, never a text, a tenant or a
generation id (a leaf's hash is that of an entry's canonical hash and k-gram commitment,
ledger.log.leaves, which only the entry's owner, holding its receipt, can name)."""

from __future__ import annotations

import base64
import binascii
import logging
import re
from typing import Any

from ledger.log import tile_reads, tiles, tlog
from keys.errors import KeyStoreError
from service.errors import NotFound, Unavailable, Unprocessable
from service.http_errors import store_error
from service.state import Services

log = logging.getLogger("hallmark.log")
_HEX32 = re.compile(r"[0-9a-f]{64}")


def _b64(values: list[bytes]) -> list[str]:
    return [base64.b64encode(v).decode("ascii") for v in values]


def _size(session, tree_size: int | None) -> int:
    if tree_size is not None:
        return tree_size
    published = tlog.published_size(session)
    if published < 0:
        raise NotFound("the log has published no checkpoint yet")
    return published


def checkpoint(services: Services) -> str:
    """The latest published checkpoint (C2SP signed note)."""
    try:
        with services.store.transaction(write=False) as session:
            found = tlog.latest_checkpoint(session)
    except KeyStoreError as exc:
        raise store_error(exc) from None
    if found is None:
        raise NotFound("the log has published no checkpoint yet")
    return found.note


def inclusion(services: Services, *, leaf_index: int | None, leaf_hash: str | None,
              tree_size: int | None) -> dict[str, Any]:
    """The inclusion proof of a leaf (by index, or by its hash: hex or base64 of 32 bytes)
    in the tree of ``tree_size`` (default: the latest published checkpoint's)."""
    if (leaf_index is None) == (leaf_hash is None):
        raise Unprocessable("give exactly one of 'leaf_index' and 'leaf_hash'")
    wanted = None
    if leaf_hash is not None:
        try:
            wanted = bytes.fromhex(leaf_hash) if _HEX32.fullmatch(leaf_hash) else base64.b64decode(leaf_hash,
                                                                                                 validate=True)
        except (binascii.Error, ValueError):
            wanted = None
        if wanted is None or len(wanted) != 32:
            raise Unprocessable("leaf_hash must be 32 bytes, as 64 lowercase hex digits or base64")
    try:
        with services.store.transaction(write=False) as session:
            size = _size(session, tree_size)
            if wanted is not None:
                leaf_index = tlog.leaf_index_of(session, wanted)
                if leaf_index is None or leaf_index >= size:
                    raise NotFound(f"no leaf with that hash in the tree of size {size}")
            proof = tlog.inclusion_proof(session, leaf_index, size)
            found_hash = tlog.inclusion_leaf(session, leaf_index)
    except tlog.ProofUnavailable as exc:
        raise NotFound(exc.user_message) from None
    except KeyStoreError as exc:
        raise store_error(exc) from None
    return {"leaf_index": leaf_index, "tree_size": size, "leaf_hash": base64.b64encode(found_hash).decode(),
            "inclusion_proof": _b64(proof)}


def consistency(services: Services, *, first: int, second: int | None) -> dict[str, Any]:
    """The consistency proof from size ``first`` to ``second`` (default: the latest published)."""
    try:
        with services.store.transaction(write=False) as session:
            size = _size(session, second)
            proof = tlog.consistency_proof(session, first, size)
    except tlog.ProofUnavailable as exc:
        raise NotFound(exc.user_message) from None
    except KeyStoreError as exc:
        raise store_error(exc) from None
    return {"from": first, "to": size, "consistency_proof": _b64(proof)}


# --- tlog-tiles (c2sp.org/tlog-tiles) under /v1/ledger/log --------------------------------------

_FULL_TILES: dict[str, bytes] = {}
"""Full tiles and bundles by path: immutable once the tree covers them, so kept (bounded)."""
_FULL_TILES_MAX = 4096


def tile(services: Services, path: str) -> tuple[bytes, bool]:
    """The tile, or entry bundle, at ``path`` (``tile/...``) and whether it is full
    (immutable). Served only once a published checkpoint's tree covers it."""
    try:
        wanted = tiles.parse(path)
    except tiles.TilePathError as exc:
        raise NotFound(str(exc)) from None
    if wanted.full and path in _FULL_TILES:
        return _FULL_TILES[path], True
    try:
        with services.store.transaction(write=False) as session:
            published = tlog.published_size(session)
            if not tiles.available(wanted, published):
                raise NotFound(f"no published checkpoint covers {path} (published size {max(published, 0)})")
            body = (tile_reads.entry_bundle(session, wanted) if wanted.entries
                    else tile_reads.tile_hashes(session, wanted))
    except tile_reads.TileMissing as exc:
        raise Unavailable(str(exc)) from None
    except KeyStoreError as exc:
        raise store_error(exc) from None
    if wanted.full:
        if len(_FULL_TILES) >= _FULL_TILES_MAX:
            _FULL_TILES.clear()
        _FULL_TILES[path] = body
    return body, wanted.full


# --- tlog-proofs of the entries a detection report cites -----------------------------------


def entry_proofs(services: Services, cited: list[tuple[str, str]], facts=None) -> list[str]:
    """``c2sp.org/tlog-proof@v1`` texts for the cited generations' ``finished`` entries
    ((generation id, entry hash) each) against the latest published checkpoint (cosigned by
    the witness quorum when the log has witnesses); an entry it does not cover yet has none.
    Each proof's ``extra`` is the leaf's data (``0x01 || entry_hash || kgrams_sha256``), from
    which a verifier recomputes the leaf and checks it names the entry the report cites."""

    wanted = {generation_id: entry_hash for generation_id, entry_hash in cited}
    out: list[str] = []
    if facts is not None and all(g in facts.checked for g in wanted):
        # ``facts`` (ledger.read.detection_facts, the detection's look-up) holds the latest
        # checkpoint and the cited entries' leaves: no query unless a proof is due.
        if facts.published is None or not wanted:
            return out
        size, note = facts.published
        rows = [(facts.leaves[row.id].idx, facts.leaves[row.id].kgrams_sha256, row.entry_hash)
                for g, row in facts.finished.items() if g in wanted and row.id in facts.leaves
                and facts.leaves[row.id].idx < size]
        if not any(entry_hash in wanted.values() and kgrams is not None for _, kgrams, entry_hash in rows):
            return out
    try:
        return _entry_proofs(services, wanted, out)
    except KeyStoreError as exc:  # the report stands without them; `ledger verify` names a damaged log
        log.warning("no tlog-proofs for a report's cited entries: %s", exc.user_message)
        return []


def _entry_proofs(services: Services, wanted: dict[str, str], out: list[str]) -> list[str]:
    from sqlalchemy import select

    from keys.models import LedgerEntry, LogLeaf
    from ledger.log.leaves import entry_leaf
    from ledger.log.proof import format_proof

    with services.store.transaction(write=False) as session:
        published = tlog.latest_checkpoint(session)
        if published is None or not wanted:
            return out
        rows = session.execute(
            select(LogLeaf.idx, LogLeaf.kgrams_sha256, LedgerEntry.entry_hash)
            .join(LedgerEntry, LedgerEntry.id == LogLeaf.entry_id)
            .where(LedgerEntry.generation_id.in_(list(wanted)), LedgerEntry.kind == "finished",
                   LogLeaf.idx < published.size)).all()
        for row in rows:
            if row.entry_hash not in wanted.values() or row.kgrams_sha256 is None:
                continue
            proof = tlog.inclusion_proof(session, row.idx, published.size)
            out.append(format_proof(row.idx, proof, published.note,
                                    extra=entry_leaf(row.entry_hash, row.kgrams_sha256)))
    return out
