"""A corpus scan's input and output files: JSONL items in, JSONL verdicts out, resumable.

Input: one JSON object a line, ``{"text": "..."}`` or ``{"token_ids": [...]}``, with an
optional ``"id"`` (string or integer) that the verdict repeats; blank lines are skipped.
Output: one verdict a line, each naming its input ``line`` (and ``id``). A sidecar
``<out>.scan.json`` records what the scan is (keys, detector config, input), so that a
resumed scan refuses to mix verdicts made under other keys or settings.

Resuming reads the output back: every complete line's ``line`` is done; a last line cut
off by a kill (no newline, or not JSON) is removed; the scan then skips the done lines.
Verdicts are written a batch at a time and flushed, so a kill loses at most the batch in
flight.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from service.detect_input import check_text, check_token_ids

MAX_TOKEN_ID = 2**32 - 1


@dataclass(frozen=True)
class Item:
    """One input line: exactly one of text and token ids, or the error that line has."""

    line: int
    id: Any = None
    text: str | None = None
    token_ids: list[int] | None = None
    error: str | None = None


def token_list(value: Any) -> list[int]:
    """A JSON list of token ids, checked (integers, not booleans, in [0, 2^32))."""
    if not isinstance(value, list):
        raise ValueError("token_ids must be a JSON list of integers")
    kinds = set(map(type, value))
    if kinds - {int}:
        raise ValueError("token_ids must be a JSON list of integers")
    if value and (min(value) < 0 or max(value) > MAX_TOKEN_ID):
        raise ValueError("token ids must be in [0, 2**32)")
    return value


def parse(line: int, raw: str) -> Item:
    try:
        item = json.loads(raw)
    except json.JSONDecodeError as exc:
        return Item(line=line, error=f"invalid JSON: {exc.msg}")
    if not isinstance(item, dict):
        return Item(line=line, error="each line must be a JSON object")
    ident = item.get("id")
    if ident is not None and (isinstance(ident, bool) or not isinstance(ident, (str, int))):
        return Item(line=line, error="id must be a string or an integer")
    has_text, has_ids = "text" in item, "token_ids" in item
    if has_text == has_ids:
        return Item(line=line, id=ident, error='give exactly one of "text" and "token_ids"')
    if has_text:
        if not isinstance(item["text"], str):
            return Item(line=line, id=ident, error="text must be a string")
        try:
            check_text(item["text"])
        except ValueError as exc:
            return Item(line=line, id=ident, error=str(exc))
        return Item(line=line, id=ident, text=item["text"])
    try:
        ids = token_list(item["token_ids"])
        check_token_ids(ids, None)
        return Item(line=line, id=ident, token_ids=ids)
    except ValueError as exc:
        return Item(line=line, id=ident, error=str(exc))


def items(path: Path, done: set[int] | frozenset[int] = frozenset()) -> Iterator[tuple[Item, int]]:
    """(item, bytes read so far) of every non-blank line not in ``done`` (1-based lines)."""
    with open(path, "rb") as handle:
        position = 0
        for number, raw in enumerate(handle, start=1):
            position += len(raw)
            if number in done or not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield Item(line=number, error="the line is not UTF-8"), position
                continue
            yield parse(number, text), position


def sidecar(out: Path) -> Path:
    return out.with_name(out.name + ".scan.json")


def completed_lines(out: Path) -> set[int]:
    """The input lines an earlier run of this scan finished (its output read back), after
    cutting off a last line that a kill left incomplete."""
    done: set[int] = set()
    if not out.exists():
        return done
    keep = 0
    with open(out, "rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            try:
                record = json.loads(raw)
            except json.JSONDecodeError:
                break
            done.add(int(record["line"]))
            keep += len(raw)
    if keep != out.stat().st_size:
        with open(out, "r+b") as handle:
            handle.truncate(keep)
    return done


def check_or_write_meta(out: Path, meta: dict[str, Any], *, resume: bool) -> None:
    """Record what this scan is beside its output; on resume, refuse one that differs."""
    path = sidecar(out)
    if resume and path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        for name in ("keys", "config", "input"):
            if previous.get(name) != meta.get(name):
                raise ValueError(f"{out} holds a scan with other {name}; resume it with the same options, or "
                                 "write to a new --out")
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
