"""`head` diversity: a `diverse` key whose regenerations differ without a salt.

Gumbel-max sampling under a PRF keyed by (key, the last w generated tokens) is a function of
the prompt: the same prompt gives the same text. The first `diverse` scheme (`salt`,
:mod:`watermark.salt`) draws one of 16 salted secrets per generation, so a detector that does
not know the salt (no ledger) tests 16 keys and pays log10(16) = 1.2 in p; at 1e-6 with 20 %
of 200 tokens substituted that cost 0.13-0.15 of TPR (docs/benchmarks.md, "Diverse keys: head
against salt").

The `head` scheme puts the randomness where the detector reads it back for free: in the text.
A generation's first ``context_width`` tokens, whose contexts still hold padding, are sampled
without the watermark from the request's own random stream (seeded: reproducible; unseeded:
the OS's randomness), exactly dedup scope `all`'s rule (and vLLM's), which is why the scheme
needs that scope. Every later token's context holds those random tokens or tokens drawn after
them, so two generations of one prompt differ from their first token on (as often as
unwatermarked sampling's first w tokens differ), and the key is never salted: a detector
scores the text under one key, with no search and no multiple-testing correction, whatever
was edited. The cost is the watermark on w tokens per generation (4 of 200 by default: 0.03 to
0.05 of TPR in the same bench), and regenerations whose w head tokens coincide repeat one text
(the model's own probability of repeating w tokens: none in 20 prompts x 6 regenerations of
the bundled model, bench/results/diversity-head-regenerations.json).

A detector skips nothing for it: the head's padded contexts are scored like any others (it
cannot know where a generation starts), and being unwatermarked they only add null scores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the spec needs pydantic, which GPU-only images may lack
    from watermark.spec import WatermarkSpec


def head_tokens(spec: "WatermarkSpec") -> int:
    """How many tokens a generation under ``spec`` starts with sampled without the
    watermark by this scheme: ``context_width`` for a `head`-diverse key, else 0 (dedup
    scope `all` skips them for any key; this counts only what the scheme relies on)."""
    return spec.context_width if spec.mode == "diverse" and spec.diversity == "head" else 0
