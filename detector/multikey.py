"""One text against many keys, batched: the result of :func:`detector.detect.detect`
(same verdict, global p, winning key and spans) at a fraction of its cost.

:func:`detect` computes every key in full. Here (:func:`detect_many`):

1. The scored positions of each (context width, dedup scope) are found once, and every
   key's PRF runs over them in one compiled pass per key group, which returns integer
   bounds only (:mod:`watermark.keyscan`, no floating-point score).
2. The screen (:mod:`detector.screen`): from those, a lower bound L_k and an upper bound
   U_k on each key's combined p-value P_k; keys with L_k > min_j U_j cannot be the best
   (P_k > min_j P_j, strictly) and stop there.
3. The keys left run :func:`detector.detect.partial_evidence` (the per-key code of
   :func:`detect`, so their numbers are its numbers), which gives each an upper bound on
   P_k without Tr-GoF's exact tail; with their minimum as the bar, a key computes the exact
   tail where :func:`detect` would, unless a lower bound on Tr-GoF's p shows that the key
   cannot be the best even so (then its ``log10_p_trgof`` is the union bound, as for most
   keys in :func:`detect`, and the entry says ``screened``).
4. :func:`detector.detect.finish` on every key: the best among the keys computed in full
   is the best key of :func:`detect` (ties go to the earlier key in both, since a key left
   out has P_k strictly above the minimum), with the same p; Šidák's correction counts
   every key tested, Holm's adjustment runs over every key's reported p.

Error control is unchanged: the family is every key, whatever the screen computed. A key
left out keeps a ``per_key`` entry whose p-values are valid upper bounds (Chernoff bounds
on its sums, Tr-GoF's p <= 1), marked ``screened``. Keys with a keyed acceptance coin
(the ``routed`` statistic, whose per-token weights depend on the text before each token)
are not screened: they always take step 3.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from detector import screen, scoring, stats
from detector.detect import (Deferred, DetectorConfig, KeyEvidence, Pending, check_tokens, complete, detect, key_result,
                             partial_evidence, pending_result, positions_key, statistic_for, weights)
from detector.result import Candidate, DetectionResult, KeyResult
from watermark import jit, keyscan, keyscan_cpu
from watermark.spec import WatermarkSpec


@dataclass(frozen=True)
class KeyGroup:
    """Candidates that share everything but their secrets (one PRF pass each, one table set)."""

    spec: WatermarkSpec
    indices: np.ndarray
    """int64 [g]: the group's positions in the candidate list, ascending."""
    keys_a: np.ndarray
    """uint64 [g]: the PRF key of each candidate's stream A (the secret, or key A)."""
    keys_b: np.ndarray | None
    """uint64 [g]: key B of dual keys; None for single keys."""
    wide: tuple[tuple[int, ...], tuple[int, ...] | None] | None = None
    """256-bit keys (their stream A and B keys as ints; keys_a / keys_b hold zeros): the scan
    runs on their PRF's words (keyscan.scan_stats_from_words), not the compiled Philox scan."""


@dataclass(frozen=True)
class KeySet:
    """Candidates prepared for :func:`detect_many`: grouped by spec, with their PRF keys as
    arrays (built once per key list; a service keeps it with its key cache)."""

    candidates: tuple[Candidate, ...]
    groups: tuple[KeyGroup, ...]

    @classmethod
    def of(cls, candidates: Sequence[Candidate]) -> "KeySet":
        members: dict[WatermarkSpec, list[int]] = {}
        for index, candidate in enumerate(candidates):
            members.setdefault(candidate.key.spec, []).append(index)
        groups = []
        for spec, indices in members.items():
            keys = [candidates[i].key for i in indices]
            dual = spec.algorithm == "dual_key_gumbel"
            wide = None
            if spec.key_bits != 64:  # the compiled scan runs Philox keys: 256-bit keys scan their words
                wide = (tuple(k.key_a if dual else k.prf_secret for k in keys),
                        tuple(k.key_b for k in keys) if dual else None)
                keys_a = np.zeros(len(keys), dtype=np.uint64)
                keys_b = np.zeros(len(keys), dtype=np.uint64) if dual else None
            else:
                keys_a = np.array([k.key_a if dual else k.prf_secret for k in keys], dtype=np.uint64)
                keys_b = np.array([k.key_b for k in keys], dtype=np.uint64) if dual else None
            groups.append(KeyGroup(spec=spec, indices=np.array(indices, dtype=np.int64), keys_a=keys_a, keys_b=keys_b,
                                   wide=wide))
        return cls(candidates=tuple(candidates), groups=tuple(groups))


@dataclass(frozen=True)
class GroupPlan:
    """What a group's keys are tested with under one config."""

    group: KeyGroup
    statistic: str
    share: dict[str, float]
    gof_form: str | None
    """The p-values Tr-GoF reads (``single``, ``max``, ``sidak``), None without Tr-GoF."""

    @property
    def screened(self) -> bool:
        return self.statistic != "routed"

    @property
    def sum_form(self) -> str:
        return "weighted" if self.statistic == "weighted" else self.statistic


def plan(group: KeyGroup, candidates: Sequence[Candidate], config: DetectorConfig, with_spans: bool) -> GroupPlan:
    spec = group.spec
    statistic = statistic_for(candidates[int(group.indices[0])], config)
    share = weights(config, with_spans, dual_auto=(spec.algorithm == "dual_key_gumbel"
                                                   and config.dual_statistic == "auto" and statistic == "max"))
    gof_form = None
    if "trgof" in share:  # as detector.detect.partial_evidence picks Tr-GoF's scores
        gof_form = "sidak" if statistic == "weighted" or "weighted" in share else statistic
    return GroupPlan(group=group, statistic=statistic, share=share, gof_form=gof_form)


def group_tables(plan: GroupPlan, longest: int) -> keyscan.ScanTables:
    """The scan tables of a group's keys (single-key groups read stream A's levels only)."""
    return screen.scan_tables(plan.gof_form or "single", plan.group.spec.alpha, longest)


def scan_group(plan: GroupPlan, scored: scoring.ScoredPositions) -> np.ndarray:
    """Scan statistics [g, 4] of the group's keys over one text's scored positions."""
    n = len(scored.tokens)
    tables = group_tables(plan, n)
    if plan.group.wide is not None:
        return _scan_wide(plan, scored, tables)
    streams = 1 if plan.group.keys_b is None else 2
    # The compiled pass, unless this is a small one-off in a process without numba (its
    # numpy reference then costs less than loading numba: watermark.jit.worth_loading).
    fn = keyscan_cpu.scan_stats if jit.worth_loading(streams * n * len(plan.group.indices)) \
        else keyscan.scan_stats_reference
    return fn(plan.group.keys_a, plan.group.keys_b, scored.contexts, scored.tokens, np.array([0, n]), tables)[0]


def _scan_wide(plan: GroupPlan, scored: scoring.ScoredPositions, tables: keyscan.ScanTables) -> np.ndarray:
    """scan_group for 256-bit keys: their PRF's words (one compiled HMAC pass per stream), then
    the scan statistics from them (the same integers the Philox scan computes from its words)."""
    from watermark import prf

    impl = prf.lookup(plan.group.spec.prf)
    keys_a, keys_b = plan.group.wide
    words_a = impl.words_many(keys_a, scored.contexts, scored.tokens)
    words_b = None if keys_b is None else impl.words_many(keys_b, scored.contexts, scored.tokens)
    return keyscan.scan_stats_from_words(words_a, words_b, np.array([0, len(scored.tokens)]), tables)[0]


# --------------------------------------------------------------------------- the screen


@dataclass(frozen=True)
class _Bounds:
    """A group's per-key bounds on each of its whole-text components (log10 p / share)."""

    n: int
    sum_lo: np.ndarray | None  # lower bound on the sum statistic [g] (its tail's argument)
    sum_hi: np.ndarray | None
    weighted_lo: np.ndarray | None
    weighted_hi: np.ndarray | None
    gof_hi: np.ndarray | None


def _weighted_scores(fixed_a: np.ndarray, fixed_b: np.ndarray, n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    gap = screen.chords().gap[0]
    a_lo, a_hi = screen.score_bounds(fixed_a, n, gap)
    b_lo, b_hi = screen.score_bounds(fixed_b, n, gap)
    return (1.0 - alpha) * a_lo + alpha * b_lo, (1.0 - alpha) * a_hi + alpha * b_hi


def _bounds(plan: GroupPlan, stat: np.ndarray, n: int) -> _Bounds:
    alpha = plan.group.spec.alpha
    sum_lo = sum_hi = weighted_lo = weighted_hi = gof_hi = None
    if plan.statistic == "weighted" or "weighted" in plan.share:
        weighted_lo, weighted_hi = _weighted_scores(stat[:, keyscan.SUM_A], stat[:, keyscan.SUM_B], n, alpha)
    if "sum" in plan.share:
        if plan.statistic == "weighted":
            sum_lo, sum_hi = weighted_lo, weighted_hi
        elif plan.statistic == "max":
            sum_lo, sum_hi = screen.score_bounds(stat[:, keyscan.SUM_MAX], n, screen.chords().gap[1])
        else:
            sum_lo, sum_hi = screen.score_bounds(stat[:, keyscan.SUM_A], n, screen.chords().gap[0])
    if "trgof" in plan.share:
        gof_hi = screen.gof_upper(stat[:, keyscan.GOF])
    return _Bounds(n=n, sum_lo=sum_lo, sum_hi=sum_hi, weighted_lo=weighted_lo, weighted_hi=weighted_hi, gof_hi=gof_hi)


def _sum_tail(plan: GroupPlan, score: float, n: int) -> float:
    if plan.statistic == "weighted":
        return stats.weighted_gamma_log10_sf(score, n, plan.group.spec.alpha)
    return stats.gamma_log10_sf(score, n)


def _group_upper(plan: GroupPlan, b: _Bounds) -> float:
    """min over the group's keys of an upper bound on their combined log10 P (from their
    largest lower-bounded sums: each tail falls as its score grows)."""
    best = 0.0
    if b.sum_lo is not None and len(b.sum_lo):
        best = min(best, _sum_tail(plan, float(b.sum_lo.max()), b.n) - math.log10(plan.share["sum"]))
    if "weighted" in plan.share and len(b.weighted_lo):
        best = min(best, stats.weighted_gamma_log10_sf(float(b.weighted_lo.max()), b.n, plan.group.spec.alpha)
                   - math.log10(plan.share["weighted"]))
    return best


def _lower(plan: GroupPlan, b: _Bounds, rows: np.ndarray) -> np.ndarray:
    """Lower bounds [len(rows)] on the combined log10 P of the group's keys ``rows``."""
    out = np.zeros(len(rows))
    for j, row in enumerate(rows.tolist()):
        parts = [0.0]
        if b.sum_hi is not None:
            parts.append(_sum_tail(plan, float(b.sum_hi[row]), b.n) - math.log10(plan.share["sum"]))
        if "weighted" in plan.share:
            parts.append(stats.weighted_gamma_log10_sf(float(b.weighted_hi[row]), b.n, plan.group.spec.alpha)
                         - math.log10(plan.share["weighted"]))
        if b.gof_hi is not None:
            parts.append(screen.log10_trgof_lower(float(b.gof_hi[row]), b.n) - math.log10(plan.share["trgof"]))
        out[j] = min(parts)
    return out


def _candidates(plan: GroupPlan, b: _Bounds, bar: float) -> np.ndarray:
    """Rows whose lower bound may be at most ``bar`` (a necessary condition per component,
    from monotone tails: a sum's tail at its upper bound can reach ``bar`` only if that
    bound reaches the group's largest lower bound, which gave an upper bound >= ``bar``)."""
    g = len(plan.group.indices)
    if b.n == 0:
        return np.arange(g)
    mask = np.zeros(g, dtype=bool)
    if b.sum_hi is not None:
        top = float(b.sum_lo.max())
        mask |= b.sum_hi >= top if top > 0.0 else True
    if "weighted" in plan.share:
        top = float(b.weighted_lo.max())
        mask |= b.weighted_hi >= top if top > 0.0 else True
    if b.gof_hi is not None:
        mask |= b.gof_hi >= screen.trgof_statistic_at_most(bar + math.log10(plan.share["trgof"]), b.n)
    return np.flatnonzero(mask)


def _screened_entries(plan: GroupPlan, b: _Bounds, rows: np.ndarray, candidates: Sequence[Candidate],
                      trgof_reported: bool) -> list[KeyResult]:
    """``per_key`` entries of the group's keys ``rows`` left out: valid upper bounds on
    each p (Chernoff bounds at the sums' lower bounds; Tr-GoF's p <= 1)."""
    alpha = plan.group.spec.alpha
    combined = np.zeros(len(rows))
    log10_p_sum = np.zeros(len(rows))
    log10_p_weighted = None
    score = np.zeros(len(rows))
    if b.sum_lo is not None:
        score = b.sum_lo[rows]
        log10_p_sum = (screen.log10_weighted_upper_chernoff(score, b.n, alpha) if plan.statistic == "weighted"
                       else screen.log10_gamma_upper_chernoff(score, b.n))
        combined = np.minimum(combined, log10_p_sum - math.log10(plan.share["sum"]))
    if "weighted" in plan.share:
        log10_p_weighted = screen.log10_weighted_upper_chernoff(b.weighted_lo[rows], b.n, alpha)
        combined = np.minimum(combined, log10_p_weighted - math.log10(plan.share["weighted"]))
    # (Tr-GoF's bound p <= 1 over its share is above 1: it never lowers the minimum.)
    indices = plan.group.indices[rows].tolist()
    weighted = [None] * len(rows) if log10_p_weighted is None else log10_p_weighted.tolist()
    return [KeyResult(key=candidates[i].info, statistic=plan.statistic, score=max(0.0, sc), scored_tokens=b.n,
                      log10_p_value=pk, log10_p_adjusted=0.0, log10_p_sum=ps,
                      log10_p_trgof=0.0 if trgof_reported else None, log10_p_weighted=pw, screened=True)
            for i, sc, pk, ps, pw in zip(indices, score.tolist(), combined.tolist(), log10_p_sum.tolist(), weighted)]


def _shares(plans: Sequence[GroupPlan]) -> dict[str, float]:
    """The ``shares`` :func:`detect` folds over its candidates in order (names in the order
    of first appearance, each weight from the last candidate that has it)."""
    out: dict[str, float] = {}
    for p in sorted(plans, key=lambda p: int(p.group.indices[0])):
        for name in p.share:
            out.setdefault(name, 0.0)
    for name in out:
        last = max((p for p in plans if name in p.share), key=lambda p: int(p.group.indices[-1]))
        out[name] = last.share[name]
    return out


def detect_many(token_ids: Sequence[int] | np.ndarray, keys: KeySet | Sequence[Candidate],
                config: DetectorConfig | None = None, *, scan: np.ndarray | None = None,
                per_key: bool = True, defer_spans: bool = False, defer_exact: bool = False,
                memo: scoring.ScoreMemo | None = None) -> DetectionResult | Pending | Deferred:
    """:func:`detector.detect.detect` of ``token_ids`` against every candidate in ``keys``
    (see the module docstring). ``scan``: the scan statistics [K, 4] of every candidate
    (rows of routed keys unused), computed elsewhere (a corpus scan on the GPU); by
    default the compiled CPU pass computes them. ``per_key`` False: no per-key entries
    (a corpus scan's verdicts; every other field is the same). ``defer_spans``: the
    :class:`~detector.detect.Pending` detection before its span search, as ``detect``'s;
    ``defer_exact``: the :class:`~detector.detect.Deferred` one before Tr-GoF's exact tails
    too (its bounds over the keys left after the screen, which hold the best);
    ``memo``: keeps the scores of the keys computed in full for the request's other readers."""
    config = config or DetectorConfig()
    keyset = keys if isinstance(keys, KeySet) else KeySet.of(keys)
    candidates = keyset.candidates
    tokens = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if not candidates:
        raise ValueError("no keys to test")
    check_tokens(tokens)
    m = len(candidates)
    if m == 1:  # one key is the best key: nothing to screen
        if defer_exact:
            inner = detect(tokens, candidates, config, defer_exact=True, memo=memo)
            return inner if per_key else Deferred(
                tokens, config, m, inner.partials, lambda: dataclasses.replace(inner.pending(), per_key=()))
        pending = detect(tokens, candidates, config, defer_spans=True, memo=memo)
        if not per_key:
            pending = dataclasses.replace(pending, per_key=())
        return pending if defer_spans else pending.result()
    log10_threshold = math.log10(config.threshold)
    with_spans = config.spans and len(tokens) >= 2 * config.span_min_length
    plans = [plan(group, candidates, config, with_spans) for group in keyset.groups]
    positions: dict[tuple[int, str], scoring.ScoredPositions] = {}
    for group in keyset.groups:
        key = positions_key(group.spec)
        if key not in positions:
            positions[key] = (memo.positions(tokens, group.spec.context_width, group.spec.dedup) if memo is not None
                              else scoring.scored_positions(tokens, group.spec.context_width, group.spec.dedup))

    # The screen: bounds from integer statistics, and their bar.
    bounds: dict[int, _Bounds] = {}
    bar = 0.0
    for number, p in enumerate(plans):
        if not p.screened:
            continue
        scored = positions[positions_key(p.group.spec)]
        n = len(scored.tokens)
        if n > keyscan.MAX_POSITIONS:
            continue  # too long to screen: computed in full
        stat = scan[p.group.indices] if scan is not None else scan_group(p, scored)
        bounds[number] = _bounds(p, stat, n)
        bar = min(bar, _group_upper(p, bounds[number]))
    survivors: set[int] = set()
    entries: dict[int, KeyResult] = {}
    shares = _shares(plans)
    for number, p in enumerate(plans):
        if number not in bounds:
            survivors.update(p.group.indices.tolist())
            continue
        b = bounds[number]
        rows = _candidates(p, b, bar)
        keep = rows[_lower(p, b, rows) <= bar] if len(rows) else rows
        survivors.update(p.group.indices[keep].tolist())
        if not per_key:
            continue
        out = np.ones(len(p.group.indices), dtype=bool)
        out[keep] = False
        rows_out = np.flatnonzero(out)
        for index, entry in zip(p.group.indices[rows_out].tolist(),
                                _screened_entries(p, b, rows_out, candidates, "trgof" in shares)):
            entries[index] = entry

    # The keys left: detect's per-key code, the exact tail gated by the smallest upper bound.
    partials = []
    for index in sorted(survivors):
        candidate = candidates[index]
        partials.append((index, partial_evidence(candidate, positions[positions_key(candidate.key.spec)], config,
                                                 with_spans, memo)))
    gate = bar
    for _, partial in partials:
        parts = list(partial.combined)
        if partial.gof is not None:
            parts.append(partial.trgof_union() - math.log10(partial.share["trgof"]))
        gate = min(gate, min(parts, default=0.0))

    def exact() -> Pending:
        evidence: list[KeyEvidence] = []
        for index, partial in partials:
            screen_lower = None
            if partial.needs_exact_tail():
                s, n, _, _ = partial.gof
                screen_lower = max(partial.trgof_lower(), screen.log10_trgof_lower(s, n))
            e = complete(partial, log10_threshold, log10_gate=gate, log10_screen_lower=screen_lower)
            evidence.append(e)
            entries[index] = key_result(e, "trgof" in shares)
        return (pending_result(tokens, evidence, None, shares, config, keys_tested=m) if not per_key
                else pending_result(tokens, evidence, [entries[i] for i in range(m)], shares, config))

    if defer_exact:
        return Deferred(tokens, config, m, [partial for _, partial in partials], exact)
    pending = exact()
    return pending if defer_spans else pending.result()
