"""Distinct texts for detection benchmarks: generated texts with a few words changed, so that
every request is a text no cache has seen (no exact copy; the ledger's k-grams still find the
generation, as they would an edited copy)."""

from __future__ import annotations

import random

WORDS = ("value", "object", "returns", "module", "string", "method", "default", "number", "list", "class",
         "instance", "argument", "result", "function", "attribute", "error", "name", "type", "file", "data")


def variants(texts: list[str], n: int, *, words: int = 3, seed: int = 0) -> list[str]:
    """``n`` distinct texts, in turn from each of ``texts``, each with ``words`` of its words
    (separated by single spaces) replaced by another word."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set(texts)
    while len(out) < n:
        base = texts[len(out) % len(texts)].split(" ")
        for i in rng.sample(range(len(base)), min(words, len(base))):
            base[i] = rng.choice(WORDS)
        text = " ".join(base)
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out
