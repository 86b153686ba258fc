"""Chi-square and proportion tests for the statistical test suite (mpmath for the tails)."""

from __future__ import annotations

import math

import mpmath
import numpy as np


def chi_square_p(observed: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness-of-fit p-value; categories with tiny expectation pooled."""
    observed = np.asarray(observed, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    total = observed.sum()
    expected = probs * total
    big = expected >= min_expected
    obs = list(observed[big])
    exp = list(expected[big])
    if (~big).any():
        obs.append(observed[~big].sum())
        exp.append(expected[~big].sum())
    obs, exp = np.array(obs), np.array(exp)
    mask = exp > 0
    if (obs[~mask] > 0).any():
        return 0.0
    stat = float(((obs[mask] - exp[mask]) ** 2 / exp[mask]).sum())
    dof = int(mask.sum()) - 1
    return float(mpmath.gammainc(dof / 2.0, stat / 2.0, mpmath.inf, regularized=True))


def two_proportion_z(successes_a: int, n_a: int, successes_b: int, n_b: int) -> float:
    """Two-sided p-value of equal proportions."""
    pooled = (successes_a + successes_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        return 1.0
    z = (successes_a / n_a - successes_b / n_b) / se
    return math.erfc(abs(z) / math.sqrt(2))


def binomial_two_sided_p(k: int, n: int, p: float) -> float:
    """Normal-approximation two-sided p of k successes in n at rate p (n p >= 10 here)."""
    sd = math.sqrt(n * p * (1 - p))
    return math.erfc(abs(k - n * p) / sd / math.sqrt(2))
