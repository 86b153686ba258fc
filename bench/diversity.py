"""Diversity under the watermark (issue 24); writes bench/results/diversity-<part>.json and diversity.md.

    nice -n 10 .venv/bin/python -m bench.diversity diversity [--prompts 20 --generations 10 --tokens 48]
    nice -n 10 .venv/bin/python -m bench.diversity diversity --rotating
    nice -n 10 .venv/bin/python -m bench.diversity tpr [--bundled 80 --synthetic 200]
    nice -n 10 .venv/bin/python -m bench.diversity null [--null 100000]
    nice -n 10 .venv/bin/python -m bench.diversity timing
    .venv/bin/python -m bench.diversity report        # diversity.md from the parts

Parts run as separate processes (two at a time on the shared box); each part's JSON holds its
command, commit, date and the box's load average at its start.

* ``diversity``: the local engine on CPU (bundled target + draft, as the service runs it),
  ``--prompts`` prompts x ``--generations`` generations of ``--tokens`` tokens at T = 1.0,
  each generation with its own seed (as independent requests would be): watermark off (an
  unwatermarked engine run, since the gateway refuses unwatermarked requests), and on under a
  `gumbel` and a `dual_key_gumbel` key (keyed coin: the engine speculates, k = 4) in each mode
  (`deterministic`: today's scheme; `diverse` with an independent salt per generation from
  its seed, watermark.salt.salt_for, as seeded requests get; and, with ``--rotating``, `diverse`
  as unseeded requests get, each prompt's generations taking the salts in turn,
  watermark.salt.SaltRotation). Metrics per prompt, averaged over prompts: the share of distinct
  outputs among the generations, distinct token 3-grams / all 3-grams across the
  generations, and self-BLEU (BLEU-4 of each generation against the others, token level,
  add-one smoothing of the 2-4-gram precisions, brevity penalty), lower = more diverse.
* ``tpr``: detection at p <= 1e-6 (global p, default config: `auto`, spans on) of
  200-token texts under `diverse` keys (each text its own key and salt), unedited and with
  20 % of tokens substituted (the robustness bench's attacks, bench.robustness.attack), (a) with
  the salt known (what the ledger gives; the same test as a `deterministic` key's: a salted
  secret is an ordinary key) and (b) searching the 16 salts (detector.result.salted_candidates,
  Šidák over 16). Paired on the same texts. Bundled models (as bench.robustness.generate_bundled)
  and the robustness bench's synthetic text (1.7 nats/token, sigma 5, vocabulary 1000).
* ``null``: unwatermarked 200-token texts (uniform tokens, vocabulary 8192), each under a fresh
  `diverse` key searched over its 16 salts (default config); false positives at 1e-6 and 1e-3.
* ``timing``: CPU time per 200-token text of detect_many (default config) for one key in
  each mode (deterministic: 1 candidate; diverse: 16 salted candidates), median of repeats.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
PROMPTS = [
    "The function returns", "Return a new list", "This module provides", "The default value is",
    "If the argument is", "Raise an exception when", "The class defines", "Create a new",
    "This method is called", "The file object", "Each element of the", "The following example",
    "Note that the", "When the timeout", "A string containing", "The number of",
    "Parameters are passed", "Read the data from", "The result is", "Set the value of",
]
BUNDLED_N = 200
LEVEL = -6.0


def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _meta(part: str) -> dict:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"part": part, "command": "nice -n 10 .venv/bin/python -m bench.diversity " + " ".join(sys.argv[1:]),
            "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}


def _write(part: str, payload: dict) -> None:
    path = RESULTS / f"diversity-{part}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print("wrote", path, flush=True)


# --- metrics -------------------------------------------------------------------------------

def _ngrams(tokens, n):
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def bleu4(candidate: list[int], references: list[list[int]]) -> float:
    """Sentence BLEU-4 (Papineni et al. 2002): clipped n-gram precisions against every
    reference, geometric mean (add-one smoothing for n >= 2), brevity penalty with the
    closest reference length."""
    if not candidate:
        return 0.0
    logs = 0.0
    for n in range(1, 5):
        counts = Counter(_ngrams(candidate, n))
        if not counts:
            return 0.0
        best: Counter = Counter()
        for ref in references:
            for gram, c in Counter(_ngrams(ref, n)).items():
                best[gram] = max(best[gram], c)
        clipped = sum(min(c, best[g]) for g, c in counts.items())
        total = sum(counts.values())
        if n == 1:
            if clipped == 0:
                return 0.0
            logs += math.log(clipped / total)
        else:
            logs += math.log((clipped + 1) / (total + 1))
    closest = min((abs(len(r) - len(candidate)), len(r)) for r in references)[1]
    bp = 1.0 if len(candidate) > closest else math.exp(1 - closest / len(candidate))
    return bp * math.exp(logs / 4)


def diversity_metrics(generations: list[list[int]]) -> dict:
    distinct = len({tuple(g) for g in generations}) / len(generations)
    grams = [gram for g in generations for gram in _ngrams(g, 3)]
    distinct3 = len(set(grams)) / len(grams) if grams else 0.0
    self_bleu = float(np.mean([bleu4(g, generations[:i] + generations[i + 1:]) for i, g in enumerate(generations)]))
    return {"distinct_outputs": distinct, "distinct_3grams": distinct3, "self_bleu": self_bleu}


# --- generation with the local engine -------------------------------------------------------

def _key(secret: int, algorithm: str, mode: str):
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    spec = WatermarkSpec(algorithm=algorithm, mode=mode,
                         coin="keyed" if algorithm == "dual_key_gumbel" else "ordinary")
    return WatermarkKey(secret, spec)


def engine_generate(jobs: list[dict], max_tokens: int, temperature: float = 1.0) -> list[dict]:
    """Run ``jobs`` (prompt, seed, key or None) on the local engine (CPU, bundled target +
    draft, batches of 16) at ``temperature``; each result adds its tokens."""
    import asyncio

    from service.engines.base import Finished, GenerationRequest, WatermarkPlan
    from service.engines.local.engine import LocalEngine
    from watermark.salt import salt_for

    async def run() -> list[dict]:
        engine = LocalEngine("bundled", "hallmark-tiny-draft", device="cpu", max_batch=16, speculative_k=4)
        await engine.start()
        tokenizer = engine.tokenizer()
        out = []
        try:
            for start in range(0, len(jobs), 16):
                wave = jobs[start:start + 16]
                requests = []
                for i, job in enumerate(wave):
                    plan = None
                    key = job["key"]
                    if key is not None:
                        if key.spec.salted and key.salt is None:  # a seeded request's salt
                            key = key.with_salt(job["salt"] if job.get("salt") is not None else salt_for(job["seed"]))
                        plan = WatermarkPlan(key=key, key_id="bench", version=1, fingerprint=key.fingerprint)
                    requests.append(GenerationRequest(f"r{start + i}", tuple(tokenizer.encode(job["prompt"])),
                                                      max_tokens, temperature=temperature, seed=job["seed"],
                                                      watermark=plan))

                async def one(request):
                    async for event in engine.generate(request):
                        if isinstance(event, Finished):
                            return event

                done = await asyncio.gather(*(one(r) for r in requests))
                for job, request, event in zip(wave, requests, done):
                    out.append({**job, "key": request.watermark.key if request.watermark else None,
                                "tokens": list(event.token_ids), "text": tokenizer.decode(list(event.token_ids))})
                print(f"generated {len(out)}/{len(jobs)}", flush=True)
        finally:
            await engine.stop()
        return out

    return asyncio.run(run())


MODES = [("off", None, None), ("gumbel", "gumbel", "deterministic"), ("gumbel", "gumbel", "diverse"),
         ("dual_key_gumbel", "dual_key_gumbel", "deterministic"), ("dual_key_gumbel", "dual_key_gumbel", "diverse")]


ROTATING_MODES = [("gumbel", "gumbel", "diverse"), ("dual_key_gumbel", "dual_key_gumbel", "diverse")]


def run_diversity(prompts: int, generations: int, tokens: int, rotating: bool = False, replicate: int = 0,
                  fresh_keys: bool = False) -> dict:
    """``rotating``: unseeded `diverse` generations as the service runs them, each prompt's
    generations taking the salts in turn (watermark.salt.SaltRotation); otherwise each
    generation's salt comes from its own seed (independent uniform salts)."""
    from watermark.salt import SaltRotation

    rows = []
    started = time.perf_counter()
    modes = ROTATING_MODES if rotating else MODES
    if replicate:  # again with other seeds: the metrics' sampling noise (off, or gumbel rotating)
        modes = ROTATING_MODES[:1] if rotating else [m for m in MODES if m[1] is None]
    if fresh_keys:  # control: a new random key for every generation (as if S were infinite)
        modes = [("gumbel", "gumbel", "deterministic")]
    for label, algorithm, mode in modes:
        # One key per configuration (a tenant's key), fixed; every generation its own seed.
        key = None if algorithm is None else _key(_seed("diversity-key", algorithm) | (1 << 40), algorithm, mode)
        rotation = SaltRotation()
        if replicate:
            key = None if algorithm is None else _key(_seed("diversity-key", algorithm, replicate) | (1 << 40),
                                                      algorithm, mode)
        jobs = [{"prompt": PROMPTS[p], "seed": _seed("diversity", label, mode, p, g, *([replicate] if replicate else [])),
                 "key": _key(_seed("fresh", p, g) | (1 << 41), algorithm, mode) if fresh_keys else key, "p": p,
                 "salt": rotation.take("bench", (p,)) if rotating else None}
                for p in range(prompts) for g in range(generations)]
        t0 = time.perf_counter()
        done = engine_generate(jobs, tokens)
        per_prompt = [diversity_metrics([d["tokens"] for d in done if d["p"] == p]) for p in range(prompts)]
        salts = ("salts in turn per prompt" + (f", replicate {replicate}: other seeds and key" if replicate else "")
                 if rotating else "independent salt per generation") if mode == "diverse" else ""
        if fresh_keys:
            salts = "a fresh random key per generation: the ideal salt space"
        row = {"watermark": ("off" + (f" (replicate {replicate}: other seeds)" if replicate else "")) if algorithm is None
               else f"{algorithm} {mode}" + (f" ({salts})" if salts else ""),
               **{name: float(np.mean([m[name] for m in per_prompt])) for name in per_prompt[0]},
               "generation_s": round(time.perf_counter() - t0, 1),
               "mean_tokens": float(np.mean([len(d["tokens"]) for d in done]))}
        rows.append(row)
        print(row, flush=True)
    return {"prompts": prompts, "generations": generations, "tokens": tokens, "temperature": 1.0, "rows": rows,
            "seconds": round(time.perf_counter() - started, 1)}


# --- detection -----------------------------------------------------------------------------

def _detect_pair(tokens: list[int], key, config) -> tuple[float, float]:
    """log10 p with the salt known (one candidate) and searching the 16 salts."""
    from detector.detect import detect
    from detector.multikey import detect_many
    from detector.result import Candidate, salted_candidates

    known = detect(tokens, [Candidate.inline(key)], config).log10_p_value
    searched = detect_many(tokens, salted_candidates([Candidate.inline(key.with_salt(None))]), config).log10_p_value
    return known, searched


def _tpr_rows(source: str, algorithm: str, texts: list[list[int]], keys, vocab: int) -> list[dict]:
    from bench.robustness import attack
    from detector.detect import DetectorConfig

    config = DetectorConfig()
    rows = []
    for kind, rate in (("none", 0.0), ("substitution", 0.2)):
        rng = np.random.default_rng(_seed("tpr", source, algorithm, kind, rate))
        pairs = np.array([_detect_pair(attack(t, kind, rate, rng, vocab), k, config) for t, k in zip(texts, keys)])
        known, searched = pairs[:, 0], pairs[:, 1]
        rows.append({"source": source, "algorithm": algorithm, "attack": kind, "rate": rate, "texts": len(texts),
                     "tpr6_salt_known": float(np.mean(known <= LEVEL)),
                     "tpr6_16_salts": float(np.mean(searched <= LEVEL)),
                     "median_log10_p_salt_known": float(np.median(known)),
                     "median_log10_p_16_salts": float(np.median(searched)),
                     "max_log10_p_cost": float(np.max(searched - known))})
        print(rows[-1], flush=True)
    return rows


def run_tpr(bundled: int, synthetic: int) -> dict:
    from bench import robustness
    from watermark.salt import salt_for

    rows = []
    facts = {}
    for algorithm in ("gumbel", "dual_key_gumbel"):
        # Synthetic (bench.robustness.generate: the real PRF, under each text's salted key).
        keys = [_key(_seed("tpr-synthetic", algorithm, i) | (1 << 40), algorithm, "diverse") for i in range(synthetic)]
        keys = [k.with_salt(salt_for(_seed("tpr-salt", algorithm, i))) for i, k in enumerate(keys)]
        texts = robustness.generate(keys, BUNDLED_N, robustness.SIGMAS[1.7], seed=_seed("tpr-gen", algorithm))
        rows += _tpr_rows("synthetic 1.7 nats", algorithm, texts, keys, robustness.VOCAB)
    for algorithm in ("gumbel", "dual_key_gumbel"):
        t0 = time.perf_counter()
        kept, tried = [], 0
        while len(kept) < bundled:
            jobs = [{"prompt": PROMPTS[(tried + i) % len(PROMPTS)], "seed": _seed("tpr-bundled", algorithm, tried + i),
                     "key": _key(_seed("tpr-bundled-key", algorithm, tried + i) | (1 << 40), algorithm, "diverse")}
                    for i in range(16)]
            tried += 16
            kept += [d for d in engine_generate(jobs, BUNDLED_N) if len(d["tokens"]) == BUNDLED_N][:bundled - len(kept)]
        facts[algorithm] = {"tried": tried, "kept": len(kept), "generation_s": round(time.perf_counter() - t0, 1)}
        rows += _tpr_rows("bundled", algorithm, [d["tokens"] for d in kept], [d["key"] for d in kept], 8192)
    return {"rows": rows, "bundled_generation": facts}


def run_null(total: int) -> dict:
    from detector.detect import DetectorConfig
    from detector.multikey import KeySet, detect_many
    from detector.result import Candidate, salted_candidates

    rng = np.random.default_rng(24)
    config = DetectorConfig()
    hits6 = hits3 = 0
    smallest = 0.0
    started = time.perf_counter()
    for i in range(total):
        algorithm = "gumbel" if i % 2 == 0 else "dual_key_gumbel"
        key = _key(int(rng.integers(0, 2**63)), algorithm, "diverse")
        keyset = KeySet.of(salted_candidates([Candidate.inline(key)]))
        lp = detect_many(rng.integers(0, 8192, BUNDLED_N), keyset, config, per_key=False).log10_p_value
        hits6 += lp <= -6
        hits3 += lp <= -3
        smallest = min(smallest, lp)
        if (i + 1) % 10000 == 0:
            print({"tests": i + 1, "fp6": hits6, "fp3": hits3, "s": round(time.perf_counter() - started)}, flush=True)
    return {"tests": total, "salts": 16, "fp6": int(hits6), "fp3": int(hits3), "smallest_log10_p": smallest,
            "seconds": round(time.perf_counter() - started, 1)}


def run_timing(repeats: int) -> dict:
    from detector.detect import DetectorConfig
    from detector.multikey import KeySet, detect_many
    from detector.result import Candidate, salted_candidates

    rng = np.random.default_rng(7)
    config = DetectorConfig()
    out = {}
    for algorithm in ("gumbel", "dual_key_gumbel"):
        for mode in ("deterministic", "diverse"):
            key = _key(0x5EED_0024 | (1 << 40), algorithm, mode)
            keyset = KeySet.of(salted_candidates([Candidate.inline(key)]))
            texts = [rng.integers(0, 8192, BUNDLED_N) for _ in range(repeats)]
            detect_many(texts[0], keyset, config)  # compile / warm
            times = []
            for t in texts:
                t0 = time.process_time()
                detect_many(t, keyset, config)
                times.append(time.process_time() - t0)
            out[f"{algorithm} {mode}"] = {"candidates": len(keyset.candidates),
                                          "cpu_ms_median": round(1e3 * float(np.median(times)), 3),
                                          "cpu_ms_min": round(1e3 * float(np.min(times)), 3)}
            print(algorithm, mode, out[f"{algorithm} {mode}"], flush=True)
    for algorithm in ("gumbel", "dual_key_gumbel"):
        out[f"{algorithm} ratio"] = round(out[f"{algorithm} diverse"]["cpu_ms_median"]
                                          / out[f"{algorithm} deterministic"]["cpu_ms_median"], 2)
    return {"repeats": repeats, "texts": "unwatermarked, 200 tokens", "rows": out}


# --- report --------------------------------------------------------------------------------

def _load(part: str) -> dict | None:
    path = RESULTS / f"diversity-{part}.json"
    return json.loads(path.read_text()) if path.exists() else None


def report() -> str:
    lines = ["# Diversity under the watermark (issue 24)", "",
             "Written by `.venv/bin/python -m bench.diversity report` from the parts below (bench/diversity.py "
             "says how each is measured); each part names its command, commit and the box's load average.", ""]
    div = _load("diversity")
    runs = []
    if div:
        for row in div["rows"]:
            if row["watermark"].endswith(" diverse"):
                row["watermark"] += " (independent salt per generation, as seeded requests get)"
        runs.append(div["meta"])
    for extra in (_load("diversity-replicate"), _load("diversity-fresh-keys"), _load("diversity-rotating"),
                  _load("diversity-rotating-replicate")):
        if div and extra:
            div = {**div, "rows": div["rows"] + extra["rows"]}
            runs.append(extra["meta"])
    if div:
        lines += ["## Diversity of repeated generations", "",
                  f"{div['prompts']} prompts x {div['generations']} generations x {div['tokens']} tokens, "
                  f"T = {div['temperature']}, bundled target + draft on CPU, every generation its own seed. Runs "
                  "(commands, commits, load average at start on the 2 shared CPUs):", ""]
        lines += [f"* `{m['command']}` (commit {m['commit'][:10]}, {m['date']}, load {m['load_average_at_start']})"
                  for m in runs]
        lines += ["", "Percentages: change against the first `off` row.", "",
                  "| watermark | distinct outputs | distinct 3-grams | self-BLEU (lower = more diverse) | mean tokens |",
                  "|---|---|---|---|---|"]
        off = div["rows"][0]
        for r in div["rows"]:
            def rel(name):
                return "" if r is off else f" ({(r[name] - off[name]) / off[name] * 100:+.1f} %)"
            lines.append(f"| {r['watermark']} | {r['distinct_outputs']:.3f}{rel('distinct_outputs')} | "
                         f"{r['distinct_3grams']:.3f}{rel('distinct_3grams')} | {r['self_bleu']:.3f}{rel('self_bleu')} | "
                         f"{r['mean_tokens']:.1f} |")
        lines.append("")
    tpr = _load("tpr")
    if tpr:
        m = tpr["meta"]
        lines += ["## Detection power at 1e-6 (200-token texts)", "",
                  f"`{m['command']}` (commit {m['commit'][:10]}, {m['date']}, load average {m['load_average_at_start']}). "
                  "Same texts, detected with the salt known (= a deterministic key's test) and searching the 16 salts. "
                  f"Bundled generation: {tpr['bundled_generation']}.", "",
                  "| source | algorithm | attack | texts | TPR salt known | TPR 16 salts | median log10 p known | "
                  "median log10 p 16 salts | largest cost (log10 p) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in tpr["rows"]:
            attack = "no edit" if r["attack"] == "none" else f"{r['rate']:.0%} substitution"
            lines.append(f"| {r['source']} | {r['algorithm']} | {attack} | {r['texts']} | {r['tpr6_salt_known']:.2f} | "
                         f"{r['tpr6_16_salts']:.2f} | {r['median_log10_p_salt_known']:.1f} | "
                         f"{r['median_log10_p_16_salts']:.1f} | {r['max_log10_p_cost']:.2f} |")
        lines += ["", f"log10(16) = {math.log10(16):.2f}: Šidák's bound on the cost of searching 16 salts.", ""]
    null = _load("null")
    if null:
        m = null["meta"]
        lines += ["## Null (unwatermarked text, diverse keys searched over 16 salts)", "",
                  f"`{m['command']}` (commit {m['commit'][:10]}, {m['date']}, load average {m['load_average_at_start']}): "
                  f"{null['tests']:,} texts of 200 uniform tokens, each its own key (gumbel and dual in turn), "
                  f"default config: **{null['fp6']} at p <= 1e-6**, {null['fp3']} at p <= 1e-3 "
                  f"(expected <= {null['tests'] * 1e-3:.0f}); smallest log10 p {null['smallest_log10_p']:.2f}; "
                  f"{null['seconds']} s.", ""]
    timing = _load("timing")
    if timing:
        m = timing["meta"]
        lines += ["## Detection time per key", "",
                  f"`{m['command']}` (commit {m['commit'][:10]}, {m['date']}, load average {m['load_average_at_start']}): "
                  f"CPU time per 200-token unwatermarked text, `detect_many`, default config, median of "
                  f"{timing['repeats']}.", "", "| key | candidates | CPU ms (median) | CPU ms (min) |", "|---|---|---|---|"]
        for name, r in timing["rows"].items():
            if isinstance(r, dict):
                lines.append(f"| {name} | {r['candidates']} | {r['cpu_ms_median']} | {r['cpu_ms_min']} |")
        ratios = {k: v for k, v in timing["rows"].items() if not isinstance(v, dict)}
        lines += ["", f"diverse / deterministic, per stored key: {ratios}.", ""]
    text = "\n".join(lines)
    (RESULTS / "diversity.md").write_text(text + "\n")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=["diversity", "tpr", "null", "timing", "report"])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--generations", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--replicate", type=int, default=0, help="diversity: the unwatermarked run only, with "
                        "other seeds (part diversity-replicate)")
    parser.add_argument("--fresh-keys", action="store_true", help="diversity: control, gumbel with a new key per "
                        "generation (part diversity-fresh-keys)")
    parser.add_argument("--rotating", action="store_true", help="diversity: the diverse modes with the "
                        "service's salt rotation (written as part diversity-rotating)")
    parser.add_argument("--bundled", type=int, default=80)
    parser.add_argument("--synthetic", type=int, default=200)
    parser.add_argument("--null", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    if args.part == "report":
        print(report())
        return
    meta = _meta(args.part)
    if args.part == "diversity":
        payload = run_diversity(args.prompts, args.generations, args.tokens, args.rotating, args.replicate,
                                args.fresh_keys)
        if args.fresh_keys:
            args.part = "diversity-fresh-keys"
        elif args.rotating and args.replicate:
            args.part = "diversity-rotating-replicate"
        elif args.rotating:
            args.part = "diversity-rotating"
        elif args.replicate:
            args.part = "diversity-replicate"
    elif args.part == "tpr":
        payload = run_tpr(args.bundled, args.synthetic)
    elif args.part == "null":
        payload = run_null(args.null)
    else:
        payload = run_timing(args.repeats)
    _write(args.part, {"meta": meta, **payload})


if __name__ == "__main__":
    main()
