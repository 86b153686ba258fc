"""Per-token evidence: what each token of a text contributed to one key's statistic.

For the key that decided a detection (the winning key, or the best one when none passed),
every input token gets: whether it was scored, and if not why, and its score. Scores are
the statistic's per-token terms (Exp(1) under the null for ``single``, ``max`` and
``routed``; the weighted mixture for ``weighted``), so their sum over scored tokens is
exactly the statistic of :func:`detector.detect.detect` for that key.

Skip reasons, from :mod:`detector.scoring`'s rule:

* ``repeated_context``: the token's context (its w previous tokens) occurred earlier in
  the text, so its random vector was already used (generation samples it unkeyed too);
* ``too_close_to_start``: scope ``all`` only: the context still holds padding, which
  generation under ``all`` never watermarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from detector import scoring
from detector.result import Candidate, KeyInfo
from watermark.dedup import PAD, context_matrix

REPEATED_CONTEXT = "repeated_context"
TOO_CLOSE_TO_START = "too_close_to_start"
SKIP_REASONS = (REPEATED_CONTEXT, TOO_CLOSE_TO_START, "normalised_away")


@dataclass(frozen=True)
class TokenEvidence:
    """One input token: token offset ``index``; ``score`` is None where it was skipped."""

    index: int
    token_id: int
    scored: bool
    reason: str | None
    score: float | None
    char_start: int | None = None
    char_end: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "token_id": self.token_id, "scored": self.scored,
                               "reason": self.reason,
                               "score": None if self.score is None else round(self.score, 6)}
        if self.char_start is not None:
            out["char_start"], out["char_end"] = self.char_start, self.char_end
        return out


@dataclass(frozen=True)
class Evidence:
    """Per-token evidence under one key and statistic."""

    key: KeyInfo
    statistic: str
    tokens: tuple[TokenEvidence, ...]

    def to_dict(self) -> dict[str, Any]:
        scored = [t for t in self.tokens if t.scored]
        return {"key": self.key.to_dict(), "statistic": self.statistic,
                "scored_tokens": len(scored), "total_tokens": len(self.tokens),
                "score_sum": round(float(sum(t.score for t in scored)), 6),
                "tokens": [t.to_dict() for t in self.tokens]}


def token_evidence(token_ids: Sequence[int] | np.ndarray, candidate: Candidate, statistic: str, *,
                   offsets: Sequence[tuple[int, int]] | None = None) -> Evidence:
    """Evidence [n tokens] of ``token_ids`` under ``candidate`` with ``statistic`` (as
    :func:`detector.detect.statistic_for` chose it). ``offsets`` [n] (character start, end)
    are attached as given."""
    tokens = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    spec = candidate.key.spec
    scored = scoring.scored_positions(tokens, spec.context_width, spec.dedup)
    per_token = scoring.token_scores(candidate.key, scored, statistic)
    score_at = dict(zip(scored.positions.tolist(), per_token.tolist()))
    padded = (context_matrix(tokens, spec.context_width) == PAD).any(axis=1) if len(tokens) else np.zeros(0, bool)
    out = []
    for i, token in enumerate(tokens.tolist()):
        score = score_at.get(i)
        if score is not None:
            reason = None
        elif spec.dedup == "all" and padded[i]:
            reason = TOO_CLOSE_TO_START
        else:
            reason = REPEATED_CONTEXT
        start, end = (offsets[i] if offsets is not None and i < len(offsets) else (None, None))
        out.append(TokenEvidence(index=i, token_id=int(token), scored=score is not None, reason=reason,
                                 score=score, char_start=start, char_end=end))
    return Evidence(key=candidate.info, statistic=statistic, tokens=tuple(out))
