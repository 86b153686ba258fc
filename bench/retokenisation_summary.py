"""Item 1's table from bench.retokenisation's and bench.retokenisation_repair's JSONs, batches
pooled (the same conditions over disjoint seeds), with paired 95 % intervals.

    .venv/bin/python -m bench.retokenisation_summary \
        --texts retokenisation-bundled.json retokenisation-bundled-from288.json \
        --repair retokenisation-repair-incremental.json retokenisation-repair-from288-incremental.json

"lost" = TPR by the generation's ids minus TPR as text (the service's forms, then forms + the
repair at eps 0.05); in brackets the texts passing by ids only / as text only, then Newcombe's
hybrid score interval (method 10) for a paired difference of proportions.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

from bench.diversity import RESULTS


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return centre - half, centre + half


def newcombe(both: int, first_only: int, second_only: int, neither: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % interval of p1 - p2 for paired binary outcomes (Newcombe 1998, method 10)."""
    a, b, c, d = both, first_only, second_only, neither
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n, z)
    l2, u2 = wilson(a + c, n, z)
    denominator = (a + b) * (c + d) * (a + c) * (b + d)
    numerator = a * d - b * c
    phi = 0.0 if denominator == 0 else (max(numerator - n / 2, 0) if numerator > 0 else numerator) / math.sqrt(
        denominator)
    lower = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    upper = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return p1 - p2 - lower, p1 - p2 + upper


def cell(ids: np.ndarray, text: np.ndarray, level: float) -> str:
    a = int(np.sum((ids <= level) & (text <= level)))
    b = int(np.sum((ids <= level) & (text > level)))
    c = int(np.sum((ids > level) & (text <= level)))
    lo, hi = newcombe(a, b, c, len(ids) - a - b - c)
    return f"{(b - c) / len(ids):+.3f} ({b}/{c}) [{lo:+.3f}, {hi:+.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", nargs="+", required=True)
    parser.add_argument("--repair", nargs="*", default=[])
    parser.add_argument("--eps", default="0.05")
    args = parser.parse_args()
    texts = [json.loads((RESULTS / name).read_text()) for name in args.texts]
    repairs = [json.loads((RESULTS / name).read_text()) for name in args.repair]
    print("| T | condition | texts | ids TPR 1e-6 / 1e-3 | lost 1e-6, forms | lost 1e-6, forms + repair "
          "| lost 1e-3, forms | lost 1e-3, forms + repair |")
    print("|---|---|---|---|---|---|---|---|")
    for temperature, rows in texts[0]["rows"].items():
        for condition, row in rows.items():
            if not isinstance(row, dict) or "log10_p" not in row:
                continue
            ids = np.concatenate([t["rows"][temperature][condition]["log10_p"]["ids"] for t in texts])
            forms = np.concatenate([t["rows"][temperature][condition]["log10_p"]["text_forms_runs_merged"]
                                    for t in texts])
            repaired = (np.concatenate([r["rows"][temperature][condition][f"eps_{args.eps}_log10_p"] for r in repairs])
                        if repairs else None)
            cells = [cell(ids, forms, -6), cell(ids, repaired, -6) if repaired is not None else "-",
                     cell(ids, forms, -3), cell(ids, repaired, -3) if repaired is not None else "-"]
            print(f"| {temperature} | {condition} | {len(ids)} | {np.mean(ids <= -6):.3f} / {np.mean(ids <= -3):.3f} | "
                  + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
