"""bench.robustness_ledger decides the ledger basis with the product's rule
(service.ledger_evidence), not a copy of it: a recorded text that shares every k-gram with
the one looked up but carries no watermark under the key is not a ledger basis; a
watermarked generation's copy is."""

from __future__ import annotations

import numpy as np

from bench import robustness_ledger as rl
from bench.robustness import SIGMAS, VOCAB, WIDTH, attack, generate
from detector.detect import DetectorConfig
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


def test_the_ledger_column_is_the_products_basis_and_the_previous_rule_is_kept_apart(tmp_path):
    spec = WatermarkSpec(algorithm="gumbel", context_width=WIDTH)
    keys = [WatermarkKey(0x5EED_0000 + 7919 * i + (1 << 40) * 17, spec) for i in range(2)]
    watermarked = generate(keys[:1], 200, SIGMAS[1.7], seed=170)[0]
    unwatermarked = [int(x) for x in np.random.default_rng(5).integers(0, VOCAB, 200)]
    store = rl._open_store(tmp_path)
    try:
        ids = rl._record(store, keys, [watermarked, unwatermarked])
        config = DetectorConfig()
        edited = attack(watermarked, "substitution", 0.1, np.random.default_rng(1))
        assert rl._ledger_hits(store, keys[0], ids[0], edited, config) == {
            "own": True, "other": False, "own_old": True, "other_old": False}
        # Every k-gram shared, collision bound far past 1e-6, but the shared tokens carry no watermark.
        assert rl._ledger_hits(store, keys[1], ids[1], unwatermarked, config) == {
            "own": False, "other": False, "own_old": True, "other_old": False}
    finally:
        store.close()


def test_the_report_shows_both_nulls_and_both_rules(tmp_path):
    row = {"nats": 1.7, "algorithm": "gumbel", "attack": "substitution", "rate": 0.3, "auto": 0.1, "ledger": 0.9,
           "verdict": 0.9, "wrong_generation": 0, "ledger_previous_rule": 1.0, "verdict_previous_rule": 1.0,
           "wrong_generation_previous_rule": 0, "oracle": 0.5}
    cell = {"chunks": 132, "ledger": 0, "ledger_previous_rule": 89, "watermarked": 0, "with_kgram_match": 89,
            "max_matched_kgrams": 47, "min_log10_shared_p": -2.5, "shared_p_below_1e-2": 1}
    human = {"generations": 20, "generation_tokens": 3600, "python": "3.11.7", "sets": {"qa's": cell}, "closest": [],
             "edited_generations": [{"rate": 0.2, "texts": 20, "ledger": 16, "ledger_previous_rule": 20,
                                     "watermarked": 13, "either": 16}]}
    result = {"runs": [{"part": "cells and random-token null", "command": "cmd", "commit": "abc", "date": "d",
                        "seconds": 60}],
              "rows": [row], "null": {"tests": 100, "false_matches": 0, "false_matches_previous_rule": 0, "cells": 1},
              "human_null": human}
    rl.write(result, tmp_path / "r.md")
    text = (tmp_path / "r.md").read_text()
    assert "| 1.7 | gumbel | substitution | 0.3 | 0.10 | 0.90 | 0.90 | 0.50 | 0 | 1.00 | 1.00 |" in text
    assert "| qa's | 132 | 89 (47) | 89 | **0** | 0 | 10^-2.50 | 1 |" in text
    assert "| 20 % | 20 | 20 | **16** | 13 | 16 |" in text
    assert (tmp_path / "r.json").exists()
