"""One corpus item's verdict: its text forms, the batched detection, the record written.

The verdict of an item is what ``hallmark detect --tenant T`` (or ``--all-tenants``) gives
for the same text and keys, watermark evidence only: the same text forms (as sent and
normalised, :mod:`detector.forms`), the same many-key detection
(:func:`detector.multikey.detect_many`, whose global p, verdict, winning key and spans are
those of testing every key in full). The ledger's evidence (exact copies, shared k-grams)
is not part of a scan. Per-key entries are left out unless asked for (a store's thousands
of keys would dwarf the verdict).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from detector.detect import DetectorConfig
from detector.forms import TextForm, detect_forms, original_offsets, text_forms, with_span_chars
from detector.multikey import KeySet, detect_many
from service.scan.corpus import Item


@dataclass(frozen=True)
class ScanSettings:
    """How each item is detected and reported."""

    config: DetectorConfig = field(default_factory=DetectorConfig)
    normalize: bool = True
    """Also score a text's normalised forms (as ``hallmark detect`` and the API do)."""
    per_key: bool = False
    """Report every key's entry (``per_key``), not only the verdict."""
    tokenizer: str | None = None
    """Tokenizer directory or bundled model name, for text items."""


@dataclass(frozen=True)
class Prepared:
    """An item turned into the token-id forms its detection scores."""

    item: Item
    forms: list[list[int]]
    names: list[str]
    offsets: list | None
    normalization: Any = None


def prepare(item: Item, settings: ScanSettings, encode: Callable[[str], tuple[list[int], Any]] | None) -> Prepared:
    """The item's forms: its token ids, or its text's forms tokenised."""
    if item.token_ids is not None:
        return Prepared(item=item, forms=[item.token_ids], names=["as_sent"], offsets=None)
    if encode is None:
        raise ValueError("text items need --tokenizer (the model's tokenizer, e.g. bundled)")
    forms, normalized = text_forms(item.text) if settings.normalize else ([TextForm("as_sent", item.text, None)], None)
    encoded = [encode(form.text) for form in forms]
    owner = getattr(encode, "__self__", None)  # service.tokenization.TextEncoder.encode: the API's forms
    if hasattr(owner, "with_runs_merged"):
        forms, encoded = owner.with_runs_merged(forms, encoded)
    offsets = [None if chars is None else original_offsets(form, chars) for form, (_, chars) in zip(forms, encoded)]
    return Prepared(item=item, forms=[list(ids) for ids, _ in encoded], names=[form.name for form in forms],
                    offsets=offsets, normalization=normalized)


def verdict(prepared: Prepared, keyset: KeySet, settings: ScanSettings,
            scans: dict[tuple[int, ...], np.ndarray] | None = None) -> dict[str, Any]:
    """The item's verdict record. ``scans``: each form's scan statistics (by its token ids),
    computed elsewhere (the GPU); otherwise the compiled CPU pass computes them."""

    def run(tokens, keys, config, **options):
        scan = scans.get(tuple(tokens)) if scans is not None else None
        return detect_many(tokens, keys, config, scan=scan, per_key=settings.per_key, **options)

    result, best = detect_forms(prepared.forms, keyset, settings.config, run=run)
    if prepared.offsets is not None and prepared.offsets[best] is not None:
        result = with_span_chars(result, prepared.offsets[best])
    out = result.to_dict()
    if not settings.per_key:
        out.pop("per_key", None)
    out.pop("ledger_matches", None)
    if not math.isfinite(result.log10_p_value):
        out["log10_p_value"] = -1e308
    record = {"line": prepared.item.line, "id": prepared.item.id, **out}
    if prepared.normalization is not None:
        record["normalization"] = {**prepared.normalization.to_dict(), "scored": prepared.names[best]}
    return record


def error_record(item: Item, message: str) -> dict[str, Any]:
    return {"line": item.line, "id": item.id, "error": message}
