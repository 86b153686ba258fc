"""Where the underline of a generation pasted into human prose starts and ends; writes
bench/results/span-boundaries.md and .json.

    nice -n 10 .venv/bin/python -m bench.span_boundaries [--texts 24]

The local engine on CPU (bundled models, the service's own engine and tokenizer) generates
``--texts`` texts of up to 160 tokens at T = 1 per key kind (a `gumbel` key, not
speculative; a `dual_key_gumbel` key with an ordinary coin, speculative), each under its own
key (random, seeded), from bench.robustness's prompts. Each text, unedited or with 3, 8 or 16
of its words replaced (alphabetic words over 3 letters, away from its first and last eighth,
by common words), is pasted between two of six human paragraphs (every ordered pair of
neighbours: 6 placements), tokenised with the model's tokenizer and detected with the
default config (spans on, `auto`). For each watermarked result its longest span's character
offsets are compared with the pasted text's: how many start and end within 10 characters,
and how many run more than 10 characters into the human text before or after.

"before" is span refinement as it was (Kadane cut halfway between 1 and the grid window's
mean, no context), kept here as :func:`_refine_before`; "after" is
:func:`detector.spans.refine`. Both run on the same texts in the same process; verdicts and
p-values are compared too (refinement moves offsets only).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
import zlib
from pathlib import Path

import numpy as np

from bench.robustness import PROMPTS
from detector import spans as spans_module
from detector.detect import DetectorConfig, detect
from detector.forms import with_span_chars
from detector.result import Candidate
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

RESULTS = Path(__file__).resolve().parent / "results"
LENGTH = 160
EDITS = (0, 3, 8, 16)
TOLERANCE = 10
HUMANS = (
    "The committee met on Tuesday to review the budget. After a long discussion about the new library's opening "
    "hours, the parking situation near the station and the cost of repairing the roof, they agreed to postpone the "
    "decision until the next quarter, when more data would be available to everyone involved. Several members "
    "asked for a written summary before then.",
    "My grandmother kept a garden behind the house, and every summer she grew more tomatoes than the family could "
    "possibly eat. We carried baskets of them to the neighbours, who smiled politely and then, I suspect, passed "
    "them on to their own neighbours in turn.",
    "When the train finally pulled into the station it was nearly midnight, and the platform was empty except for "
    "a man selling coffee from a small cart. I bought a cup, mostly to keep my hands warm, and walked the four "
    "blocks to the hotel through a light, persistent rain.",
    "Our quarterly results were better than expected. Revenue grew by eleven percent, driven mainly by the new "
    "subscription plans, while costs stayed roughly flat. We expect the second half of the year to be slower, as "
    "several large contracts come up for renewal in the autumn.",
    "To replace the filter, first switch off the unit at the wall and wait a few minutes for the fan to stop. Open "
    "the front panel by pressing the two tabs at the bottom, slide the old filter out, and check the housing for "
    "dust before you insert the new one with the arrow pointing up.",
    "She had not expected the letter to be so short. Three lines, no greeting, and a signature she barely "
    "recognised after all these years. She read it twice at the kitchen table, folded it back into its envelope "
    "and put it in the drawer with the spare keys and the old photographs.",
)


def _refine_before(hits, positions, scores, total, *, context_width=0):
    """Span refinement before this change (for comparison): Kadane within the hit extended
    by half its length, cut halfway between 1 and the grid window's mean; no context."""
    out = []
    for hit in hits:
        length = hit.end - hit.start
        lo_pos, hi_pos = max(0, hit.start - length // 2), min(total, hit.end + length // 2)
        lo, hi = np.searchsorted(positions, [lo_pos, hi_pos], side="left")
        in_lo, in_hi = np.searchsorted(positions, [hit.start, hit.end], side="left")
        if in_hi <= in_lo or hi <= lo:
            out.append(hit)
            continue
        cut = 0.5 * (1.0 + float(scores[in_lo:in_hi].mean()))
        best, best_range, running, run_start = -math.inf, (in_lo, in_hi), 0.0, lo
        for offset, gain in enumerate((scores[lo:hi] - cut).tolist()):
            if running <= 0.0:
                running, run_start = 0.0, lo + offset
            running += gain
            if running > best:
                best, best_range = running, (run_start, lo + offset + 1)
        first, last = best_range
        out.append(spans_module.SpanHit(int(positions[first]), int(positions[last - 1]) + 1, int(last - first),
                                        hit.log10_p_value))
    return spans_module._disjoint(out)


def generate(count: int, algorithm: str) -> list[tuple[WatermarkKey, str]]:
    """``count`` (key, text) pairs of the local engine's output, each under its own key."""
    import asyncio

    from service.engines.base import Finished, GenerationRequest, WatermarkPlan
    from service.engines.local.engine import LocalEngine

    async def run():
        engine = LocalEngine("bundled", "hallmark-tiny-draft", device="cpu", max_batch=16, speculative_k=4)
        await engine.start()
        tokenizer = engine.tokenizer()
        try:
            requests = []
            for index in range(count):
                secret = zlib.crc32(repr(("span-boundaries", algorithm, index)).encode()) | (1 << 40)
                key = WatermarkKey(secret, WatermarkSpec(algorithm=algorithm))
                plan = WatermarkPlan(key=key, key_id="bench", version=1, fingerprint=key.fingerprint)
                requests.append(GenerationRequest(f"s{index}", tuple(tokenizer.encode(PROMPTS[index % len(PROMPTS)])),
                                                  LENGTH, seed=secret, watermark=plan))

            async def one(request):
                async for event in engine.generate(request):
                    if isinstance(event, Finished):
                        return request.watermark.key, event.text

            return await asyncio.gather(*(one(r) for r in requests))
        finally:
            await engine.stop()

    return asyncio.run(run())


def edit(text: str, edits: int, seed: int) -> str:
    rng = random.Random(seed)
    words = text.split(" ")
    eligible = [i for i, w in enumerate(words) if w.strip().isalpha() and len(w) > 3]
    middle = eligible[len(eligible) // 8: len(eligible) * 7 // 8]
    for i in rng.sample(middle, min(edits, len(middle))):
        words[i] = rng.choice(["the", "value", "number", "result", "item"])
    return " ".join(words)


def measure(texts, tokenizer) -> dict:
    """Per variant and edit count: the offsets of the longest span against the paste's."""
    rows: dict[str, dict[int, list]] = {"before": {e: [] for e in EDITS}, "after": {e: [] for e in EDITS}}
    identical = total = 0
    for index, (key, generated) in enumerate(texts):
        candidate = Candidate.inline(key)
        for edits in EDITS:
            pasted = edit(generated, edits, index) if edits else generated
            for h in range(len(HUMANS)):
                before, after = HUMANS[h], HUMANS[(h + 1) % len(HUMANS)]
                text = f"{before} {pasted} {after}"
                start, end = len(before) + 1, len(before) + 1 + len(pasted)
                encoding = tokenizer._tokenizer.encode(text, add_special_tokens=False)
                results = {}
                for variant, refine in (("before", _refine_before), ("after", REFINE_AFTER)):
                    spans_module.refine = refine
                    results[variant] = detect(encoding.ids, [candidate], DetectorConfig())
                spans_module.refine = REFINE_AFTER
                total += 1
                identical += (results["before"].watermarked == results["after"].watermarked
                              and results["before"].log10_p_value == results["after"].log10_p_value)
                for variant, result in results.items():
                    if not (result.watermarked and result.spans):
                        continue
                    span = max(with_span_chars(result, encoding.offsets).spans, key=lambda s: s.char_end - s.char_start)
                    rows[variant][edits].append((span.char_start - start, span.char_end - end))
    return {"rows": rows, "identical": identical, "total": total}


REFINE_AFTER = spans_module.refine


def summary(rows: list) -> dict:
    starts = np.array([r[0] for r in rows]) if rows else np.zeros(0)
    ends = np.array([r[1] for r in rows]) if rows else np.zeros(0)
    ok_start, ok_end = np.abs(starts) <= TOLERANCE, np.abs(ends) <= TOLERANCE
    return {"spans": len(rows), "start_ok": int(ok_start.sum()), "end_ok": int(ok_end.sum()),
            "both_ok": int((ok_start & ok_end).sum()), "into_human_before": int((starts < -TOLERANCE).sum()),
            "into_human_after": int((ends > TOLERANCE).sum()), "starts_late": int((starts > TOLERANCE).sum()),
            "ends_early": int((ends < -TOLERANCE).sum()),
            "median_start": float(np.median(starts)) if rows else None,
            "median_end": float(np.median(ends)) if rows else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=24, help="texts per key kind")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from service.model_paths import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("bundled"))
    began = time.time()
    out = {"texts": args.texts, "length": LENGTH, "tolerance": TOLERANCE, "kinds": {}}
    for algorithm in ("gumbel", "dual_key_gumbel"):
        measured = measure(generate(args.texts, algorithm), tokenizer)
        out["kinds"][algorithm] = {
            "identical_verdicts_and_p": [measured["identical"], measured["total"]],
            "variants": {v: {str(e): summary(r) for e, r in per.items()} for v, per in measured["rows"].items()}}
    out["seconds"] = round(time.time() - began, 1)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "span-boundaries.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# Span boundaries of a generation pasted into human prose", "",
             "`nice -n 10 .venv/bin/python -m bench.span_boundaries --texts "
             f"{args.texts}` ({out['seconds']} s). {args.texts} texts of up to {LENGTH} tokens per key kind, each "
             f"edited (0, 3, 8, 16 words replaced) and pasted between two of six human paragraphs (6 placements). "
             f"Counts are of watermarked results; a boundary is right when within {TOLERANCE} characters of the "
             "paste's. \"into human\": the underline runs more than 10 characters into the human text before "
             "(start) or after (end).", ""]
    for algorithm, kind in out["kinds"].items():
        same, total = kind["identical_verdicts_and_p"]
        lines += [f"## {algorithm}", "", f"Verdict and global p identical before and after: {same} of {total}.", "",
                  "| edits | variant | spans | start ok | end ok | both ok | into human (start) | into human (end) "
                  "| start late | end early | median start | median end |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for edits in EDITS:
            for variant in ("before", "after"):
                s = kind["variants"][variant][str(edits)]
                lines.append(f"| {edits} | {variant} | {s['spans']} | {s['start_ok']} | {s['end_ok']} | {s['both_ok']} "
                             f"| {s['into_human_before']} | {s['into_human_after']} | {s['starts_late']} "
                             f"| {s['ends_early']} | {s['median_start']} | {s['median_end']} |")
        lines.append("")
    (RESULTS / "span-boundaries.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
