"""tlog-tiles (ledger.log.tiles, ledger.log.tile_reads): the spec's path encoding, which tiles
a size covers, and tiles read from the store that rebuild the tree's root by the spec's
definition alone (each hash of a level-l tile is the root of a full tile below). Both databases."""

from __future__ import annotations

import hashlib
import json

import pytest

from ledger.log import merkle, tile_reads, tiles, tlog
from ledger.log.leaves import SIGNING_KEY


def test_paths_round_trip_as_the_spec_writes_them():
    assert tiles.encode_index(1234067) == "x001/x234/067"
    assert tiles.encode_index(0) == "000" and tiles.encode_index(1000) == "x001/000"
    assert tiles.parse("tile/0/x001/x234/067") == tiles.Tile(0, 1234067, 256)
    assert tiles.parse("tile/entries/005.p/17") == tiles.Tile(-1, 5, 17)
    assert tiles.parse("tile/2/000.p/1").path == "tile/2/000.p/1"
    for bad in ("tile/0/1", "tile/00/000", "tile/64/000", "tile/0/000.p/0", "tile/0/000.p/256", "tile/0/000.p/07",
                "tile/0/x000/001", "tile/0/001/002", "tile/x/000", "tiles/0/000", "tile/0/000.p"):
        with pytest.raises(tiles.TilePathError):
            tiles.parse(bad)


def test_which_tiles_a_size_covers():
    # The spec's example: 70,000 leaves are 273 full level-0 tiles, a partial one of 112,
    # one full level-1 tile, a partial one of 17 and a partial level-2 tile of 1.
    assert {(t.level, t.index, t.width) for t in tiles.tiles_for(70_000)} == {
        (0, 273, 112), (-1, 273, 112), (1, 1, 17), (2, 0, 1)}
    assert tiles.available(tiles.Tile(0, 272, 256), 70_000) and not tiles.available(tiles.Tile(0, 273, 256), 70_000)
    assert tiles.available(tiles.Tile(1, 0, 256), 70_000) and not tiles.available(tiles.Tile(2, 0, 2), 70_000)
    assert {(t.level, t.width) for t in tiles.tiles_for(256)} == {(1, 1)}
    assert tiles.unbundle(tiles.bundle([b"a", b"", b"xyz"])) == [b"a", b"", b"xyz"]
    with pytest.raises(ValueError):
        tiles.unbundle(b"\x00\x05ab")


def _root_from_tiles(read, size: int) -> bytes:
    """MTH(D[0:size]) from tiles only, as a tile reader does: the complete subtrees of the
    tree's border, each found in the tile that holds it (ledger.log.merkle is only used
    for the node hash)."""
    border = []
    for level, index in merkle.border_ranges(size):
        tile_level, rest = divmod(level, tiles.TILE_HEIGHT)
        # A subtree of height 8k + r is the fold of 2**r consecutive hashes of level k's tiles.
        first = index << rest
        hashes = []
        for at in range(first, first + (1 << rest)):
            width = min(tiles.TILE_WIDTH, (size >> (tiles.TILE_HEIGHT * tile_level)) - (at // 256) * 256)
            data = read(tiles.Tile(tile_level, at // 256, width))
            hashes.append(data[(at % 256) * 32:(at % 256 + 1) * 32])
        while len(hashes) > 1:
            hashes = [merkle.node_hash(hashes[i], hashes[i + 1]) for i in range(0, len(hashes), 2)]
        border.append(hashes[0])
    return merkle.fold(border)


def test_tiles_from_the_store_rebuild_the_tree(store, two_tenants):
    two_tenants()
    with store.transaction() as session:
        auth = tlog.writer_authority(session)
        start, _ = tlog.read_head(session, auth)
        for i in range(600 - start):
            event = json.dumps({"test": i}).encode()
            tlog.append(session, auth, leaf_data=bytes([SIGNING_KEY]) + event, kind="signing_key", kid=f"k{i}",
                        data=event)
    with store.transaction(write=False) as session:
        size, border = tlog.read_head(session, auth)
        assert size == 600
        root = merkle.root(border)
        read = lambda tile: tile_reads.tile_hashes(session, tile)  # noqa: E731
        for cut in (1, 255, 256, 257, 511, 512, 600):
            assert _root_from_tiles(read, cut) == tlog.root_at(session, cut)
        assert _root_from_tiles(read, size) == root
        # Level 1 holds the roots of the full level-0 tiles.
        level1 = read(tiles.Tile(1, 0, 2))
        assert level1[:32] == tlog.root_at(session, 256)
        assert level1[32:] == merkle.range_hashes([(256, 512)], lambda lv, ix: tlog._subtrees(session, [(lv, ix)])[
            lv, ix])[0]
        # Each bundled entry hashes to its level-0 tile's hash.
        partial = tiles.Tile(-1, 2, 600 - 512)
        entries = tiles.unbundle(tile_reads.entry_bundle(session, partial))
        hashes = read(tiles.Tile(0, 2, 600 - 512))
        assert [hashlib.sha256(b"\x00" + e).digest() for e in entries] == [
            hashes[i:i + 32] for i in range(0, len(hashes), 32)]
        with pytest.raises(tile_reads.TileMissing):
            tile_reads.tile_hashes(session, tiles.Tile(0, 3, 1))
