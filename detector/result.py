"""Detection results: frozen dataclasses that serialise to DESIGN.md's result schema."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from watermark.key import WatermarkKey


def _p(log10_p: float) -> float:
    return 10.0 ** log10_p if log10_p > -400 else 0.0


@dataclass(frozen=True)
class KeyInfo:
    """What identifies a key in a result (never its secret)."""

    tenant: str | None
    key_id: str | None
    version: int | None
    state: str
    fingerprint: str
    algorithm: str
    salt: int | None = None
    """The salt tested (a `diverse` key, expanded into its salted candidates by
    :func:`salted_candidates`); None for a `deterministic` key. Only then in ``to_dict``."""
    prf: str = "philox4x32-10-v1"
    """The key's PRF; with ``key_bits``, in ``to_dict`` only for a key that is not a 64-bit
    Philox key (absent: ``philox4x32-10-v1``, 64 bits), so results about such keys read as before."""
    key_bits: int = 64
    """The secret's size: what a key search must cover (docs: concepts/threat-model.md)."""

    def to_dict(self) -> dict[str, Any]:
        out = {"tenant": self.tenant, "key_id": self.key_id, "version": self.version,
               "state": self.state, "fingerprint": self.fingerprint, "algorithm": self.algorithm}
        if self.salt is not None:
            out["salt"] = self.salt
        if self.key_bits != 64:
            out["prf"], out["key_bits"] = self.prf, self.key_bits
        return out


@dataclass(frozen=True)
class Candidate:
    """A key to test, with the metadata that names it."""

    key: WatermarkKey = field(repr=False)
    info: KeyInfo

    @classmethod
    def inline(cls, key: WatermarkKey, label: str = "inline") -> "Candidate":
        """A key given directly (CLI, tests): no tenant, no stored id."""
        return cls(key=key, info=KeyInfo(tenant=None, key_id=label, version=None, state="active",
                                         fingerprint=key.fingerprint, algorithm=key.spec.algorithm, salt=key.salt,
                                         prf=key.spec.prf, key_bits=key.spec.key_bits))


def salted_candidates(candidates: Sequence[Candidate], known_salt: dict[str, int] | None = None) -> list[Candidate]:
    """Every candidate as the detector tests it: a `diverse` key without a salt becomes
    its :data:`watermark.salt.SALTS` salted keys (one candidate per salt, ``info.salt`` set),
    so the many-key detection's Šidák correction counts each salt as a key (at most
    log2(SALTS) bits of p-value); a `deterministic`, `head`-diverse or already-salted key stays
    as it is.
    ``known_salt``: key id -> the salt the ledger recorded, which tests that salt alone."""
    out: list[Candidate] = []
    for candidate in candidates:
        key = candidate.key
        if not key.spec.salted or key.salt is not None:  # a `head` key is one key (watermark.head)
            out.append(candidate)
            continue
        known = (known_salt or {}).get(candidate.info.key_id) if candidate.info.key_id else None
        if known is not None:
            out.append(Candidate(key=key.with_salt(known), info=dataclasses.replace(candidate.info, salt=known)))
            continue
        for salted in key.salted_keys():
            out.append(Candidate(key=salted, info=_with_salt(candidate.info, salted.salt)))
    return out


def _with_salt(info: KeyInfo, salt: int) -> KeyInfo:
    """``dataclasses.replace(info, salt=salt)`` without re-running ``__init__`` (a frozen
    dataclass sets each field through ``object.__setattr__``): a store's diverse keys make
    16 of these a key, and this is a third of replace's cost."""
    out = object.__new__(KeyInfo)
    out.__dict__.update(info.__dict__)
    out.__dict__["salt"] = salt
    return out


@dataclass(frozen=True)
class KeyResult:
    key: KeyInfo
    statistic: str
    score: float
    scored_tokens: int
    log10_p_value: float
    """This key's whole-text p, not adjusted for the number of keys: the minimum over its
    tests (sum, Tr-GoF, and for ordinary-coin dual keys under auto the weighted sum) of p / weight
    (see :func:`detector.detect.weights`)."""
    log10_p_adjusted: float
    """Holm-adjusted over every key tested. In a many-key detection
    (:func:`detector.multikey.detect_many`), Holm's adjustment of the reported p-values,
    some of them bounds: the exact value for the best key, never below it for the others
    (Holm's adjusted values only grow when p-values grow)."""
    log10_p_sum: float | None = None
    """The sum test alone (Gamma null), unweighted."""
    log10_p_trgof: float | None = None
    """Tr-GoF alone, unweighted (None when the test was not run): its exact tail where that
    can change the verdict or a global p <= max(threshold, 0.01), otherwise its union
    (Chernoff) bound, also a valid p (:data:`detector.detect.TRGOF_EXACT_BELOW`)."""
    log10_p_weighted: float | None = None
    """The ``weighted`` sum alone, unweighted, where it is one of the key's tests (an
    ordinary-coin dual key under ``auto``: ``log10_p_sum`` is then the ``max`` sum)."""
    screened: bool = False
    """True where a many-key detection (:mod:`detector.multikey`) showed, from bounds, that
    this key cannot be the best and left some of its numbers uncomputed: each p-value here
    is then an upper bound on the exact one (a valid, conservative p), ``score`` a lower
    bound on the statistic, and ``log10_p_adjusted`` Holm's adjustment of these values.
    The global p, the verdict, the winning key and the spans are exactly those of testing
    every key in full. Absent (False) from results that computed every number."""

    def to_dict(self) -> dict[str, Any]:
        out = {**self.key.to_dict(), "statistic": self.statistic, "score": self.score,
               "scored_tokens": self.scored_tokens, "p_value": _p(self.log10_p_value),
               "log10_p_value": self.log10_p_value, "log10_p_adjusted": self.log10_p_adjusted,
               "log10_p_sum": self.log10_p_sum, "log10_p_trgof": self.log10_p_trgof,
               "log10_p_weighted": self.log10_p_weighted}
        if self.screened:
            out["screened"] = True
        return out


@dataclass(frozen=True)
class Span:
    """A watermarked stretch of the text: token offsets [start, end)."""

    start: int
    end: int
    scored_tokens: int
    log10_p_value: float
    """Corrected for every window and key examined (union bound)."""
    fingerprint: str
    char_start: int | None = None
    char_end: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"start": self.start, "end": self.end, "scored_tokens": self.scored_tokens,
               "p_value": _p(self.log10_p_value), "log10_p_value": self.log10_p_value,
               "fingerprint": self.fingerprint}
        if self.char_start is not None:
            out["char_start"], out["char_end"] = self.char_start, self.char_end
        return out


@dataclass(frozen=True)
class DetectionResult:
    watermarked: bool
    log10_p_value: float
    """Global: the best key's p, Šidák-corrected for the number of keys tested."""
    threshold: float
    scored_tokens: int
    total_tokens: int
    key: KeyInfo | None
    """The winning key when the text is watermarked, else None."""
    keys_tested: int
    """The tests the global p is Šidák-corrected for: one per candidate, so a `diverse` key
    tested under its 16 salts counts 16. The result's dict calls this ``tests`` and counts keys
    in its ``keys_tested`` (:meth:`keys`): salts are not keys (issue 34, item 5)."""
    per_key: tuple[KeyResult, ...]
    spans: tuple[Span, ...] = ()
    ledger_matches: tuple[dict[str, Any], ...] = ()
    basis: tuple[str, ...] = ()
    """What a positive verdict rests on: "watermark", "ledger", or both; empty if negative."""
    correction: str = ""
    """The multiple-testing correction behind the global p (components and their weights)."""

    @property
    def p_value(self) -> float:
        return _p(self.log10_p_value)

    def keys(self) -> int:
        """Distinct keys tested (a key under several salts once): counted from ``per_key``
        (one entry per candidate); without entries, :attr:`keys_tested`."""
        if not self.per_key:
            return self.keys_tested
        return len({(r.key.tenant, r.key.key_id, r.key.version, r.key.fingerprint) for r in self.per_key})

    def to_dict(self) -> dict[str, Any]:
        return {
            "watermarked": self.watermarked,
            "p_value": self.p_value,
            "log10_p_value": self.log10_p_value if math.isfinite(self.log10_p_value) else -1e308,
            "threshold": self.threshold,
            "scored_tokens": self.scored_tokens,
            "total_tokens": self.total_tokens,
            "key": self.key.to_dict() if self.key else None,
            "keys_tested": self.keys(),
            "tests": self.keys_tested,
            "per_key": [r.to_dict() for r in self.per_key],
            "spans": [s.to_dict() for s in self.spans],
            "ledger_matches": list(self.ledger_matches),
            "basis": list(self.basis),
            "correction": self.correction,
        }
