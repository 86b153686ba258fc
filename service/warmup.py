"""Detection warmed up at gateway start, before ``/readyz`` can answer.

The detector's compiled paths (numba: the PRF, deduplication, the many-key scan, Tr-GoF's
exact tail) compile on their first call, and numba's on-disk cache is empty after an install:
the first ``/v1/detect`` took 6-12 s (issue 30), longer than a client's default timeout.
:func:`warm_detection` makes every one of those first calls at start, on made-up keys of
every kind (both algorithms, both coins, both modes) and random token ids, through the code a
request runs (text forms, several forms at once, one key and many, the ledger basis's
shared-token scores, per-token evidence), and builds the tokenizer's segmentation table
(service.generation_ids), as the engine's kernel warm-up registry does for the GPU. It runs
in the app's lifespan, before the server accepts connections, so ``/readyz`` (and every
detection) comes after it.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from detector import spans, stats, trgof
from detector.detect import DetectorConfig, detect
from detector.forms import detect_forms, text_forms
from detector.multikey import KeySet, detect_many
from detector.result import Candidate, salted_candidates
from detector.scoring import ScoreMemo
from ledger import kgram_digests
from service import generation_ids, kgram_hashing
from watermark import jit, prf
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

log = logging.getLogger("hallmark.warmup")

SPECS = tuple(WatermarkSpec(algorithm=algorithm, coin=coin, prf=name, **scheme)
              for name in sorted(set(prf.NAMES.values()))
              for algorithm in ("gumbel", "dual_key_gumbel") for coin in ("ordinary", "keyed")
              for scheme in ({"mode": "deterministic"}, {"mode": "diverse"},
                             {"mode": "diverse", "diversity": "head", "dedup": "all"})
              if algorithm == "dual_key_gumbel" or coin == "ordinary")
"""A key of every kind a store can hold (every PRF; a keyed coin is a dual-key option; a
`diverse` key salted, or with its unwatermarked head: watermark.head)."""


def warm_detection(engine=None) -> float:
    """Compile and load everything a detection runs (seconds it took). ``engine``: the
    gateway's, whose tokenizer is loaded and whose segmentation table is built."""
    started = time.perf_counter()
    jit.load()  # the compiled paths from the first request on (watermark.jit)
    trgof.warm_up()
    stats.warm_up()  # the weighted tail's series and the vectorised Gamma tail
    spans.warm_up()  # the span search's window sums and its boundary scan
    rng = np.random.default_rng(0)
    texts = [rng.integers(0, 4000, n).tolist() for n in (40, 200)]
    for statistic in ("auto", "max"):
        for spec in SPECS:
            if statistic == "max" and spec.algorithm != "dual_key_gumbel":
                continue
            config = DetectorConfig(dual_statistic=statistic)
            one = Candidate.inline(WatermarkKey(0x5EED_0001, spec), "warmup")
            many = salted_candidates([one, Candidate.inline(WatermarkKey(0x5EED_0002, spec), "warmup-2")])
            for tokens in texts:
                detect(tokens, [one] if spec.mode == "deterministic" else many[:1], config)
                memo = ScoreMemo()
                detect_forms([tokens, tokens[1:]], KeySet.of(many), config, run=detect_many, memo=memo)
                _shared_scores(tokens, many[0], config, memo)
    kgram_hashing.digest_array(texts[1], bytes(32), kgram_digests.K)  # the ledger's k-gram digests (compiled)
    if engine is not None:
        from service.detection import tokenize_with_offsets

        tokenizer = engine.tokenizer()
        forms, _ = text_forms("Warm up:\n    a text\u00a0with “forms”.")
        for form in forms:  # through the request's path: its piece tables made here (service.tokenization)
            tokenize_with_offsets(tokenizer, form.text)
        table = generation_ids.segmentation_table(tokenizer, engine)
        if table is not None:
            table.by_id  # noqa: B018 - the tokens' arrays merge_space_runs reads, built once
    seconds = time.perf_counter() - started
    log.info("detection warmed up in %.2f s", seconds)
    return seconds


WARM_TENANTS = 4
"""Tenants whose keys a start opens and whose detection it runs once (the first few: the
key cache opens the others' on their first request, as it does whenever an entry expires)."""
WARM_TEXT = ("Warm up: the gateway detects this text once at start, so that its first request "
             "finds every statement compiled and every key opened.\n    def f(x):\n        return x")


def warm_requests(services) -> float:
    """One in-process detection as an operator (every tenant's keys) and as each of the first
    :data:`WARM_TENANTS` tenants: SQLAlchemy compiles each statement of the look-up and basis
    on its first use (~40 ms in all), and keys and the signing key are opened then (~50 ms).
    Not counted in the metrics; nothing is written. Seconds it took; a failure (no keys, the
    database down) only logs: readiness reports the database."""
    from keys.tenants import list_tenants
    from service import detection
    from service.auth import Identity
    from service.schemas import DetectBody

    started = time.perf_counter()
    try:
        with services.store.transaction(write=False) as session:
            tenants = list_tenants(session)[:WARM_TENANTS]
        identities = [Identity("warmup", None, None, admin=True)]
        identities += [Identity("warmup", t.id, t.name, admin=False) for t in tenants]
        for identity in identities:
            try:
                detection.detect(services, identity, DetectBody(text=WARM_TEXT), counted=False)
            except Exception as exc:  # noqa: BLE001 - a tenant without keys (404) and the like
                log.debug("warm-up detection as %s: %s", identity.tenant or "operator", exc)
    except Exception as exc:  # noqa: BLE001 - the gateway starts anyway; /readyz says what is wrong
        log.warning("detection warm-up could not reach the store: %s", type(exc).__name__)
    return time.perf_counter() - started


def _shared_scores(tokens, candidate: Candidate, config: DetectorConfig, memo: ScoreMemo) -> None:
    """The ledger basis's shared-token scores (service.ledger_evidence), off the memo."""
    from service.ledger_evidence import _statistics, _token_scores

    _token_scores(np.asarray(tokens, dtype=np.int64), candidate, _statistics(candidate, config), memo)
