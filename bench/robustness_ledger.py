"""Edited text against both bases: the watermark test and ledger retrieval; and how far any
watermark-only test could go. Writes bench/results/robustness-ledger.md and .json.

    nice -n 10 .venv/bin/python -m bench.robustness_ledger [--texts 200] [--null 20000]

Same texts, keys and attacks as ``bench/robustness.py`` (its generator and its attack
seeds), so its cells compare with robustness.md's. Per edited text:

- ``auto``: ``detector.detect.detect`` with the default config (span-aware verdict), TPR at
  p <= 1e-6: the watermark basis alone.
- ``ledger``: every generated text recorded in a real SQLite key store (its key imported,
  its ledger entry and k-gram digests written by ``ledger.entries`` / ``ledger.kgrams``, as the
  gateway does); the edited copy looked up by ``ledger.kgrams.find_matches`` under its key;
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
import platform
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
from ledger import kgrams
from keys.db import open_store
from keys.kek import Kek
from ledger.entries import record_generation
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
                                      output_text=" ".join(map(str, text)), token_ids=text,
                                      kgram_set=kgrams.kgram_set(info.key_id, key.secret, text))
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


# ---------------------------------------------------------------- same-domain human null

HUMAN_PROMPTS = ("The function returns", "class ")
"""The bundled model's prompts for the human null's generations (reports/qa.md section 1)."""
PYDOC_MODULES = ("json", "collections", "pathlib", "functools", "itertools", "string", "textwrap", "enum",
                 "dataclasses", "typing", "abc", "heapq", "bisect", "copy", "fractions", "decimal", "random",
                 "statistics", "csv", "zipfile", "argparse", "logging", "threading", "socket", "subprocess")
PYDOC_CHARS, PYDOC_CHUNK = 12_000, 2_000  # qa's set: the first 12,000 characters of each page
EDIT_RATES = (0.0, 0.1, 0.2, 0.3)
HUMAN_SECRET = 0x5CC4_7A1D_0000_0001  # tests/service/gateway.FIXED_SECRETS["acme"]: the same texts every run


def _bundled_generations(key: WatermarkKey, seeds: range) -> tuple[list[dict], object]:
    """The bundled model's watermarked generations (target + draft on CPU, as the test
    gateway runs it), 200 tokens at most, one per (seed, prompt); and its tokenizer."""
    import asyncio

    from service.engines.base import Finished, GenerationRequest, WatermarkPlan
    from service.engines.local.engine import LocalEngine

    async def run():
        engine = LocalEngine("bundled", "hallmark-tiny-draft", device="cpu", max_batch=8, speculative_k=4)
        await engine.start()
        tokenizer = engine.tokenizer()
        plan = WatermarkPlan(key=key, key_id="bench", version=1, fingerprint=key.fingerprint)
        requests = [GenerationRequest(f"h{seed}-{i}", tuple(tokenizer.encode(prompt)), 200, seed=seed, watermark=plan)
                    for seed in seeds for i, prompt in enumerate(HUMAN_PROMPTS)]

        async def one(request):
            async for event in engine.generate(request):
                if isinstance(event, Finished):
                    return {"text": event.text, "tokens": list(event.token_ids)}

        try:
            return await asyncio.gather(*(one(r) for r in requests)), tokenizer
        finally:
            await engine.stop()

    return asyncio.run(run())


def _record_one_key(store, key: WatermarkKey, generations: list[dict]) -> tuple[str, str]:
    """One tenant, one key, every generation recorded under it (as the gateway records them)."""
    with store.transaction() as session:
        tenant = create_tenant(session, name="bench", actor=ACTOR)
        info = import_key(session, store.keyring, tenant="bench", secret=key.secret, spec=key.spec,
                          actor=ACTOR, source="bench")
        for g in generations:
            entry = record_generation(session, tenant_id=tenant.id, key_id=info.key_id, key_version=info.version,
                                      engine="local", model="bundled", spec=key.spec, prompt_tokens=0,
                                      watermarked_tokens=len(g["tokens"]), unwatermarked_reason=None,
                                      output_text=g["text"], token_ids=g["tokens"],
                                      kgram_set=kgrams.kgram_set(info.key_id, key.secret, g["tokens"]))
        return tenant.id, info.key_id


def pydoc_chunks() -> list[tuple[str, int, str]]:
    """Human text of the model's own domain: the standard library's plain-text pydoc of 25
    modules, whole, in 2,000-character chunks: (module, offset, chunk). Those at offsets
    below 12,000 are reports/qa.md's set."""
    import importlib
    import pydoc

    chunks = []
    for name in PYDOC_MODULES:
        doc = pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext)
        chunks += [(name, i, doc[i:i + PYDOC_CHUNK]) for i in range(0, len(doc), PYDOC_CHUNK)]
    return chunks


def _tally(cell: dict, found, basis: bool, watermarked: bool) -> None:
    cell["chunks"] += 1
    cell["ledger"] += basis
    cell["ledger_previous_rule"] += any(m.log10_false_match_bound <= THRESHOLD for m in found)
    cell["with_kgram_match"] += bool(found)
    cell["max_matched_kgrams"] = max([cell["max_matched_kgrams"], *(m.matched for m in found)])
    cell["watermarked"] += watermarked
    tested = [m.log10_shared_p for m in found if m.log10_shared_p is not None]
    if tested:
        cell["min_log10_shared_p"] = min(cell["min_log10_shared_p"], *tested)
        cell["shared_p_below_1e-2"] += min(tested) <= -2


def run_human_null(workdir: Path, seeds: int = 10) -> dict:
    """Same-domain human text against the bundled model's generations in a real ledger: how
    many chunks get ``ledger`` in ``basis`` (product rule; previous rule for comparison), and
    how many the watermark test calls watermarked."""
    from service.detection import tokenize_with_offsets

    config = DetectorConfig()
    key = WatermarkKey(HUMAN_SECRET, WatermarkSpec(algorithm="dual_key_gumbel", context_width=WIDTH))
    generations, tokenizer = _bundled_generations(key, range(1, seeds + 1))
    directory = workdir / "human"
    directory.mkdir()
    store = _open_store(directory)
    try:
        tenant_id, key_id = _record_one_key(store, key, generations)
        candidate = _stored_candidate(key, key_id)
        out = {"generations": len(generations), "generation_tokens": sum(len(g["tokens"]) for g in generations),
               "python": platform.python_version(), "sets": {}, "closest": []}
        empty = {"chunks": 0, "ledger": 0, "ledger_previous_rule": 0, "watermarked": 0, "with_kgram_match": 0,
                 "max_matched_kgrams": 0, "min_log10_shared_p": 0.0, "shared_p_below_1e-2": 0}
        first, whole = dict(empty), dict(empty)
        out["sets"] = {f"first {PYDOC_CHARS:,} characters of each page (reports/qa.md's set)": first,
                       "whole pages": whole}
        for module, offset, chunk in pydoc_chunks():
            token_ids, _ = tokenize_with_offsets(tokenizer, chunk)
            with store.transaction(write=False) as session:
                found, passes, basis = ledger_lookup(session, [candidate], token_ids, config, tenant_id)
            watermarked = detect(token_ids, [candidate], config).log10_p_value <= THRESHOLD
            for cell in ([first, whole] if offset < PYDOC_CHARS else [whole]):
                _tally(cell, found, basis, watermarked)
            out["closest"] += [{"module": module, "offset": offset, "matched_kgrams": m.matched,
                                "shared_tokens": m.shared_tokens, "log10_shared_p": m.log10_shared_p, "passes": p}
                               for m, p in zip(found, passes) if m.log10_shared_p is not None
                               and m.log10_shared_p <= -2]
        # The control: the same generations, tokens substituted at random, against the same ledger.
        rng = np.random.default_rng(2026)
        out["edited_generations"] = []
        for rate in EDIT_RATES:
            cell = {"rate": rate, "texts": 0, "ledger": 0, "ledger_previous_rule": 0, "watermarked": 0, "either": 0}
            for g in generations:
                edited = [int(rng.integers(0, len(tokenizer))) if rng.random() < rate else t for t in g["tokens"]]
                with store.transaction(write=False) as session:
                    found, passes, basis = ledger_lookup(session, [candidate], edited, config, tenant_id)
                watermarked = detect(edited, [candidate], config).log10_p_value <= THRESHOLD
                cell["texts"] += 1
                cell["ledger"] += basis
                cell["ledger_previous_rule"] += any(m.log10_false_match_bound <= THRESHOLD for m in found)
                cell["watermarked"] += watermarked
                cell["either"] += watermarked or basis
            out["edited_generations"].append(cell)
    finally:
        store.close()
    return out


def write(result: dict, out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    rows, null, human = result["rows"], result["null"], result.get("human_null")
    lines = ["# Edited text: watermark basis, ledger basis, and a survivor oracle (issue 11)", ""]
    for run in result["runs"]:
        note = f" ({run['note']})" if run.get("note") else ""
        lines.append(f"- {run['part']}: `{run['command']}`{note} at commit {run['commit']}, {run['date']}, "
                     f"{run['seconds'] / 60:.0f} min on the shared 2-core box.")
    lines += [
        "",
        "Same texts, keys and attack seeds as `bench/robustness.py` (see robustness.md for the",
        "settings). TPR at 1e-6. `auto`: the watermark test alone (default config, span-aware).",
        "`ledger`: the edited copy puts `ledger` in `basis` through a k-gram match to its own",
        "generation in a real SQLite store, by the product's rule (`service.ledger_evidence`:",
        "`with_shared_evidence` + `with_ledger_basis`, as `/v1/detect` and `hallmark detect` call",
        "them): false-match bound <= 1e-6 **and** the watermark test over the shared tokens alone at",
        "1e-3 split over the matches tested. `verdict`: either basis (what /v1/detect reports in",
        "`basis`). `oracle` (substitution only, not a detector): the exact sum test over just the",
        "tokens the edits left intact, i.e. a test that is told where the signal survived.",
        "`previous rule`: the collision bound alone (the rule before the shared-token gate; the",
        "same lookups, for comparison).",
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
    lines += ["", "## Nulls", "",
              f"Random tokens: {null['tests']:,} unwatermarked texts (uniform tokens, under the same attacks),",
              f"each looked up in one cell's ledger ({null['cells']} ledgers): **{null['false_matches']} get `ledger`",
              f"in `basis`** ({null['false_matches_previous_rule']} under the previous rule). Uniform tokens never",
              "share an 8-token run with a generation, so this null only tests hash collisions.", ""]
    if human:
        lines += [
            "Same-domain human text: the standard library's own plain-text pydoc (of",
            f"{len(PYDOC_MODULES)} modules, 2,000-character chunks; Python {human['python']}), against",
            f"{human['generations']} generations of the bundled model (prompts {' / '.join(map(repr, HUMAN_PROMPTS))},",
            "seeds 1-10, at most 200 tokens, dual_key_gumbel, target + draft on CPU) in a real ledger,",
            "tokenised by the bundled tokenizer as /v1/detect does:",
            "",
            "| set | chunks | sharing a k-gram (most k-grams shared) | `ledger` in basis, previous rule "
            "| **`ledger` in basis** | watermarked | smallest shared-token p | chunks with a shared-token p <= 1e-2 |",
            "|---|---|---|---|---|---|---|---|",
            *(f"| {name} | {c['chunks']} | {c['with_kgram_match']} ({c['max_matched_kgrams']}) | "
              f"{c['ledger_previous_rule']} | **{c['ledger']}** | {c['watermarked']} | "
              f"10^{c['min_log10_shared_p']:.2f} | {c['shared_p_below_1e-2']} |" for name, c in human["sets"].items()),
            "",
            "The gate's level is 1e-3 split over the matches tested; the closest chunks' matches are in",
            "the .json (`human_null.closest`).",
            "",
            "Control, same ledger: the generations themselves with random token substitution (token ids",
            "looked up directly; counts of generations; k-gram path only: an unedited copy's text also",
            "matches by its output hash, which this leaves out):",
            "",
            "| substituted | generations | `ledger` in basis, previous rule | **`ledger` in basis** | watermarked | either basis |",
            "|---|---|---|---|---|---|",
        ]
        for c in human["edited_generations"]:
            lines.append(f"| {c['rate'] * 100:.0f} % | {c['texts']} | {c['ledger_previous_rule']} | **{c['ledger']}** | "
                         f"{c['watermarked']} | {c['either']} |")
        lines.append("")
    lines += ["## Findings", "", *FINDINGS, ""]
    out.write_text("\n".join(lines))


FINDINGS = [
    "- The oracle column shows what finding the surviving tokens would buy: with w = 4 an",
    "  edit silences w + 1 = 5 scored tokens, so 20 % substitution leaves about a third of",
    "  them and 30 % about a sixth. Where even the oracle is low (0.9 nats at 20-30 %, 1.7",
    "  nats at 40 %) a test of the watermark scores alone has little to gain; where the",
    "  oracle is high and `auto` is not (1.7 nats at 30 %), the gap is the price of not",
    "  knowing which tokens survived. For dual keys the oracle scores `max` (it does not",
    "  know each token's key), so it can fall below `auto`, whose `weighted` component",
    "  uses the share α.",
    "- The ledger basis (product rule) matches an edited copy to its own generation at",
    "  0.98-1.00 with 10 % of tokens edited (any kind), after mixing and unedited, in every",
    "  cell; at 1.7 nats also 0.99-1.00 at 20 %, 0.76-0.94 at 30 %. At 0.9 nats it holds",
    "  less: 0.71-0.91 at 20 %, 0.29-0.60 at 30 %, truncation 0.66-0.84; from 40 % it is gone",
    "  (<= 0.33 anywhere). The previous rule (collision bound alone) kept 0.93-1.00 up to",
    "  30 % everywhere: the difference is the gate, which needs the shared tokens to carry the",
    "  watermark at 1e-3, and at low entropy fewer, shorter surviving runs carry less of it.",
    "  Neither rule matched another generation in any cell.",
    "- Nulls: the random-token null never shares an 8-token run, so it only tests hash",
    "  collisions (0 under either rule). Same-domain human text does share runs: the",
    "  standard library's pydoc shares boilerplate with the bundled model's generations, and",
    "  every chunk that did was an edited copy under the previous rule; under the product",
    "  rule none is. The gate's margin there is not wide: the closest chunk's shared tokens",
    "  had p = 10^-3.07 (two matches tested, level 10^-3.30), and 14 of the 258 chunks",
    "  sharing a run had a match at or below 1e-2: boilerplate the model sampled with some",
    "  choice presumably carries some of the watermark. 0 of 415 is an estimate (about 0.7 %",
    "  at most, 95 %, chunks assumed independent), not a 1e-6 guarantee, and a larger ledger",
    "  of such generations shares more with such text.",
    "- The ledger basis needs the generation to have been recorded by this deployment; the",
    "  watermark basis does not (text from any engine with the key).",
]


def _commit() -> str:
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":!bench/results"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + ("+uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--null", type=int, default=100000)
    parser.add_argument("--entropies", default="1.7,0.9")
    parser.add_argument("--algorithms", default="gumbel,dual_key_gumbel")
    parser.add_argument("--no-human", action="store_true", help="skip the same-domain human null")
    parser.add_argument("--cells-from", help="take the cells and the random-token null (with their run "
                        "record) from this earlier result .json instead of running them")
    parser.add_argument("--out", default=str(RESULTS / "robustness-ledger.md"))
    args = parser.parse_args()
    base = "nice -n 10 .venv/bin/python -m bench.robustness_ledger"
    date = lambda: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())  # noqa: E731
    result: dict = {"runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        if args.cells_from:
            earlier = json.loads(Path(args.cells_from).read_text())
            result.update(rows=earlier["rows"], null=earlier["null"])
            result["runs"] += [r for r in earlier.get("runs", []) if r["part"] != "human null"]
        else:
            started, when = time.perf_counter(), date()
            result["rows"], result["null"] = run_cells(
                args.texts, args.n, [float(x) for x in args.entropies.split(",")], args.algorithms.split(","),
                args.null, Path(tmp))
            result["runs"].append({"part": "cells and random-token null", "date": when, "commit": _commit(),
                                   "command": f"{base} --texts {args.texts} --null {args.null}"
                                              + (" --no-human" if args.no_human else ""),
                                   "seconds": time.perf_counter() - started})
        if not args.no_human:
            started, when = time.perf_counter(), date()
            result["human_null"] = run_human_null(Path(tmp))
            command = f"{base} --cells-from PATH" if args.cells_from else f"{base} --texts {args.texts} --null {args.null}"
            result["runs"].append({"part": "human null", "date": when, "commit": _commit(), "command": command,
                                   "note": "PATH: the cells part's .json" if args.cells_from else None,
                                   "seconds": time.perf_counter() - started})
    write(result, Path(args.out))
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
