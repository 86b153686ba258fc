"""`head` diversity against the salt search (issue 30, item 2); writes bench/results/diversity-head-<part>.json.

    nice -n 10 .venv/bin/python -m bench.diversity_head synthetic [--texts 1000 --keys gumbel,dual,keyed]
    nice -n 10 .venv/bin/python -m bench.diversity_head bundled [--texts 48]
    nice -n 10 .venv/bin/python -m bench.diversity_head null [--null 100000 --spans-share 0.05]
    nice -n 10 .venv/bin/python -m bench.diversity_head regenerations [--prompts 20 --generations 6]
    nice -n 10 .venv/bin/python -m bench.diversity_head head-cost [--texts 1000 --keys keyed]
    nice -n 10 .venv/bin/python -m bench.diversity_head spans-share [--texts 500]

* ``synthetic``: TPR at 1e-6 (global p, default config), 200 tokens, 20 % substitution
  (bench.robustness.attack), synthetic 1.7 nats/token text (bench.robustness.generate, the
  real PRF), for `gumbel`, `dual_key_gumbel` with the ordinary coin and with the keyed coin:
  (a) a `salt`-diverse key's text detected with its salt known (what the ledger gives),
  (b) the same text searching the 16 salts (no ledger), (c) a `head`-diverse key's text
  (first w tokens unwatermarked, watermark.head) detected as the service does without the
  ledger (detector.result.salted_candidates: one candidate). (a)/(b) and (c) use the same
  logits and attack draws; each text its own key.
* ``bundled``: the same three on the bundled models (local engine on CPU, target + draft,
  T = 1, 200-token generations kept when they ran to length): one `salt` key text and one
  `head` key text (dedup scope `all`) per prompt and seed.
* ``null``: uniform 200-token texts (vocabulary 8192), each under a fresh `head`-diverse key
  (gumbel and dual in turn), default config: the rate at 1e-3 against its binomial 95 %
  interval and the count at 1e-6.
* ``head-cost``: the head's own cost, paired (:func:`run_head_cost`).
* ``spans-share``: the verdict's spans share (0.25) against 0.05, where spans matter and
  where they do not (:func:`run_spans_share`; the null's side: ``null --spans-share``).
* ``regenerations``: unseeded generations of each prompt under one `head` key (the service's
  default key: gumbel, dedup all), 48 tokens, T = 1: distinct outputs, the longest shared
  prefix in characters between any two of a prompt's generations, and bench.diversity's
  metrics (distinct 3-grams, self-BLEU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np

from bench.diversity import PROMPTS, RESULTS, _meta, _seed, diversity_metrics, engine_generate

LEVEL = -6.0
N = 200


def _key(secret: int, algorithm: str, diversity: str, coin: str = "ordinary"):
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    return WatermarkKey(secret, WatermarkSpec(algorithm=algorithm, mode="diverse", diversity=diversity, coin=coin,
                                              dedup="all" if diversity == "head" else "single_turn"))


def _log10_p(tokens, key, config) -> float:
    """As the service detects without the ledger: the key's candidates (16 for `salt`, 1 for `head`)."""
    from detector.detect import detect
    from detector.multikey import detect_many
    from detector.result import Candidate, salted_candidates

    candidates = salted_candidates([Candidate.inline(key)])
    if len(candidates) == 1:
        return detect(tokens, candidates, config).log10_p_value
    return detect_many(tokens, candidates, config).log10_p_value


def _tpr(texts_salt, keys_salt, texts_head, keys_head, vocab: int, label: str) -> dict:
    from bench.robustness import attack
    from detector.detect import DetectorConfig, detect
    from detector.result import Candidate

    config = DetectorConfig()
    out = {}
    for kind, rate in (("none", 0.0), ("substitution", 0.2)):
        known, search, head = [], [], []
        rng_a = np.random.default_rng(_seed("head-attack", label, kind))
        rng_b = np.random.default_rng(_seed("head-attack", label, kind))  # the same edits on the head texts
        for text, key in zip(texts_salt, keys_salt):
            edited = attack(text, kind, rate, rng_a, vocab)
            known.append(detect(edited, [Candidate.inline(key)], config).log10_p_value)
            search.append(_log10_p(edited, key.with_salt(None), config))
        for text, key in zip(texts_head, keys_head):
            head.append(_log10_p(attack(text, kind, rate, rng_b, vocab), key, config))
        known, search, head = map(np.array, (known, search, head))
        row = {"texts": len(known), "tpr6_salt_known": float(np.mean(known <= LEVEL)),
               "tpr6_salt_search16": float(np.mean(search <= LEVEL)), "tpr6_head": float(np.mean(head <= LEVEL)),
               "median_log10_p_salt_known": float(np.median(known)),
               "median_log10_p_salt_search16": float(np.median(search)),
               "median_log10_p_head": float(np.median(head))}
        row["head_minus_known"] = round(row["tpr6_head"] - row["tpr6_salt_known"], 4)
        out[kind] = row
        print(label, kind, row, flush=True)
    return out


SYNTHETIC_KEYS = {"gumbel": ("gumbel", "ordinary"), "dual": ("dual_key_gumbel", "ordinary"),
                  "keyed": ("dual_key_gumbel", "keyed")}


def run_synthetic(count: int, which: list[str], replicate: int = 0) -> dict:
    from bench import robustness
    from watermark.salt import salt_for

    rows = {}
    for algorithm, coin in (SYNTHETIC_KEYS[name] for name in which):
        label = f"{algorithm} {coin} coin" if algorithm != "gumbel" else algorithm
        if replicate:  # other keys, logits and edits
            label += f" replicate {replicate}"
        salt_keys = [_key(_seed("head-syn", label, i) | (1 << 40), algorithm, "salt", coin)
                     .with_salt(salt_for(_seed("head-syn-salt", label, i))) for i in range(count)]
        head_keys = [_key(_seed("head-syn", label, i) | (1 << 40), algorithm, "head", coin) for i in range(count)]
        gen_seed = _seed("head-syn-gen", label)  # the same logits for both schemes
        sigma = robustness.SIGMAS[1.7]
        salt_texts = robustness.generate(salt_keys, N, sigma, seed=gen_seed)
        head_texts = robustness.generate(head_keys, N, sigma, seed=gen_seed, head=head_keys[0].spec.context_width)
        rows[label] = _tpr(salt_texts, salt_keys, head_texts, head_keys, robustness.VOCAB, "syn " + label)
    return {"source": "synthetic 1.7 nats/token, vocabulary 1000", "rows": rows}


def run_bundled(count: int) -> dict:
    from watermark.salt import salt_for

    rows, facts = {}, {}
    for algorithm in ("gumbel", "dual_key_gumbel"):
        coin = "keyed" if algorithm == "dual_key_gumbel" else "ordinary"  # the engine speculates with a keyed coin
        t0 = time.perf_counter()
        kept_salt, kept_head, tried = [], [], 0
        while len(kept_salt) < count and tried < 4 * count:
            jobs = []
            for i in range(8):
                j = tried + i
                secret = _seed("head-bundled-key", algorithm, j) | (1 << 40)
                base = {"prompt": PROMPTS[j % len(PROMPTS)], "seed": _seed("head-bundled", algorithm, j), "pair": j}
                jobs.append({**base, "key": _key(secret, algorithm, "salt", coin), "salt": salt_for(base["seed"])})
                jobs.append({**base, "key": _key(secret, algorithm, "head", coin)})
            tried += 8
            done = engine_generate(jobs, N)
            for s, h in zip(done[0::2], done[1::2]):
                if len(s["tokens"]) == N and len(h["tokens"]) == N and len(kept_salt) < count:
                    kept_salt.append(s)
                    kept_head.append(h)
        facts[algorithm] = {"tried_pairs": tried, "kept_pairs": len(kept_salt),
                            "generation_s": round(time.perf_counter() - t0, 1)}
        rows[algorithm] = _tpr([d["tokens"] for d in kept_salt], [d["key"] for d in kept_salt],
                               [d["tokens"] for d in kept_head], [d["key"] for d in kept_head], 8192,
                               "bundled " + algorithm)
    return {"source": "bundled target + draft, CPU, T = 1", "rows": rows, "generation": facts}


def binomial_interval(n: int, p: float) -> tuple[int, int]:
    """The central 95 % interval [lo, hi] of Binomial(n, p): lo the largest count with
    P(X < lo) <= 0.025, hi the smallest with P(X > hi) <= 0.025 (exact pmf, log space)."""
    def pmf(k: int) -> float:
        return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                        + k * math.log(p) + (n - k) * math.log1p(-p))

    lo, below = 0, 0.0
    while below + pmf(lo) <= 0.025:
        below += pmf(lo)
        lo += 1
    hi, above = n, 0.0
    while above + pmf(hi) <= 0.025:
        above += pmf(hi)
        hi -= 1
    return lo, hi


def _simes(pairs: list[tuple[float, float]]) -> float:
    """Weighted Simes over [(log10 p, weight)] (weights summing to W): min over k of
    p_(k) / W_k, the components ordered by p / weight and W_k their first k weights' sum
    (log10; with one component, its p / weight). Exact under independence; what the
    components' dependence leaves of Bonferroni's slack (``null``'s offline comparison)."""
    ordered = sorted(pairs, key=lambda pw: pw[0] - math.log10(pw[1]))
    best, cumulative = 0.0, 0.0
    for log10_p, weight in ordered:
        cumulative += weight
        best = min(best, log10_p - math.log10(cumulative))
    return best


def run_null(total: int) -> dict:
    """Also counts, per key kind, each component of the verdict alone at its Bonferroni share
    (detector.config.weights) and the global p (the components' weighted Bonferroni), and the
    same texts' p under weighted Simes over the whole-text components (offline: what the
    Bonferroni's slack is)."""
    from detector.config import weights
    from detector.detect import DetectorConfig, detect
    from detector.result import Candidate, salted_candidates

    rng = np.random.default_rng(30)
    config = DetectorConfig()
    hits6 = hits3 = hits2 = 0
    smallest = 0.0
    levels = (-2, -3, -4)
    kinds = {"gumbel": weights(config, True), "dual_key_gumbel": weights(config, True, dual_auto=True)}
    components = {kind: {f"{name}@1e{level}": 0 for name in (*share, "simes_whole_text") for level in levels}
                  | {"texts": 0} for kind, share in kinds.items()}
    started = time.perf_counter()
    for i in range(total):
        algorithm = "gumbel" if i % 2 == 0 else "dual_key_gumbel"
        key = _key(int(rng.integers(1, 2**63)), algorithm, "head")
        candidates = salted_candidates([Candidate.inline(key)])
        assert len(candidates) == 1
        result = detect(rng.integers(0, 8192, N), candidates, config)
        lp = result.log10_p_value
        hits6 += lp <= -6
        hits3 += lp <= -3
        hits2 += lp <= -2
        smallest = min(smallest, lp)
        entry, share, row = result.per_key[0], kinds[algorithm], components[algorithm]
        alone = {"sum": entry.log10_p_sum, "trgof": entry.log10_p_trgof, "weighted": entry.log10_p_weighted,
                 "spans": min((s.log10_p_value for s in result.spans), default=0.0)}
        whole = [(alone[name], share[name]) for name in share if name != "spans"]
        simes = min(_simes(whole), alone["spans"] - math.log10(share["spans"]))
        row["texts"] += 1
        for level in levels:
            for name in share:
                row[f"{name}@1e{level}"] += alone[name] - math.log10(share[name]) <= level
            row[f"simes_whole_text@1e{level}"] += simes <= level
        if (i + 1) % 20000 == 0:
            print({"tests": i + 1, "fp6": hits6, "fp3": hits3, "fp2": hits2, "s": round(time.perf_counter() - started)},
                  flush=True)
    return {"tests": total, "fp6": int(hits6), "fp3": int(hits3), "fp2": int(hits2),
            "interval95_at_1e-3": binomial_interval(total, 1e-3),
            "interval95_at_1e-2": binomial_interval(total, 1e-2),
            "smallest_log10_p": smallest, "seconds": round(time.perf_counter() - started, 1),
            "components": {kind: {k: int(v) for k, v in row.items()} for kind, row in components.items()},
            "components_note": "each component alone at its Bonferroni share (p / weight <= level); the spans' "
                               "p as reported (only spans that passed are reported); simes_whole_text: weighted "
                               "Simes over the whole-text components, Bonferroni with the spans (offline only)"}


def run_head_cost(count: int, which: str = "gumbel") -> dict:
    """The head's own cost, paired: the same synthetic texts (deterministic keys of kind
    ``which``, :data:`SYNTHETIC_KEYS`; 20 % substitution) scored in full and without their first
    w positions (a spec with dedup scope `all`, which skips the padded contexts: what a `head`
    key's detection scores). Unlike ``synthetic``, whose head and salted texts differ (other
    keys' draws), this isolates the w positions: the part of the head-vs-known-salt gap that
    the scheme itself costs."""
    from bench import robustness
    from bench.robustness import attack
    from detector.detect import DetectorConfig, detect
    from detector.result import Candidate
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    algorithm, coin = SYNTHETIC_KEYS[which]
    label = "" if which == "gumbel" else f" {which}"  # gumbel: the seeds of the first run

    def spec(dedup: str = "single_turn") -> WatermarkSpec:
        return WatermarkSpec(algorithm=algorithm, coin=coin, dedup=dedup)

    keys = [WatermarkKey(_seed("head-cost" + label, i) | (1 << 40), spec()) for i in range(count)]
    texts = robustness.generate(keys, N, robustness.SIGMAS[1.7], seed=_seed("head-cost-gen" + label))
    config = DetectorConfig()
    rng = np.random.default_rng(_seed("head-cost-attack" + label))
    from detector import scoring
    from detector.detect import statistic_for

    full, skipped = [], []
    head_scores, rest_scores = [], []
    width = spec().context_width
    for text, key in zip(texts, keys):
        edited = attack(text, "substitution", 0.2, rng, robustness.VOCAB)
        full.append(detect(edited, [Candidate.inline(key)], config).log10_p_value)
        skipping = WatermarkKey(key.secret, spec("all"))
        skipped.append(detect(edited, [Candidate.inline(skipping)], config).log10_p_value)
        # Where the head's evidence sits: the per-token scores (the verdict's statistic) of the
        # first w positions against the rest. Under substitution at rate r a position keeps its
        # watermark only if its token and the non-padding part of its context survive:
        # (1 - r)^(i + 1) for position i < w, (1 - r)^(w + 1) after, so the head's positions
        # carry more than their share of what an edited text keeps.
        scored = scoring.scored_positions(np.asarray(edited), width, "single_turn")
        per_token = scoring.token_scores(key, scored, statistic_for(Candidate.inline(key), config))
        head_scores.append(per_token[scored.positions < width])
        rest_scores.append(per_token[scored.positions >= width])
    full, skipped = np.array(full), np.array(skipped)
    survive = [(1 - 0.2) ** (i + 1) for i in range(width)] + [(1 - 0.2) ** (width + 1)] * (N - width)
    return {"keys": f"{algorithm} {coin} coin", "texts": count,
            "mean_score_first_w": round(float(np.mean(np.concatenate(head_scores))), 4),
            "mean_score_after_first_w": round(float(np.mean(np.concatenate(rest_scores))), 4),
            "first_w_share_of_intact_positions_expected": round(sum(survive[:width]) / sum(survive), 4),
            "first_w_share_of_positions": round(width / N, 4),
            "passing_with_first_w_only": int(np.sum((full <= LEVEL) & (skipped > LEVEL))),
            "passing_without_first_w_only": int(np.sum((full > LEVEL) & (skipped <= LEVEL))),
            "tpr6_all_positions": float(np.mean(full <= LEVEL)),
            "tpr6_without_first_w": float(np.mean(skipped <= LEVEL)),
            "median_log10_p_all": float(np.median(full)), "median_log10_p_without_first_w": float(np.median(skipped)),
            "mean_log10_p_lost": float(np.mean(skipped - full))}


def run_spans_share(count: int, shares: tuple[float, ...] = (0.25, 0.05)) -> dict:
    """What the spans' share costs where spans matter and gains where they do not (the
    ``null --spans-share`` what-if's other side): synthetic `gumbel` and keyed-coin dual texts
    (200 tokens, 1.7 nats/token, deterministic keys), (a) inside 400 + 400 uniform tokens
    (bench.robustness's ``mixing``) and (b) with 20 % substitution, detected (default config)
    under each spans share in turn, same texts and edits: TPR at 1e-6."""
    import detector.config
    import detector.verdict
    from bench import robustness
    from bench.robustness import attack
    from detector.detect import DetectorConfig, detect
    from detector.result import Candidate
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    config = DetectorConfig()
    shipped = detector.config.SPANS_SHARE
    out = {}
    for which in ("gumbel", "keyed"):
        algorithm, coin = SYNTHETIC_KEYS[which]
        keys = [WatermarkKey(_seed("spans-share", which, i) | (1 << 40), WatermarkSpec(algorithm=algorithm, coin=coin))
                for i in range(count)]
        texts = robustness.generate(keys, N, robustness.SIGMAS[1.7], seed=_seed("spans-share-gen", which))
        for kind, rate in (("mixing", 0.0), ("substitution", 0.2)):
            rng = np.random.default_rng(_seed("spans-share-attack", which, kind))
            edited = [attack(t, kind, rate, rng, robustness.VOCAB) for t in texts]
            row = {}
            for share in shares:
                detector.config.SPANS_SHARE = detector.verdict.SPANS_SHARE = share
                try:
                    p = np.array([detect(e, [Candidate.inline(k)], config).log10_p_value for e, k in zip(edited, keys)])
                finally:
                    detector.config.SPANS_SHARE = detector.verdict.SPANS_SHARE = shipped
                row[f"spans_share_{share:g}"] = {"tpr6": float(np.mean(p <= LEVEL)), "median_log10_p": float(np.median(p))}
            out[f"{which} {kind}"] = row
            print(which, kind, row, flush=True)
    return {"texts": count, "rows": out}


def _shared_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run_regenerations(prompts: int, generations: int, tokens: int) -> dict:
    key = _key(_seed("head-regen-key") | (1 << 40), "gumbel", "head")
    jobs = [{"prompt": PROMPTS[p], "seed": None, "key": key, "p": p} for p in range(prompts) for _ in range(generations)]
    t0 = time.perf_counter()
    done = engine_generate(jobs, tokens)
    per_prompt = []
    for p in range(prompts):
        texts = [d for d in done if d["p"] == p]
        per_prompt.append({"prompt": PROMPTS[p], **diversity_metrics([d["tokens"] for d in texts]),
                           "distinct": len({tuple(d["tokens"]) for d in texts}),
                           "first_w_distinct": len({tuple(d["tokens"][:4]) for d in texts}),
                           "longest_shared_prefix_chars": max(_shared_prefix(a["text"], b["text"])
                                                              for i, a in enumerate(texts) for b in texts[i + 1:]),
                           "texts": [d["text"] for d in texts]})
    rows = per_prompt
    return {"prompts": prompts, "generations": generations, "tokens": tokens, "temperature": 1.0,
            "generation_s": round(time.perf_counter() - t0, 1),
            "prompts_all_distinct": sum(r["distinct"] == generations for r in rows),
            "prompts_shared_prefix_le_20": sum(r["longest_shared_prefix_chars"] <= 20 for r in rows),
            "mean_distinct_3grams": float(np.mean([r["distinct_3grams"] for r in rows])),
            "mean_self_bleu": float(np.mean([r["self_bleu"] for r in rows])), "per_prompt": per_prompt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=["synthetic", "bundled", "null", "regenerations", "head-cost", "spans-share"])
    parser.add_argument("--texts", type=int, default=None)
    parser.add_argument("--keys", default="gumbel,dual,keyed", help="synthetic: which of gumbel, dual, keyed")
    parser.add_argument("--replicate", type=int, default=0, help="synthetic: another draw of keys, logits, edits")
    parser.add_argument("--null", type=int, default=100_000)
    parser.add_argument("--spans-share", type=float, default=None,
                        help="null: what-if, the verdict's spans share (detector.config.SPANS_SHARE, 0.25) "
                             "set to this in this process only")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    meta = _meta(args.part)
    meta["command"] = meta["command"].replace("bench.diversity ", "bench.diversity_head ")
    if args.part == "synthetic":
        payload = run_synthetic(args.texts or 1000, args.keys.split(","), args.replicate)
    elif args.part == "bundled":
        payload = run_bundled(args.texts or 48)
    elif args.part == "null":
        import detector.config
        import detector.verdict

        if args.spans_share is not None:  # a what-if: the shipped weights are detector.config's
            detector.config.SPANS_SHARE = detector.verdict.SPANS_SHARE = args.spans_share
        payload = run_null(args.null)
        payload["spans_share"] = detector.config.SPANS_SHARE
    elif args.part == "spans-share":
        payload = run_spans_share(args.texts or 500)
    elif args.part == "head-cost":
        payload = run_head_cost(args.texts or 1000, args.keys if args.keys in SYNTHETIC_KEYS else "gumbel")
    else:
        payload = run_regenerations(args.prompts, args.generations, args.tokens)
    suffix = (f"-{args.keys.replace(',', '-')}" + (f"-replicate{args.replicate}" if args.replicate else "")
              if args.part == "synthetic" else f"-{args.keys}" if args.part == "head-cost" and args.keys in
              ("dual", "keyed") else "")
    if args.part == "null" and args.spans_share is not None:
        suffix = f"-spans-share-{args.spans_share:g}"
    path = RESULTS / f"diversity-head-{args.part}{suffix}.json"
    path.write_text(json.dumps({"meta": meta, **payload}, indent=1) + "\n")
    print("wrote", path, flush=True)


if __name__ == "__main__":
    main()
