"""The one line `hallmark detect` prints for a text: the verdict, its p, what was scored and
tested, what the ledger says, and why a short text says little.

Counts name keys as keys: a `diverse` key is tested under each of its salts (one row of
``per_key`` a salt); the result counts keys in ``keys_tested`` and (key, salt) tests in
``tests``, and the line says both (issue 34, item 5).
"""

from __future__ import annotations

from typing import Any

SHORT_TEXT_TOKENS = 50
"""Fewer scored tokens than this: a watermarked text is often missed at the default
threshold, so "not watermarked" comes with that warning (the page's Check says the same)."""


def keys_and_tests(per_key: list[dict[str, Any]], keys_tested: int, tests: int | None = None) -> tuple[int, int]:
    """(distinct keys, tests): a key is (tenant, key id, version) or, inline, its fingerprint;
    a test is one row (a key under one salt). Without rows: the result's ``keys_tested`` and
    ``tests`` (``tests`` absent: as many as keys)."""
    tests = keys_tested if tests is None else tests
    if not per_key:
        return keys_tested, tests
    keys = {(r.get("tenant"), r.get("key_id"), r.get("version"), r.get("fingerprint")) for r in per_key}
    return len(keys), max(len(per_key), tests)


def tested_words(keys: int, tests: int) -> str:
    """"1 key tested", "1 key tested under 16 salts", "3 keys tested (18 tests with their salts)"."""
    words = f"{keys} key{'' if keys == 1 else 's'} tested"
    if tests == keys:
        return words
    return f"{words} under {tests} salts" if keys == 1 else f"{words} ({tests} tests with their salts)"


def summary(payload: dict[str, Any], *, normalised: str = "") -> str:
    """The line for a result (``payload``: the API's result shape). ``normalised``: what
    normalisation changed, already in words (or empty)."""
    verdict = "watermarked" if payload["watermarked"] else "not watermarked"
    key = payload.get("key") or {}
    source = f" (key {key['key_id']} v{key['version']}, {key['state']})" if key.get("tenant") else ""
    keys, tests = keys_and_tests(payload.get("per_key") or [], int(payload.get("keys_tested") or 0),
                                 payload.get("tests"))
    ledger = ""
    passed = [m for m in payload.get("kgram_matches", []) if m["passes"]]
    if "ledger" in payload.get("basis", ()):
        ledger = (f"; in the ledger: exact copy of generation {payload['ledger_matches'][0]['generation_id']}"
                  if payload.get("ledger_matches") else
                  f"; in the ledger: shares {passed[0]['matched_kgrams']} eight-token sequences "
                  f"with generation {passed[0]['generation_id']}")
    short = ""
    if not payload["watermarked"] and payload["scored_tokens"] < SHORT_TEXT_TOKENS:
        short = (f"; too short to say: a watermarked text usually needs {SHORT_TEXT_TOKENS} or more scored tokens "
                 "to pass the threshold, so this one may be missed")
    return (f"{verdict}: log10 p = {payload['log10_p_value']:.2f} over {payload['scored_tokens']} scored of "
            f"{payload['total_tokens']} tokens, {tested_words(keys, tests)}{source}{ledger}{normalised}{short}")
