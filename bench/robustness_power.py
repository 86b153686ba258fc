"""Where the power goes in issue 11's dual-key cell (20 % substitution, 1.7 nats, TPR at 1e-6).

    nice -n 10 .venv/bin/python -m bench.robustness_power [--texts 200] [--sim 4000]

Writes bench/results/robustness-power.md. numpy only.

Part 1, the benchmark's own texts (bench/robustness.py's generator, seeds and attack, so the
same 200 texts as its cell): each component of the default `auto` test for an ordinary-coin
dual key, alone and uncorrected (its exact p <= 1e-6), and the weighted-Bonferroni
combinations of them (the split before and after this work; spans as in `detect`). A
component's TPR alone is an upper bound for any combination that contains it.

Part 2, the Neyman-Pearson simulator of bench/robustness_bound.py (its language model and
attack; its own draws): tests that know more than a detector can, to separate the causes of
the gap between the weighted sum and the NP bound. All are sums over tokens of one per-token
score g(s_A, s_B) treated as independent across tokens, plus the NP test itself:

* the weighted sum (what `auto` mostly rests on here; exact null);
* the per-token likelihood ratio with the true density f (knows the language model's law);
* the sparse mixture ln(1 - eps + eps LR) with the true f and eps (also knows the edit rate:
  the share of tokens that keep the watermark, 0.8^5 = 0.33, or a smaller plug-in);
* the NP test, which also uses how edits kill runs of w + 1 tokens (the hidden Markov chain).

Null of the oracle sums: the per-token score on a 2,500 x 2,500 grid of null quantiles of
(s_A, s_B), rounded up to a lattice of step 0.002 (the statistic is the lattice sum, the same
rounding for the null and the texts), n-fold convolution by FFT; the grid is a quadrature of
the null law (numerical error about ±0.01 in TPR), fine for attributing power, not a
detector. Monte Carlo error of a TPR: ±0.007 at 4,000 texts.
"""

from __future__ import annotations

import argparse
import math
import time
import zlib
from pathlib import Path

import numpy as np

from bench import robustness_bound as rb
from bench.robustness import SIGMAS, WIDTH, attack, generate
from detector import scoring, spans, stats, trgof
from detector.detect import _log10_sf, _log10_sf_lower
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

RESULTS = Path(__file__).resolve().parent / "results"
NATS, RATE, ALPHA, N = 1.7, 0.2, 0.1, 200
SPLITS = {
    "`auto` before (max .3, weighted .3, Tr-GoF on max .15, spans max 1/8 + weighted 1/8)":
        {"max": 0.3, "weighted": 0.3, "trgof_max": 0.15, "spans_max": 0.125, "spans_weighted": 0.125},
    "`auto` now (weighted .45, max .15, Tr-GoF on weighted Šidák .15, spans weighted 3/16 + max 1/16)":
        {"max": 0.15, "weighted": 0.45, "trgof_sidak": 0.15, "spans_max": 0.0625, "spans_weighted": 0.1875},
}
NAMES = {"max": "`max` sum", "weighted": "`weighted` sum", "sidak": "weighted Šidák sum (w = 0.9)",
         "trgof_max": "Tr-GoF on `max` scores", "trgof_sidak": "Tr-GoF on weighted Šidák scores",
         "spans_max": "spans on `max` (windows-corrected)", "spans_weighted": "spans on `weighted` (windows-corrected)"}


def _best_span(positions, scores, total, statistic) -> float:
    hits = spans.locate(positions, scores, total, min_length=32, family_size_factor=1, log10_threshold=0.0,
                        log10_sf=_log10_sf(statistic, ALPHA), log10_sf_lower=_log10_sf_lower(statistic, ALPHA))
    return min([h.log10_p_value for h in hits], default=0.0)


def bench_components(texts_per_cell: int) -> dict[str, np.ndarray]:
    """log10 p [texts] of every component on the benchmark's texts of the cell."""
    spec = WatermarkSpec(algorithm="dual_key_gumbel", context_width=WIDTH)
    keys = [WatermarkKey(0x5EED_0000 + 7919 * i + (1 << 40) * int(NATS * 10), spec) for i in range(texts_per_cell)]
    texts = generate(keys, N, SIGMAS[NATS], seed=int(NATS * 100))
    rng = np.random.default_rng(zlib.crc32(repr(("substitution", RATE, NATS, "dual_key_gumbel")).encode()))
    out: dict[str, list[float]] = {name: [] for name in NAMES}
    for text, key in zip((attack(t, "substitution", RATE, rng) for t in texts), keys):
        tokens = np.asarray(text, dtype=np.int64)
        scored = scoring.scored_positions(tokens, WIDTH, spec.dedup)
        parts = scoring.dual_scores(key, scored)
        n = len(parts.max)
        out["max"].append(stats.gamma_log10_sf(float(parts.max.sum()), n))
        out["weighted"].append(stats.weighted_gamma_log10_sf(float(parts.weighted.sum()), n, ALPHA))
        out["sidak"].append(stats.gamma_log10_sf(float(parts.weighted_sidak.sum()), n))
        out["trgof_max"].append(trgof.log10_pvalue(parts.max))
        out["trgof_sidak"].append(trgof.log10_pvalue(parts.weighted_sidak))
        out["spans_max"].append(_best_span(scored.positions, parts.max, len(tokens), "max"))
        out["spans_weighted"].append(_best_span(scored.positions, parts.weighted, len(tokens), "weighted"))
    return {name: np.array(values) for name, values in out.items()}


def _lattice_power(null_values: np.ndarray, observed: np.ndarray, level: float, step: float = 0.002) -> float:
    """TPR at ``level`` of the sum over N tokens of a per-token score: null law = equal-weight
    atoms ``null_values``; both sides rounded up to the lattice (one statistic)."""
    low = float(null_values.min())
    pmf = np.bincount(np.ceil((null_values - low) / step).astype(np.int64)).astype(np.float64)
    pmf /= pmf.sum()
    length = 1 << int(math.ceil(math.log2(len(pmf) * N + 1)))
    law = np.maximum(np.fft.irfft(np.fft.rfft(pmf, length) ** N, length), 0.0)
    tail = np.cumsum(law[::-1])[::-1]
    critical = int(np.searchsorted(-tail, -level))
    sums = np.ceil((np.maximum(observed, low) - low) / step).astype(np.int64).sum(axis=1)
    return float(np.mean(sums >= critical))


def simulator(texts: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    law = rb.TokenLaw(rb.SIGMAS[NATS], 500, rng)
    hit = rng.random((texts, N)) < RATE
    dead = hit.copy()
    for k in range(1, WIDTH + 1):
        dead[:, k:] |= hit[:, :-k]
    s_a, s_b = rb.sample_marked(law, True, rng, (texts, N))
    s_a = np.where(dead, rng.exponential(size=(texts, N)), s_a)
    s_b = np.where(dead, rng.exponential(size=(texts, N)), s_b)
    out = {"surviving share": float(1.0 - dead.mean())}
    weighted = ((1 - ALPHA) * s_a + ALPHA * s_b).sum(axis=1)
    out["weighted sum (exact null)"] = float(np.mean([stats.weighted_gamma_log10_sf(float(x), N, ALPHA) <= -6
                                                      for x in weighted]))
    quantiles = -np.log1p(-(np.arange(2500) + 0.5) / 2500)
    g_a, g_b = np.repeat(quantiles, 2500), np.tile(quantiles, 2500)

    def log_lr(a, b):
        return rb.token_log_ratio(law, True, a, b)

    out["likelihood-ratio sum, true f (knows the language model)"] = _lattice_power(log_lr(g_a, g_b), log_lr(s_a, s_b), 1e-6)
    for eps in (0.33, 0.2):
        def mix(a, b, e=eps):
            return np.log1p(e * np.expm1(log_lr(a, b)))
        out[f"sparse mixture, true f, eps = {eps} (knows the model and the edit rate)"] = _lattice_power(
            mix(g_a, g_b), mix(s_a, s_b), 1e-6)
    out["NP test (also uses the edits' run structure)"] = rb.np_power(
        rb.substitution_log_ratio(rb.token_log_ratio(law, True, s_a, s_b), RATE), 1e-6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--sim", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", default=str(RESULTS / "robustness-power.md"))
    args = parser.parse_args()
    started = time.perf_counter()
    comps = bench_components(args.texts)
    sim = simulator(args.sim, args.seed)
    elapsed = time.perf_counter() - started
    command = (f"nice -n 10 .venv/bin/python -m bench.robustness_power --texts {args.texts} --sim {args.sim} "
               f"--seed {args.seed}")
    lines = ["# Where the power goes: 20 % substitution, 1.7 nats, dual key (issue 11's goal 0.80)", "",
             f"Command: `{command}` ({elapsed:.0f} s, numpy only). Method: module docstring of "
             "`bench/robustness_power.py`.", "",
             f"## The benchmark's {args.texts} texts of the cell: each component alone (exact p <= 1e-6, no correction)", "",
             "| component | TPR at 1e-6 alone | median log10 p |", "|---|---|---|"]
    for name, label in NAMES.items():
        lines.append(f"| {label} | {np.mean(comps[name] <= -6):.3f} | {np.median(comps[name]):.2f} |")
    best = np.min(np.stack([comps[k] for k in NAMES]), axis=0)
    lines += [f"| best component per text, uncorrected (not a valid test; an upper bound for any combination "
              f"of these) | {np.mean(best <= -6):.3f} | |", "",
              "Weighted Bonferroni combinations of the same p-values (each component's p divided by its weight; "
              "the components of `detect`'s default for an ordinary-coin dual key):", "",
              "| combination | TPR at 1e-6 |", "|---|---|"]
    for label, split in SPLITS.items():
        combined = np.min(np.stack([np.minimum(comps[k], 0.0) - math.log10(w) for k, w in split.items()]), axis=0)
        lines.append(f"| {label} | {np.mean(combined <= -6):.3f} |")
    lines += ["", f"## The Neyman-Pearson simulator ({args.sim} texts, seed {args.seed}): what knowing more buys", "",
              f"Share of tokens that keep the watermark: {sim.pop('surviving share'):.3f}.", "",
              "| test | TPR at 1e-6 |", "|---|---|"]
    lines += [f"| {name} | {value:.3f} |" for name, value in sim.items()]
    lines += ["", "Reading: a detector without the language model's law cannot build the true-f statistics; "
              "among tests that treat tokens as independent, even with that knowledge, no per-token sum we "
              "tried reached more than the sparse mixture with the true f and edit rate; the rest of the gap "
              "to the NP bound is the edits' run structure (used together with the known f and edit rate).", ""]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
