"""``"evidence": true`` on /v1/detect: per-token evidence for the key that decided the result.

The key is the winning key when the text is watermarked, else the key with the smallest
p-value (what the verdict was closest to). Bounded by ``max_evidence_tokens`` (413 beyond),
since the answer grows with the text: about 100 bytes per token.
"""

from __future__ import annotations

from typing import Any, Sequence

from detector.detect import DetectorConfig, statistic_for
from detector.evidence import token_evidence
from detector.result import Candidate, DetectionResult
from service.errors import TooLarge


def check_size(n_tokens: int, limit: int) -> None:
    if n_tokens > limit:
        raise TooLarge(f"evidence was asked for {n_tokens} tokens; the limit is {limit} "
                       "(HALLMARK_MAX_EVIDENCE_TOKENS): send a shorter text or leave 'evidence' out")


def evidence_for(result: DetectionResult, token_ids: Sequence[int], candidates: Sequence[Candidate],
                 config: DetectorConfig, offsets: Sequence[tuple[int, int]] | None) -> dict[str, Any] | None:
    if not result.per_key:
        return None
    best = result.key if result.key is not None else min(result.per_key, key=lambda r: r.log10_p_value).key
    candidate = next((c for c in candidates if c.info == best), None)
    if candidate is None:
        return None
    statistic = statistic_for(candidate, config)
    return token_evidence(token_ids, candidate, statistic, offsets=offsets).to_dict()
