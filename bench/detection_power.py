"""Detection power by simulation; writes bench/results/detection_power.md.

    .venv/bin/python -m bench.detection_power [--trials 400]

Watermarked tokens are simulated exactly, without the PRF: a token's distribution p is a
softmax of N(0, sigma^2) logits over 1000 tokens (sigma = 5 and 8: about 1.7 and 0.9
nats of entropy per token at T = 1, the range of real LLM text), each key's uniforms are fresh i.i.d. draws (what
distinct contexts give), and the token is the Gumbel-max argmax under the key that routes
it. Speculative tokens run the full protocol: a draft q (p's logits plus N(0, 0.8^2)
noise) sampled under key A, an ordinary or keyed coin, a key-B residual or bonus draw.

Tables: null calibration; power at FPR 1e-6 and 1e-12 for n = 50/200/1000 and key-B
shares 0.1-0.5 for each dual-key statistic; the speculative case (share set by the
acceptance rate, keyed coin for `routed`); the cost of testing more keys; localisation.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from detector import scoring, stats
from detector.spans import locate

VOCAB = 1000
SIGMAS = (5.0, 8.0)  # about 1.7 and 0.9 nats of entropy per token at T = 1


def _grid(u):
    """Uniforms on the PRF's 24-bit grid, as float32 then float64 (what scoring sees)."""
    return ((np.floor(u * 2**24) + 1) / (2**24 + 1)).astype(np.float32).astype(np.float64)


def _gumbel_pick(logits, u):
    return np.argmax(logits - np.log(-np.log(u)), axis=-1)


def simulate_tokens(rng, n, share_b, sigma=SIGMAS[0]):
    """Per token (u_A, u_B, coin) of the chosen token, non-speculative dual key."""
    logits = rng.normal(0, sigma, (n, VOCAB))
    ua, ub = _grid(rng.random((n, VOCAB))), _grid(rng.random((n, VOCAB)))
    use_b = rng.random(n) < share_b
    pick = np.where(use_b, _gumbel_pick(logits, ub), _gumbel_pick(logits, ua))
    rows = np.arange(n)
    return ua[rows, pick], ub[rows, pick], _grid(rng.random(n))


def simulate_speculative(rng, n, keyed, sigma=SIGMAS[0]):
    """(u_A, u_B, coin, key-B share) of n tokens from speculative generation, k = 4."""
    k = 4
    out_a, out_b, out_c, routes = [], [], [], []
    while len(out_a) < n:
        target = rng.normal(0, sigma, (k + 1, VOCAB))
        draft = target[:k] + rng.normal(0, 0.8, (k, VOCAB))
        p = np.exp(target - target.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
        q = np.exp(draft - draft.max(1, keepdims=True)); q /= q.sum(1, keepdims=True)
        ua, ub = _grid(rng.random((k + 1, VOCAB))), _grid(rng.random((k + 1, VOCAB)))
        coin = _grid(rng.random(k + 1))  # keyed: recomputable; ordinary: unknown to the detector
        for j in range(k + 1):
            if j < k:
                x = int(_gumbel_pick(np.log(q[j]), ua[j]))
                if coin[j] < p[j, x] / q[j, x]:
                    out_a.append(ua[j, x]); out_b.append(ub[j, x]); routes.append(0)
                    out_c.append(coin[j] if keyed else rng.random())
                    continue
                residual = np.maximum(p[j] - q[j], 0)
            else:
                residual = p[j]
            y = int(np.argmax(residual / -np.log(ub[j])))
            out_a.append(ua[j, y]); out_b.append(ub[j, y]); routes.append(1)
            out_c.append(coin[j] if keyed else rng.random())
            break
    s = slice(0, n)
    return np.array(out_a[s]), np.array(out_b[s]), np.array(out_c[s]), float(np.mean(routes[s]))


def exp_score(u):
    return -np.log1p(-u)


def log10_p(statistic, ua, ub, coin, alpha=0.1):
    n = len(ua)
    if statistic == "single":
        return stats.gamma_log10_sf(float(exp_score(ua).sum()), n)
    if statistic == "max":
        m = np.maximum(ua, ub)
        return stats.gamma_log10_sf(float((-np.log1p(-m) - np.log1p(m)).sum()), n)
    if statistic == "weighted":
        return stats.weighted_gamma_log10_sf(float(((1 - alpha) * exp_score(ua) + alpha * exp_score(ub)).sum()), n, alpha)
    if statistic == "routed":
        # The detector's own routed scores: weighted Šidák with the key-A weight learnt from
        # the earlier tokens (detector.scoring.routed_weights on the recomputed coin).
        ua32, ub32 = ua.astype(np.float32), ub.astype(np.float32)
        w = scoring.routed_weights(ua32, ub32, coin.astype(np.float32))
        return stats.gamma_log10_sf(float(scoring.weighted_max_scores(ua32, ub32, w).sum()), n)
    raise ValueError(statistic)


def power(values, fpr):
    return float(np.mean(np.array(values) <= math.log10(fpr)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--out", default="bench/results/detection_power.md")
    args = parser.parse_args()
    rng = np.random.default_rng(2026)
    lines = ["# Detection power (simulation)", "",
             f"Command: `python -m bench.detection_power --trials {args.trials}`. Token law: softmax of "
             f"N(0, sigma^2) logits over {VOCAB} tokens, sigma in {SIGMAS} (entropy H in nats below); "
             "key uniforms i.i.d. on the 24-bit grid.", ""]

    # Calibration: null texts (uniforms independent of the tokens).
    lines += ["## Null calibration (n = 200, 4000 texts)", "", "| statistic | P(p<0.01) | P(p<0.05) | P(p<0.5) |",
              "|---|---|---|---|"]
    for statistic in ("single", "max", "weighted", "routed"):
        ps = []
        for _ in range(4000):
            ua, ub, c = (_grid(rng.random(200)) for _ in range(3))
            ps.append(10 ** log10_p(statistic, ua, ub, c))
        ps = np.array(ps)
        lines.append(f"| {statistic} | {np.mean(ps < 0.01):.4f} | {np.mean(ps < 0.05):.4f} | {np.mean(ps < 0.5):.4f} |")

    # Power, non-speculative, key-B share 0.1 .. 0.5.
    lines += ["", "## Power, dual key without speculation (share of key-B tokens varies)", "",
              "| H | n | key-B share | statistic | power @1e-6 | power @1e-12 | median log10 p |",
              "|---|---|---|---|---|---|---|"]
    for sigma, entropy in zip(SIGMAS, (1.7, 0.9)):
        for n in (50, 200, 1000):
            trials = args.trials if n < 1000 else max(40, args.trials // 5)
            for share in (0.1, 0.2, 0.3, 0.5):
                samples = [simulate_tokens(rng, n, share, sigma) for _ in range(trials)]
                for statistic in ("max", "weighted"):
                    values = [log10_p(statistic, *s) for s in samples]
                    lines.append(f"| {entropy} | {n} | {share} | {statistic} | {power(values, 1e-6):.3f} | "
                                 f"{power(values, 1e-12):.3f} | {np.median(values):.1f} |")
        for n in (50, 200):
            single = [log10_p("single", *simulate_tokens(rng, n, 0.0, sigma)) for _ in range(args.trials)]
            lines.append(f"| {entropy} | {n} | single key | single | {power(single, 1e-6):.3f} | "
                         f"{power(single, 1e-12):.3f} | {np.median(single):.1f} |")

    # Speculative generation: share of key-B tokens = 1 - (accepted drafts share).
    lines += ["", "## Power under speculative decoding (k = 4)", "",
              "| H | n | coin | key-B share | statistic | power @1e-6 | power @1e-12 | median log10 p |",
              "|---|---|---|---|---|---|---|---|"]
    for sigma, entropy in zip(SIGMAS, (1.7, 0.9)):
        for n in (50, 200):
            for keyed in (False, True):
                samples = [simulate_speculative(rng, n, keyed, sigma) for _ in range(max(60, args.trials // 3))]
                share = np.mean([s[3] for s in samples])
                for statistic in (("max", "weighted", "routed") if keyed else ("max", "weighted")):
                    values = [log10_p(statistic, s[0], s[1], s[2]) for s in samples]
                    lines.append(f"| {entropy} | {n} | {'keyed' if keyed else 'ordinary'} | {share:.2f} | {statistic} | "
                                 f"{power(values, 1e-6):.3f} | {power(values, 1e-12):.3f} | {np.median(values):.1f} |")

    # Multi-key cost: Šidák over m keys shifts log10 p by about log10(m).
    lines += ["", "## Cost of testing more keys (single key text, n = 200, H = 0.9)", "",
              "| keys tested | power @1e-6 | power @1e-12 |", "|---|---|---|"]
    base = [log10_p("single", *simulate_tokens(rng, 200, 0.0, SIGMAS[1])) for _ in range(args.trials)]
    for m in (1, 10, 100, 1000, 10_000):
        adjusted = [stats.log_sidak(v * stats.LN10, m) / stats.LN10 for v in base]
        lines.append(f"| {m} | {power(adjusted, 1e-6):.3f} | {power(adjusted, 1e-12):.3f} |")

    # Localisation: a watermarked stretch of L tokens inside 1000 unwatermarked ones.
    lines += ["", "## Localisation (L watermarked tokens, H = 0.9, at a random place in 1000 + L)", "",
              "| L | found @1e-6 (span overlaps the stretch) | false span outside |", "|---|---|---|"]
    for length in (64, 128, 256):
        found = false = 0
        trials = max(60, args.trials // 3)
        for _ in range(trials):
            start = int(rng.integers(0, 1000))
            ua = _grid(rng.random(1000 + length))
            ua[start:start + length], _, _ = simulate_tokens(rng, length, 0.0, SIGMAS[1])
            hits = locate(np.arange(len(ua)), exp_score(ua), len(ua), min_length=32, family_size_factor=1,
                          log10_threshold=-6, log10_sf=stats.gamma_log10_sf,
                          log10_sf_lower=stats.gamma_log10_sf_lower)
            found += any(h.start < start + length and h.end > start for h in hits)
            false += any(h.end <= start or h.start >= start + length for h in hits)
        lines.append(f"| {length} | {found / trials:.3f} | {false / trials:.3f} |")

    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
