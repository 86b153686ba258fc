"""Spoofing at scale: how often does 30 days of a tier's allowance turn a human text into a
"watermarked" one? (issue 31's goal: at most 1 %.)

    .venv/bin/python -m bench.spoof_scale [--seconds 1200] [--days 30] [--out FILE]

The probe guard answers a text's family 3 times a day (per tenant; on the public tier once
for every caller together), so 30 days buy at most 90 answers about one text, each of them
what the tier shows: the tenant tier's p rounded up to a power of ten at or below its
threshold and the band ``p > threshold`` above it (since run 3), the public tier's verdict and band. This bench gives the attacker exactly that: bench.oracle_attack's ratchet
(per round 5 random token changes, kept when the tier's signal rose), 3 x --days rounds, on a
human text (a licence paragraph of >= 205 tokens, each attempt its own), the answers computed
by the gateway's expert tier over HTTP and cut down to the tier's view by the gateway's own
``service.access.shape`` (the guard, whose refusals would end the attempt at its 4th query on
one day, is left out: this is the month's allowance, not one day's). Success: the expert
tier's verdict on the final text at the default threshold. Attempts alternate between the
tenant's and the public view until --seconds have passed. With no success in n attempts,
the one-sided 95 % upper bound on the success rate is 1 - 0.05^(1/n) (about 3/n).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

import httpx

from bench.gateway import cpu_gateway
from bench.oracle_attack import MODEL, Editor, Oracle, _provision, blind_fraction, spoof, strip
from service.access import shape


class ViewOracle:
    """The expert tier's full answer, shown as ``view`` (tenant or public) shows it."""

    def __init__(self, client: httpx.Client, view: str) -> None:
        self.client, self.view, self.queries = client, view, 0

    def ask(self, text: str) -> dict:
        self.queries += 1
        full = detect(self.client, text)
        if self.view == "tenant":
            shown = shape.tenant_answer(full, evidence=False)
            return {"refused": None, "watermarked": bool(shown["watermarked"]), "ledger": "ledger" in shown["basis"],
                    # Above the threshold the tenant tier shows one band, no p (issue 31, run 3).
                    "signal": -float(shown["log10_p_value"] if shown["log10_p_value"] is not None else 0.0),
                    "scores": None}
        shown = shape.public_answer(full, tokens=int(full.get("total_tokens") or 0), min_tokens=200,
                                    provider="bench", attributed=set())
        return {"refused": None, "watermarked": shown["verdict"] == "watermarked", "ledger": "ledger" in shown["basis"],
                "signal": {"none": 0, "moderate": 1, "strong": 2}[shown["confidence"]], "scores": None}


def detect(client: httpx.Client, text: str) -> dict:
    r = client.post("/v1/detect", json={"text": text})
    while r.status_code == 429:  # a per-minute limit only slows the attacker down
        time.sleep(float(r.headers.get("Retry-After", "1")))
        r = client.post("/v1/detect", json={"text": text})
    r.raise_for_status()
    return r.json()


def upper_bound(successes: int, n: int) -> float | None:
    """One-sided 95 % upper bound on a success rate (Clopper-Pearson: the rate at which seeing
    at most ``successes`` in ``n`` has probability 5 %), by bisection."""
    if n == 0:
        return None

    def at_most(rate: float) -> float:
        return sum(math.comb(n, k) * rate ** k * (1 - rate) ** (n - k) for k in range(successes + 1))

    low, high = successes / n, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if at_most(mid) > 0.05 else (low, mid)
    return high


def texts_from(tokenizer, offset: int, pydoc_pages: bool) -> list[str]:
    """Human texts of >= 205 tokens: licence paragraphs of 170 words (from word ``offset``:
    another run's paragraphs shifted by half a paragraph), then pydoc pages of the standard
    library if asked (the demo model's own domain, so the spoofer's easiest case)."""
    words = []
    for path in sorted(Path("/usr/share/common-licenses").iterdir()):
        if path.is_file():
            words += path.read_text(errors="ignore").split()
    chunks = [" ".join(words[i:i + 170]) for i in range(offset, len(words) - 170, 170)]
    if pydoc_pages:
        import importlib
        import pydoc

        for name in ("json", "argparse", "random", "tempfile", "os", "re", "string", "textwrap", "shutil",
                     "pathlib", "subprocess", "threading", "collections", "itertools", "functools", "logging",
                     "datetime", "decimal", "fractions", "statistics", "csv", "sqlite3", "socket", "email",
                     "http.client", "urllib.parse", "zipfile", "tarfile", "gzip", "hashlib", "hmac", "heapq"):
            page = pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext).split()
            chunks += [" ".join(page[i:i + 170]) for i in range(0, len(page) - 170, 170)]
    return [c for c in chunks if len(tokenizer(c, add_special_tokens=False)["input_ids"]) >= 205]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1200)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--per-day", type=int, default=3)
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--out", type=Path, default=Path("bench/results/spoof-scale.json"))
    parser.add_argument("--views", default="tenant,public")
    parser.add_argument("--offset", type=int, default=0, help="licence paragraphs from this word (0 or 85)")
    parser.add_argument("--pydoc", action="store_true", help="pydoc pages of the standard library too")
    parser.add_argument("--strip", action="store_true",
                        help="strip instead: the tenant's generations, 3 x --days answers of each view against "
                             "the blind attacker's share of tokens changed (ground truth, 40 rounds)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from service.model_paths import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MODEL))
    editor = Editor(tokenizer, random.Random(args.seed))
    texts = texts_from(tokenizer, args.offset, args.pydoc)
    views = args.views.split(",")
    rounds = args.per_day * args.days
    # The per-minute request rate only slows an attacker down (the month's answers are what is
    # measured): off for the bench's gateway, as for the other benches.
    os.environ["HALLMARK_DETECT_RATE_PER_MINUTE"] = "0"
    started = time.time()
    if args.strip:
        return _strip_main(args, editor, views, rounds, started)
    results = {view: {"attempts": 0, "successes": 0, "best_signal": [], "queries_of_successes": []}
               for view in views}
    with cpu_gateway(_provision, MODEL) as (server, tokens):
        client = httpx.Client(base_url=server.url, timeout=120,
                              headers={"Authorization": f"Bearer {tokens['expert']}"})
        i, begun = 0, time.time()
        while time.time() - begun < args.seconds and i < len(texts):
            view = views[i % len(views)]
            oracle = ViewOracle(client, view)
            outcome = spoof(oracle, editor, texts[i], rounds - 1)  # the first query, then rounds - 1
            truth = detect(client, editor.text(outcome["final_ids"]))
            row = results[view]
            row["attempts"] += 1
            row["successes"] += bool(truth["watermarked"])
            if truth["watermarked"]:
                row["queries_of_successes"].append(outcome["queries"])
            row["best_signal"].append(round(-float(truth["log10_p_value"]), 2))
            print(view, i, outcome["queries"], truth["watermarked"], row["best_signal"][-1], flush=True)
            i += 1
        client.close()
    for row in results.values():
        signals = sorted(row.pop("best_signal"))
        row["final_minus_log10_p"] = {"median": signals[len(signals) // 2] if signals else None,
                                      "max": signals[-1] if signals else None}
        row["success_rate"] = row["successes"] / row["attempts"] if row["attempts"] else None
        row["upper_95"] = upper_bound(row["successes"], row["attempts"])
    total_n = sum(r["attempts"] for r in results.values())
    total_s = sum(r["successes"] for r in results.values())
    out = {"views": results, "both": {"attempts": total_n, "successes": total_s,
                                      "upper_95": upper_bound(total_s, total_n)},
           "texts": len(texts), "queries_per_attempt": rounds, "days": args.days, "per_day": args.per_day,
           "command": " ".join([".venv/bin/python -m bench.spoof_scale", *sys.argv[1:]]),
           "seconds": round(time.time() - started, 1), "load_average_at_end": os.getloadavg(),
           "note": "shared 2-core box; nice'd; answers from the expert tier cut to each view by service.access.shape"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


def _quantile(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 4) if values else None


def _strip_main(args, editor, views: list[str], rounds: int, started: float) -> None:
    """Issue 31's strip goal over a month: a 200-token generation of the tenant's, stripped by
    random 5 % rounds (bench.oracle_attack.strip, no evidence) that stop once the view says
    neither the watermark nor the ledger is a basis, with 3 x --days answers (the probe guard's
    month). Beside it, the blind attacker on the same text: the share of tokens changed at which
    random 5 % rounds first strip it (ground truth). Goal: the share to strip 9 texts in 10 is at
    least the blind attacker's."""
    results = {view: {"attempts": 0, "stripped": 0, "changed": [], "queries": []} for view in views}
    blind: list[float] = []
    with cpu_gateway(_provision, MODEL) as (server, tokens):
        client = httpx.Client(base_url=server.url, timeout=120,
                              headers={"Authorization": f"Bearer {tokens['expert']}"})
        generator = httpx.Client(base_url=server.url, timeout=300,
                                 headers={"Authorization": f"Bearer {tokens['tenant']}"})
        truth = Oracle(server.url, "expert", tokens["expert"])
        i, seed, begun = 0, 0, time.time()
        while time.time() - begun < args.seconds:
            seed += 1
            out = generator.post("/v1/generate", json={"prompt": "Write about the history of the town",
                                                       "max_tokens": 210, "seed": seed, "temperature": 1.0}).json()
            ids = out["token_ids"]
            if len(ids) < 200 or not detect(client, editor.text(ids))["watermarked"]:
                continue
            fraction = blind_fraction(truth, editor, ids, 40)
            if fraction is not None:
                blind.append(fraction)
            view = views[i % len(views)]
            outcome = strip(ViewOracle(client, view), editor, ids, rounds - 1, with_evidence=False)
            final = detect(client, editor.text(outcome["final_ids"]))
            done = not final["watermarked"] and not final.get("basis")
            row = results[view]
            row["attempts"] += 1
            row["stripped"] += done
            if done:
                row["changed"].append(round(outcome["changed"] / outcome["tokens"], 3))
                row["queries"].append(outcome["queries"])
            print(view, i, outcome["queries"], done, fraction, flush=True)
            i += 1
        client.close()
        generator.close()
    blind_90 = _quantile(blind, 0.9)
    for row in results.values():
        changed = sorted(row["changed"])
        row["changed_share_to_strip_90pct"] = _quantile(changed, 0.9) if len(changed) >= 0.9 * row["attempts"] else None
        row["changed_share_median"] = _quantile(changed, 0.5)
        row["queries_max"] = max(row["queries"]) if row["queries"] else None
        row["changed"] = changed
        row["queries"] = sorted(row["queries"])
    out = {"views": results, "blind": {"texts": len(blind), "changed_share_to_strip_90pct": blind_90,
                                       "changed_share_median": _quantile(blind, 0.5), "fractions": sorted(blind)},
           "answers_per_text": rounds, "days": args.days, "per_day": args.per_day,
           "command": " ".join([".venv/bin/python -m bench.spoof_scale", *sys.argv[1:]]),
           "seconds": round(time.time() - started, 1), "load_average_at_end": os.getloadavg(),
           "note": "shared 2-core box; nice'd; answers from the expert tier cut to each view by service.access.shape"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
