"""Edited text against both bases: the watermark test and ledger retrieval; and how far any
watermark-only test could go. Writes bench/results/robustness-ledger.md and .json.

    nice -n 10 .venv/bin/python -m bench.robustness_ledger [--texts 200] [--null 20000]

Same texts, keys and attacks as ``bench/robustness.py`` (its generator and its attack
seeds), so its cells compare with robustness.md's. Per edited text:

- ``auto``: ``detector.detect.detect`` with the default config (span-aware verdict), TPR at
  p <= 1e-6: the watermark basis alone.
- ``ledger``: every generated text recorded in a real SQLite key store (its key imported,
  its ledger entry and k-gram digests written by ``keys.ledger`` / ``keys.kgrams``, as the
  gateway does); the edited copy looked up by ``keys.kgrams.find_matches`` under its key;
  a hit is a match to its own generation with false-match bound <= 1e-6 (the gateway's
  ledger-basis rule). ``verdict``: either basis (what ``/v1/detect`` reports in ``basis``).
- ``oracle`` (substitution only; not a detector): the exact sum test restricted to the
  tokens an edit did not touch (token and its w-token context unchanged), i.e. a test told
  which tokens still carry signal. Its TPR is a reference for what any test using only the
  watermark scores can hope for when it has to find those tokens itself.

Null: unwatermarked texts (uniform tokens) looked up in every cell's ledger under every key
of the cell; a false ledger match is any generation reported with bound <= 1e-6.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from bench.robustness import ATTACKS, SIGMAS, VOCAB, WIDTH, attack, generate
from detector import scoring
from detector.detect import DetectorConfig, detect
from detector.result import Candidate
from detector.stats import gamma_log10_sf
from keys import kgrams
from keys.db import open_store
from keys.kek import Kek
from keys.ledger import record_generation
from keys.lifecycle import import_key
from keys.settings import StoreSettings
from keys.tenants import create_tenant
from service.ledger_evidence import with_ledger_basis, with_shared_evidence
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

RESULTS = Path(__file__).resolve().parent / "results"
THRESHOLD = -6.0
EXTRA_ATTACKS = [("substitution", 0.4), ("substitution", 0.5), ("substitution", 0.6)]
"""Beyond robustness.py's rates: where the ledger basis gives out too."""
ACTOR = "bench"


def _open_store(directory: Path):
    from pydantic import SecretStr

    from keys.migrate import upgrade

    url = f"sqlite:///{directory / 'ledger.db'}"
    settings = StoreSettings(database_url=url, kek=SecretStr(Kek.generate().to_base64()))
    store = open_store(settings, require_kek=True, check_schema=False, create=True)
    upgrade(store.engine)
    return store


def _record(store, keys: list[WatermarkKey], texts: list[list[int]]) -> list[tuple[str, str, str]]:
    """Import each text's key and record its generation; returns (tenant id, key id, generation id)."""
    out = []
    with store.transaction() as session:
        tenant = create_tenant(session, name="bench", actor=ACTOR)
        for key, text in zip(keys, texts):
            info = import_key(session, store.keyring, tenant="bench", secret=key.secret, spec=key.spec,
                              actor=ACTOR, source="bench")
            entry = record_generation(session, tenant_id=tenant.id, key_id=info.key_id, key_version=info.version,
                                      engine="bench", model="random-lm", spec=key.spec, prompt_tokens=0,
                                      watermarked_tokens=len(text), unwatermarked_reason=None,
                                      output_text=" ".join(map(str, text)), token_ids=text)
            kgrams.record(session, tenant_id=tenant.id, generation_id=entry.id, key_id=info.key_id,
                          secret=key.secret, token_ids=text)
            out.append((tenant.id, info.key_id, entry.id))
    return out


def _stored_candidate(key: WatermarkKey, key_id: str) -> Candidate:
    """The key as a detection candidate of the store (tenant and stored key id), as the gateway has it."""
    inline = Candidate.inline(key)
    return dataclasses.replace(inline, info=dataclasses.replace(inline.info, tenant="bench", key_id=key_id))


def ledger_lookup(session, candidates: list[Candidate], text: list[int], config: DetectorConfig,
                  tenant_id: str | None) -> tuple[list, list[bool], bool]:
    """The product's ledger basis for ``text`` (``service.detection._kgram_matches`` +
    ``service.ledger_evidence.with_ledger_basis``): (k-gram matches, per match ``passes``,
    ``"ledger"`` in ``basis``). No exact copy is looked up: edited texts are never one."""
    keys = [(c.info.key_id, c.key.secret) for c in candidates]
    found = [] if len(text) < kgrams.K else kgrams.find_matches(session, keys=keys, token_ids=text,
                                                                   tenant_id=tenant_id)
    found = with_shared_evidence(session, found, candidates, text, config)
    result = with_ledger_basis({"basis": []}, [], found, config.threshold)
    return found, [m["passes"] for m in result["kgram_matches"]], "ledger" in result["basis"]


def _ledger_hits(store, key: WatermarkKey, ids: tuple[str, str, str], text: list[int],
                 config: DetectorConfig) -> dict[str, bool]:
    """Under the product rule (``passes``) and the previous rule (collision bound alone):
    matched its own generation, matched any other generation."""
    tenant_id, key_id, generation_id = ids
    with store.transaction(write=False) as session:
        found, passes, _ = ledger_lookup(session, [_stored_candidate(key, key_id)], text, config, tenant_id)
    old = [m.log10_false_match_bound <= THRESHOLD for m in found]
    return {"own": any(p and m.generation_id == generation_id for m, p in zip(found, passes)),
            "other": any(p and m.generation_id != generation_id for m, p in zip(found, passes)),
            "own_old": any(p and m.generation_id == generation_id for m, p in zip(found, old)),
            "other_old": any(p and m.generation_id != generation_id for m, p in zip(found, old))}


def _oracle_log10_p(original: list[int], edited: list[int], key: WatermarkKey) -> float:
    """Exact sum test over the tokens a substitution left intact (with their contexts)."""
    tokens = np.asarray(edited, dtype=np.int64)
    same = np.asarray(original, dtype=np.int64) == tokens
    intact = np.array([same[max(0, j - WIDTH):j + 1].all() for j in range(len(tokens))])
    scored = scoring.scored_positions(tokens, WIDTH, key.spec.dedup)
    keep = intact[scored.positions]
    statistic = "single" if key.spec.algorithm == "gumbel" else "max"  # both Exp(1) per token under the null
    scores = scoring.token_scores(key, scored, statistic)[keep]
    if scores.size == 0:
        return 0.0
    return gamma_log10_sf(float(scores.sum()), int(scores.size))


def run_cells(texts_per_cell: int, n: int, entropies, algorithms, null_texts: int, workdir: Path):
    rows, null = [], {"tests": 0, "false_matches": 0, "false_matches_previous_rule": 0, "cells": 0}
    config = DetectorConfig()
    null_rng = np.random.default_rng(4242)
    for nats in entropies:
        for algorithm in algorithms:
            spec = WatermarkSpec(algorithm=algorithm, context_width=WIDTH)
            # The keys and generation seed of bench/robustness.py: the same texts.
            keys = [WatermarkKey(0x5EED_0000 + 7919 * i + (1 << 40) * int(nats * 10), spec)
                    for i in range(texts_per_cell)]
            texts = generate(keys, n, SIGMAS[nats], seed=int(nats * 100) + (algorithm == "gumbel"))
            cell_dir = workdir / f"{nats}-{algorithm}"
            cell_dir.mkdir()
            store = _open_store(cell_dir)
            try:
                ids = _record(store, keys, texts)
                for kind, rate in ATTACKS + EXTRA_ATTACKS:
                    rng = np.random.default_rng(zlib.crc32(repr((kind, rate, nats, algorithm)).encode()))
                    attacked = [attack(t, kind, rate, rng) for t in texts]
                    wm, led, led_old, oracle, wrong, wrong_old = [], [], [], [], 0, 0
                    for original, edited, key, key_ids in zip(texts, attacked, keys, ids):
                        wm.append(detect(edited, [Candidate.inline(key)], config).log10_p_value <= THRESHOLD)
                        hits = _ledger_hits(store, key, key_ids, edited, config)
                        led.append(hits["own"])
                        led_old.append(hits["own_old"])
                        wrong += hits["other"]
                        wrong_old += hits["other_old"]
                        if kind in ("substitution", "none"):
                            oracle.append(_oracle_log10_p(original, edited, key) <= THRESHOLD)
                    wm_a, led_a, old_a = np.array(wm), np.array(led), np.array(led_old)
                    rows.append({"nats": nats, "algorithm": algorithm, "attack": kind, "rate": rate,
                                 "auto": float(wm_a.mean()), "ledger": float(led_a.mean()),
                                 "verdict": float((wm_a | led_a).mean()), "wrong_generation": int(wrong),
                                 "ledger_previous_rule": float(old_a.mean()),
                                 "verdict_previous_rule": float((wm_a | old_a).mean()),
                                 "wrong_generation_previous_rule": int(wrong_old),
                                 "oracle": float(np.mean(oracle)) if oracle else None})
                    print(rows[-1], flush=True)
                # Null: unrelated texts against this cell's ledger, under every key of the cell.
                per_cell = math.ceil(null_texts / (len(entropies) * len(algorithms)))
                for i in range(per_cell):
                    kind, rate = ATTACKS[i % len(ATTACKS)]
                    text = attack([int(x) for x in null_rng.integers(0, VOCAB, n)], kind, rate, null_rng)
                    j = i % len(keys)
                    hits = _ledger_hits(store, keys[j], ids[j], text, config)
                    null["tests"] += 1
                    null["false_matches"] += int(hits["own"] or hits["other"])
                    null["false_matches_previous_rule"] += int(hits["own_old"] or hits["other_old"])
                null["cells"] += 1
            finally:
                store.close()
    return rows, null


def write(rows, null, out: Path, command: str, seconds: float) -> None:
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "null": null}, indent=1))
    lines = [
        "# Edited text: watermark basis, ledger basis, and a survivor oracle (issue 11)", "",
        f"Command: `{command}` ({seconds / 60:.0f} min on the shared 2-core box).", "",
        "Same texts, keys and attack seeds as `bench/robustness.py` (see robustness.md for the",
        "settings). TPR at 1e-6. `auto`: the watermark test alone (default config, span-aware).",
        "`ledger`: the edited copy matched to its own generation through the k-gram digests in a",
        "real SQLite store, false-match bound <= 1e-6. `verdict`: either basis (what /v1/detect",
        "reports in `basis`). `oracle` (substitution only, not a detector): the exact sum test over",
        "just the tokens the edits left intact, i.e. a test that is told where the signal survived.",
        "",
        "| nats | key | attack | rate | auto | ledger | verdict | oracle | matched another generation "
        "| ledger, previous rule | verdict, previous rule |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        oracle = "" if r["oracle"] is None else f"{r['oracle']:.2f}"
        lines.append(f"| {r['nats']} | {r['algorithm']} | {r['attack']} | {r['rate']} | {r['auto']:.2f} | "
                     f"{r['ledger']:.2f} | {r['verdict']:.2f} | {oracle} | {r['wrong_generation']} | "
                     f"{r['ledger_previous_rule']:.2f} | {r['verdict_previous_rule']:.2f} |")
    lines += ["", f"Null: {null['tests']:,} unwatermarked texts under the same attacks, each looked up in",
              f"one cell's ledger ({null['cells']} ledgers): **{null['false_matches']} false ledger matches**",
              "at 1e-6.", "", "## Findings", "",
              "- The oracle column shows what finding the surviving tokens would buy: with w = 4 an",
              "  edit silences w + 1 = 5 scored tokens, so 20 % substitution leaves about a third of",
              "  them and 30 % about a sixth. Where even the oracle is low (0.9 nats at 20-30 %, 1.7",
              "  nats at 40 %) a test of the watermark scores alone has little to gain; where the",
              "  oracle is high and `auto` is not (1.7 nats at 30 %), the gap is the price of not",
              "  knowing which tokens survived. For dual keys the oracle scores `max` (it does not",
              "  know each token's key), so it can fall below `auto`, whose `weighted` component",
              "  uses the share α.",
              "- The ledger basis matches an edited copy to its own generation as long as a few",
              "  8-token runs survive (P(run intact) = (1 - r)^8): above 0.9 up to 30 % of tokens",
              "  edited, about 0.6 at 40 %, and it fades past 50 %. It never matched another",
              "  generation, and matched no unrelated text in the null run.",
              "- The ledger basis needs the generation to have been recorded by this deployment; the",
              "  watermark basis does not (text from any engine with the key).", ""]
    out.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--null", type=int, default=20000)
    parser.add_argument("--entropies", default="1.7,0.9")
    parser.add_argument("--algorithms", default="gumbel,dual_key_gumbel")
    parser.add_argument("--out", default=str(RESULTS / "robustness-ledger.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rows, null = run_cells(args.texts, args.n, [float(x) for x in args.entropies.split(",")],
                               args.algorithms.split(","), args.null, Path(tmp))
    command = ("nice -n 10 .venv/bin/python -m bench.robustness_ledger"
               f" --texts {args.texts} --null {args.null}")
    write(rows, null, Path(args.out), command, time.perf_counter() - started)
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
