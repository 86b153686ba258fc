"""The ledger as a second basis of a detection: exact copies and shared k-grams.

A recorded generation whose output is exactly the text is an exact copy. Shared k-grams
(:mod:`ledger.kgrams`) show an edited copy only when the shared phrases could not have been
written independently: their chance-collision bound says the digests really match, not that
the text was copied. The bundled model reproduces pydoc boilerplate ("Methods defined
here:", "Data descriptors defined here: ... dictionary for instance variables") with no
choice to make, and the standard library's own documentation, written by people, shares
those phrases: 40 of 102 2,000-character chunks of it shared 2-17 k-grams with one of 20
generations, each with a collision bound below 1e-26, and were reported as edited copies.

So a k-gram match counts (``passes``) only when, besides its collision bound passing the
threshold, the watermark test over the shared tokens alone, under the match's key, passes
:data:`SHARED_LEVEL` (Bonferroni over the matches tested). A shared token whose whole
context lies inside the shared k-gram has the same context in the text as in the generation,
so its score is the generation's: high where the model sampled among real alternatives under
the watermark, Exp(1) where it had no choice.
This is a gate, not an exact test of "written independently": a writer who happens to agree
with the generation on 8+ tokens it sampled with real choice shares those tokens' high scores,
but that agreement is itself rare; what the gate removes is agreement on phrases with no choice
in them, the common case (boilerplate, stock phrases).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, Sequence

import numpy as np

from detector import scoring
from detector.detect import DetectorConfig, statistic_for
from detector.result import Candidate
from detector.stats import gamma_log10_sf, weighted_gamma_log10_sf
from keys import key_states
from ledger import kgrams
from ledger.kgrams import KgramMatch
from ledger.read import generation_salts
from service.kgram_hashing import kgram_cache

SHARED_LEVEL = 1e-3
"""Level of the watermark test over a match's shared tokens (before the Bonferroni split)."""
MAX_TESTED = 5
"""Matches whose shared tokens are tested (the best by collision bound)."""


# The tails of the shared tokens' sums, memoised (pure functions of their arguments): the
# forms of one text share the generation's tokens, so each form's test of a match usually
# asks for the same sum, and the weighted tail is a series costing ~0.3 ms.
_weighted_sf = functools.lru_cache(maxsize=4096)(weighted_gamma_log10_sf)
_sf = functools.lru_cache(maxsize=4096)(gamma_log10_sf)


def with_shared_evidence(session, matches: Sequence[KgramMatch], candidates: Sequence[Candidate],
                         token_ids: Sequence[int], config: DetectorConfig, *,
                         cache: kgrams.KgramCache | None = None) -> list[KgramMatch]:
    """``matches`` with ``shared_tokens`` and ``log10_shared_p`` filled in for the (at most
    :data:`MAX_TESTED`) best whose collision bound passes the threshold, and each match's
    key state at generation and now (:mod:`keys.key_states`). ``cache``: the one
    :func:`ledger.kgrams.find_matches` filled for these matches, in the same transaction."""
    return with_key_states(session, with_shared_scores(session, matches, candidates, token_ids, config, cache=cache))


def with_key_states(session, matches: Sequence[KgramMatch], *, at_generation: Mapping[str, str | None] | None = None,
                    now: Mapping[str, str] | None = None) -> list[KgramMatch]:
    """``matches`` with each one's key state at generation and now (two queries in all, none
    for what ``at_generation`` and ``now`` hold already: :func:`keys.key_states.states_at_generation`
    and :func:`keys.key_states.current_states` of these matches, read in the look-up)."""
    if not matches:
        return list(matches)
    if at_generation is None or any(m.generation_id not in at_generation for m in matches):
        at_generation = key_states.states_at_generation(session, (m.generation_id for m in matches))
    if now is None or any(m.key_id not in now for m in matches):
        now = key_states.current_states(session, (m.key_id for m in matches))
    return [dataclasses.replace(m, key_state_at_generation=at_generation.get(m.generation_id),
                                key_state_now=now.get(m.key_id)) for m in matches]


def with_shared_scores(session, matches: Sequence[KgramMatch], candidates: Sequence[Candidate],
                       token_ids: Sequence[int], config: DetectorConfig, *,
                       cache: kgrams.KgramCache | None,
                       memo: scoring.ScoreMemo | None = None,
                       salts: Mapping[str, int] | None = None) -> list[KgramMatch]:
    """``matches`` with ``shared_tokens`` and ``log10_shared_p`` (:func:`with_shared_evidence`
    without the key states: a caller merging the matches of several forms adds those once).
    ``memo``: the detection's scores (detector.scoring.ScoreMemo), read where it scored the
    same token list under the same key, computed and kept there otherwise. ``salts``: the
    salts of these matches' generations (ledger.read.generation_salts), read already
    in the look-up (none: read here)."""
    threshold = math.log10(config.threshold)
    # A `diverse` key is S salted candidates with one key id: the match's generation names
    # its salt in the ledger (ledger.read.generation_salts), and that salt is scored.
    by_key: dict[str, dict[int | None, Candidate]] = {}
    for c in candidates:
        if c.info.key_id:
            by_key.setdefault(c.info.key_id, {})[c.info.salt] = c
    tested: list[int] = []
    for i, match in enumerate(matches):
        if len(tested) < MAX_TESTED and match.key_id in by_key and match.log10_false_match_bound <= threshold:
            tested.append(i)
    if not tested:
        return list(matches)
    if salts is None:
        salts = generation_salts(session, [matches[i].generation_id for i in tested])
    chosen: dict[int, Candidate] = {}
    for i in tested:
        options = by_key[matches[i].key_id]
        salt = salts.get(matches[i].generation_id)
        chosen[i] = options.get(salt) or options.get(None) or next(iter(options.values()))
    cache = kgram_cache() if cache is None else cache
    tokens = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    positions: dict[tuple[str, str], set[int]] = {}
    masks: dict[tuple[str, str], np.ndarray] = {}
    scores: dict[tuple[str, int | None], tuple[np.ndarray, dict[str, np.ndarray]]] = {}
    for key_id in dict.fromkeys(matches[i].key_id for i in tested):
        candidate = chosen[next(i for i in tested if matches[i].key_id == key_id)]
        skip = candidate.key.spec.context_width
        # Tokens whose whole context lies inside a shared k-gram: their scores are the generation's.
        # As a mask over the tokens from the look-up's arrays (KgramCache.shared_mask), else as sets.
        rest = []
        for generation_id in dict.fromkeys(matches[i].generation_id for i in tested if matches[i].key_id == key_id):
            mask = cache.shared_mask(key_id, generation_id, token_ids, skip)
            if mask is None:
                rest.append(generation_id)
            else:
                masks[generation_id, key_id] = mask
        if rest:
            shared = kgrams.shared_positions(session, key_id=key_id, generation_ids=rest, token_ids=token_ids,
                                             secret=candidate.key.secret, skip=skip, cache=cache)
            positions.update(((generation_id, key_id), found) for generation_id, found in shared.items())
    for i in tested:
        candidate = chosen[i]
        if (candidate.info.key_id, candidate.info.salt) not in scores:
            scores[candidate.info.key_id, candidate.info.salt] = _token_scores(
                tokens, candidate, _statistics(candidate, config), memo)
    out = list(matches)
    for i in tested:
        match = out[i]
        candidate = chosen[i]
        scored_at, per_statistic = scores[candidate.info.key_id, candidate.info.salt]
        mask = masks.get((match.generation_id, match.key_id))
        if mask is not None:
            inside = mask[scored_at]
        else:
            inside = np.isin(scored_at, np.fromiter(positions[match.generation_id, match.key_id], dtype=np.int64))
        log10_p, n = 0.0, 0
        for statistic, per_token in per_statistic.items():
            # Summed one by one in token order, as before: the same float (np.sum pairs terms).
            shared_scores = per_token[inside].tolist()
            n = len(shared_scores)
            if not shared_scores:
                continue
            if statistic == "weighted":
                p = _weighted_sf(sum(shared_scores), n, candidate.key.spec.alpha)
            else:
                p = _sf(sum(shared_scores), n)
            log10_p = min(log10_p, min(0.0, p + math.log10(len(per_statistic))))  # Bonferroni over the statistics
        out[i] = dataclasses.replace(match, shared_tokens=n, log10_shared_p=round(float(log10_p), 6))
    return out


def _token_scores(tokens: np.ndarray, candidate: Candidate, statistics: list[str],
                  memo: scoring.ScoreMemo | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The scored positions [s] of ``tokens`` [n] under the candidate's spec and, per
    statistic, their scores [s]: the detector's own per-token terms (detector.scoring), from
    ``memo`` where the detection computed them."""
    spec = candidate.key.spec
    memo = scoring.ScoreMemo() if memo is None else memo
    scored = memo.positions(tokens, spec.context_width, spec.dedup)
    if statistics == ["max", "weighted"]:  # both from one pass of the two keys' PRF
        parts = memo.dual(candidate.key, scored)
        return scored.positions, {"max": parts.max, "weighted": parts.weighted}
    if len(statistics) == 1 and statistics[0] in ("max", "weighted") and spec.algorithm == "dual_key_gumbel":
        # The detector scores a forced max or weighted statistic from the same one pass.
        return scored.positions, {statistics[0]: getattr(memo.dual(candidate.key, scored), statistics[0])}
    return scored.positions, {s: memo.token_scores(candidate.key, scored, s) for s in statistics}


def _statistics(candidate: Candidate, config: DetectorConfig) -> list[str]:
    """The statistics the shared tokens are tested with: the detector's, and for ordinary-coin
    dual keys under ``auto`` both ``max`` and ``weighted``, as the whole-text verdict does
    (the key-B share is unknown: α without speculation, the rejection rate with it)."""
    statistic = statistic_for(candidate, config)
    spec = candidate.key.spec
    if config.dual_statistic == "auto" and spec.algorithm == "dual_key_gumbel" and spec.coin == "ordinary":
        return ["max", "weighted"]
    return [statistic]


def passing(kgram_matches: Sequence[KgramMatch], threshold: float) -> list[bool]:
    """Per match: does it put the ledger in ``basis`` (collision bound at or below the
    threshold and the shared tokens' watermark test at SHARED_LEVEL / matches tested)?"""
    tested = sum(m.log10_shared_p is not None for m in kgram_matches)
    level = math.log10(SHARED_LEVEL / max(1, tested))
    return [m.log10_false_match_bound <= math.log10(threshold) and m.log10_shared_p is not None
            and m.log10_shared_p <= level for m in kgram_matches]


def with_ledger_basis(result: dict[str, Any], matches: list[dict[str, Any]], kgram_matches: Sequence[KgramMatch],
                      threshold: float) -> dict[str, Any]:
    """``result`` (a detection result's dict) with its ledger evidence: ``ledger_matches``,
    ``kgram_matches`` (each with ``passes``) and ``"ledger"`` in ``basis`` when an exact
    copy is recorded or a k-gram match passes, even when the watermark does not
    (``watermarked`` stays the watermark's verdict)."""
    passes = passing(kgram_matches, threshold)
    result["ledger_matches"] = matches
    result["kgram_matches"] = [{**m.to_dict(), "passes": p} for m, p in zip(kgram_matches, passes)]
    if (matches or any(passes)) and "ledger" not in result["basis"]:
        result["basis"] = [*result["basis"], "ledger"]
    return result
