"""A fixed set of requests whose tokens are recorded (``vectors/``) and must not change.

Every path the local engine has is exercised: dual-key speculative blocks (deterministic
and `diverse` keys, the keyed coin, context widths 1 and 16, each dedup scope), the plain
single-key path, unwatermarked and greedy rows, top-k and top-p rows (the eager block),
stop strings (taken token by token), a long prompt, EOS kept and different lengths, so
rows finish at different steps and the batch changes under the running blocks.

``bench/engine_parity.py`` records the vectors on a GPU and checks a tree against them;
``test_token_parity.py`` checks the CPU vectors.
"""

from __future__ import annotations

from service.engines.base import Finished, GenerationRequest, WatermarkPlan, finish_all
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

PROMPTS = ("The function returns", "Return a new list of the items", "This module provides",
           "If the argument is", "Raise an error when")
LONG_PROMPT = "Return a new list of the items in the sequence, in order. " * 6


def _plan(secret: int, salt: int | None = None, **spec) -> WatermarkPlan:
    key = WatermarkKey(secret, WatermarkSpec(**spec)).with_salt(salt)
    return WatermarkPlan(key=key, key_id=f"parity{secret}", version=1, fingerprint=key.fingerprint)


def parity_requests(tok, tokens: int = 48, extra_dual: int = 0) -> list[GenerationRequest]:
    """The recorded request set; ``extra_dual`` more dual-key requests (distinct keys and
    seeds) fill larger batch buckets on a GPU."""
    dual = dict(algorithm="dual_key_gumbel")
    cases = [
        dict(watermark=_plan(11, **dual)),
        dict(watermark=_plan(12, salt=7, mode="diverse", **dual)),
        dict(watermark=_plan(13, coin="keyed", **dual)),
        dict(watermark=_plan(14, context_width=1, dedup="all", **dual)),
        dict(watermark=_plan(15, context_width=16, dedup="none", **dual)),
        dict(watermark=_plan(16, dedup_max_history=8, **dual)),
        dict(watermark=_plan(17, algorithm="gumbel")),
        dict(watermark=_plan(18, algorithm="gumbel", context_width=2, dedup="all")),
        dict(watermark=None),
        dict(watermark=_plan(19, **dual), temperature=0.7),
        dict(watermark=_plan(20, **dual), temperature=0.0),
        dict(watermark=_plan(21, **dual), top_k=40),
        dict(watermark=_plan(22, **dual), top_p=0.9),
        dict(watermark=_plan(23, **dual), stop=(" the",)),
        dict(watermark=_plan(24, **dual), prompt=LONG_PROMPT),
        dict(watermark=None, temperature=1.3),
    ]
    cases += [dict(watermark=_plan(100 + i, **dual)) for i in range(extra_dual)]
    out = []
    for i, case in enumerate(cases):
        prompt = case.pop("prompt", PROMPTS[i % len(PROMPTS)])
        # Different lengths: rows leave the batch at different steps.
        out.append(GenerationRequest(f"parity{i}", tuple(tok.encode(prompt)), tokens - 3 * (i % 8), seed=500 + i,
                                     **case))
    return out


def outputs(finished: list[Finished]) -> list[dict]:
    """What is recorded per request: tokens, text, why it ended, its route counts."""
    return [{"token_ids": list(f.token_ids), "text": f.text, "finish_reason": f.finish_reason,
             "routes": [f.routes.key_a, f.routes.key_b, f.routes.plain, f.routes.greedy]} for f in finished]


async def run_parity(engine, tokens: int = 48, extra_dual: int = 0) -> list[dict]:
    """The request set run together (rows join as one batch and leave as they finish)."""
    return outputs(await finish_all(engine, parity_requests(engine.tokenizer(), tokens, extra_dual)))
