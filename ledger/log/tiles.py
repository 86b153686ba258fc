"""C2SP tlog-tiles (c2sp.org/tlog-tiles): tile paths, which tiles a tree size makes
available, entry bundles. Pure functions, no I/O; the store reads them in
ledger.log.tile_reads.

A tile at level ``L``, index ``N`` holds up to 256 hashes: the i-th is the hash of the
complete subtree of height ``8 * L`` at index ``N * 256 + i`` (leaf hashes at level 0). Those
are exactly the subtrees the log stores (ledger.log.merkle.append keeps every completed
subtree), so a tile is a range read, never a recomputation. ``<N>`` is written in 3-digit
path elements, all but the last prefixed ``x`` (1234067 -> ``x001/x234/067``); a partial tile
(width 1..255) carries ``.p/<W>``. An entry bundle (``tile/entries/<N>``) holds the level-0
tile's leaves' data, each prefixed by its length as a big-endian uint16.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

TILE_HEIGHT = 8
TILE_WIDTH = 1 << TILE_HEIGHT
MAX_LEVEL = 63
_ELEMENT = re.compile(r"x\d{3}")
_LAST = re.compile(r"\d{3}")
_WIDTH = re.compile(r"[1-9]\d{0,2}")
_LEVEL = re.compile(r"0|[1-9]\d?")


class TilePathError(ValueError):
    """Not a tlog-tiles path; the message is the one-line reason."""


@dataclass(frozen=True)
class Tile:
    level: int
    """The tile level, or -1 for an entry bundle."""
    index: int
    width: int
    """256 for a full tile, 1..255 for a partial one."""

    @property
    def entries(self) -> bool:
        return self.level < 0

    @property
    def full(self) -> bool:
        return self.width == TILE_WIDTH

    @property
    def path(self) -> str:
        level = "entries" if self.entries else str(self.level)
        suffix = "" if self.full else f".p/{self.width}"
        return f"tile/{level}/{encode_index(self.index)}{suffix}"

    def subtree_level(self) -> int:
        """The Merkle level of the hashes this tile holds (an entry bundle's are leaves)."""
        return 0 if self.entries else TILE_HEIGHT * self.level

    def first(self) -> int:
        """The subtree index (at :meth:`subtree_level`) of the tile's first hash."""
        return self.index * TILE_WIDTH

    def needs_size(self) -> int:
        """The smallest tree size whose tiles include this one (full or of this width)."""
        return (self.first() + self.width) << self.subtree_level()


def encode_index(index: int) -> str:
    if index < 0:
        raise ValueError("a tile index is not negative")
    digits = f"{index:d}"
    digits = digits.zfill(-(-len(digits) // 3) * 3)
    parts = [digits[i:i + 3] for i in range(0, len(digits), 3)]
    return "/".join([f"x{p}" for p in parts[:-1]] + [parts[-1]])


def parse(path: str) -> Tile:
    """The tile a path (relative to the log's prefix, starting ``tile/``) names."""
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "tile":
        raise TilePathError("a tile path is tile/<L>/<N>[.p/<W>] or tile/entries/<N>[.p/<W>]")
    level_text, rest = parts[1], parts[2:]
    if level_text == "entries":
        level = -1
    elif _LEVEL.fullmatch(level_text) and int(level_text) <= MAX_LEVEL:
        level = int(level_text)
    else:
        raise TilePathError("a tile level is 0 to 63, without leading zeroes")
    width = TILE_WIDTH
    if len(rest) >= 2 and rest[-2].endswith(".p"):
        if not _WIDTH.fullmatch(rest[-1]) or not 1 <= int(rest[-1]) < TILE_WIDTH:
            raise TilePathError("a partial tile's width is 1 to 255, without leading zeroes")
        width = int(rest[-1])
        rest = rest[:-2] + [rest[-2][:-2]]
    if not rest or not _LAST.fullmatch(rest[-1]) or not all(_ELEMENT.fullmatch(p) for p in rest[:-1]):
        raise TilePathError("a tile index is 3-digit path elements, all but the last starting with x")
    if len(rest) > 1 and rest[0] == "x000":
        raise TilePathError("a tile index has no leading zero elements")
    index = int("".join(p.lstrip("x") for p in rest))
    return Tile(level, index, width)


def available(tile: Tile, size: int) -> bool:
    """Whether a tree of ``size`` leaves covers this tile. A partial tile's hashes never
    change once the tree covers them, so it is served for every size that covers it (the
    sizes checkpoints were published at among them, which tlog-tiles requires)."""
    return tile.needs_size() <= size


def tiles_for(size: int) -> list[Tile]:
    """Every partial tile (and partial entry bundle) a tree of ``size`` leaves serves."""
    out = []
    level = 0
    while size >> (TILE_HEIGHT * level):
        hashes = size >> (TILE_HEIGHT * level)
        if hashes % TILE_WIDTH:
            out.append(Tile(level, hashes // TILE_WIDTH, hashes % TILE_WIDTH))
            if level == 0:
                out.append(Tile(-1, hashes // TILE_WIDTH, hashes % TILE_WIDTH))
        level += 1
    return out


def bundle(entries: list[bytes]) -> bytes:
    """An entry bundle: each entry prefixed by its length (big-endian uint16)."""
    out = bytearray()
    for entry in entries:
        if len(entry) > 0xFFFF:
            raise ValueError("a bundled entry is at most 65535 bytes")
        out += struct.pack(">H", len(entry)) + entry
    return bytes(out)


def unbundle(data: bytes) -> list[bytes]:
    """The entries of a bundle; ValueError if it is truncated."""
    out, at = [], 0
    while at < len(data):
        if at + 2 > len(data):
            raise ValueError("an entry bundle ends inside a length prefix")
        (length,) = struct.unpack_from(">H", data, at)
        if at + 2 + length > len(data):
            raise ValueError("an entry bundle ends inside an entry")
        out.append(data[at + 2:at + 2 + length])
        at += 2 + length
    return out
