"""`head` diversity (watermark.head): a `diverse` key never salted, whose first w tokens come
unwatermarked from the request's stream; specs from before the field still read as `salt`;
the first w tokens of a generation carry no watermark and every later one does; unseeded
generations of one prompt differ while a seed reproduces one; detection tests one key and is
calibrated on null text like any single key, into the far tail."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from detector.detect import DetectorConfig, detect
from detector.result import Candidate, salted_candidates
from keys.lifecycle import build_spec
from tests.stats_helpers import binomial_two_sided_p
from tests.synthetic import generate
from watermark import dispatch, sampler, stream
from watermark.dedup import ContextDeduper
from watermark.head import head_tokens
from watermark.key import WatermarkKey
from watermark.results import ROUTE_PLAIN
from watermark.spec import WatermarkSpec

HEAD = {"gumbel": WatermarkSpec(mode="diverse", diversity="head", dedup="all"),
        "dual_key_gumbel": WatermarkSpec(algorithm="dual_key_gumbel", coin="keyed", mode="diverse",
                                         diversity="head", dedup="all")}


def test_a_spec_without_the_field_is_the_salt_scheme_and_reads_back_unchanged():
    old = {"algorithm": "gumbel", "context_width": 4, "alpha": 0.1, "dedup": "single_turn",
           "dedup_max_history": 8192, "prf": "philox4x32-10-v1", "coin": "ordinary", "mode": "diverse"}
    spec = WatermarkSpec.model_validate(old)
    assert spec.diversity == "salt" and spec.salted and spec.public_dict() == old
    head = HEAD["gumbel"]
    assert not head.salted and head.public_dict()["diversity"] == "head"
    assert WatermarkSpec.model_validate(head.public_dict()) == head
    assert not WatermarkSpec().salted and "diversity" not in WatermarkSpec().public_dict()


def test_head_needs_mode_diverse_and_dedup_all():
    with pytest.raises(ValueError, match="mode 'diverse'"):
        WatermarkSpec(diversity="head", dedup="all")
    with pytest.raises(ValueError, match="deduplicate_contexts 'all'"):
        WatermarkSpec(mode="diverse", diversity="head")


def test_vllm_can_run_a_head_key_but_not_a_salted_one():
    # Scope `all` already samples the padded contexts without the watermark in vLLM: the same text.
    assert HEAD["gumbel"].to_vllm()["deduplicate_contexts"] == "all"
    with pytest.raises(ValueError, match="per-generation salt"):
        WatermarkSpec(mode="diverse").to_vllm()


def test_new_keys_get_head_a_named_scope_gets_salt_and_a_rotation_keeps_the_scheme():
    new = build_spec()
    assert (new.mode, new.diversity, new.dedup) == ("diverse", "head", "all")
    named = build_spec(dedup="single_turn")
    assert (named.mode, named.diversity) == ("diverse", "salt")
    assert build_spec(named, alpha=0.2).diversity == "salt"  # an old diverse key's rotation keeps salts
    assert build_spec(new, alpha=0.2).diversity == "head"
    assert build_spec(new, dedup="none").diversity == "salt"  # a named scope other than all rules head out
    assert build_spec(WatermarkSpec(), mode="diverse").diversity == "salt"  # its single_turn scope stays
    assert build_spec(WatermarkSpec(), mode="diverse", dedup="all").diversity == "head"
    assert build_spec(mode="deterministic").diversity == "salt" and not build_spec(mode="deterministic").salted
    assert build_spec(new, mode="deterministic").public_dict().get("diversity") is None  # keeps dedup all


def test_a_head_key_takes_no_salt_and_is_one_candidate():
    key = WatermarkKey(0xC0FFEE, HEAD["dual_key_gumbel"])
    with pytest.raises(ValueError, match="diversity 'salt'"):
        key.with_salt(3)
    with pytest.raises(ValueError, match="diversity 'salt'"):
        key.salted_keys()
    candidate = Candidate.inline(key)
    assert salted_candidates([candidate]) == [candidate]
    assert head_tokens(key.spec) == key.spec.context_width and head_tokens(WatermarkSpec(mode="diverse")) == 0


@pytest.mark.parametrize("algorithm", sorted(HEAD))
def test_the_first_w_tokens_are_unwatermarked_and_the_rest_watermarked(algorithm):
    key = WatermarkKey(0x4EAD_0000_0000_0001, HEAD[algorithm])
    tokens, routes = generate(key, 60, seed=11)
    w = key.spec.context_width
    assert routes[:w] == [ROUTE_PLAIN] * w
    assert ROUTE_PLAIN not in routes[w:] or len(set(map(tuple, _contexts(tokens, w)))) < len(tokens)
    result = detect(tokens, salted_candidates([Candidate.inline(key)]))
    assert result.watermarked and result.keys_tested == 1


def _contexts(tokens, w):
    padded = [-1] * w + list(tokens)
    return [padded[i:i + w] for i in range(len(tokens))]


def _sample(key: WatermarkKey, seed: int | None, n: int = 24, vocab: int = 300) -> list[int]:
    """n tokens on fixed logits (the same model for every call), the stream from ``seed``
    (None: the OS's randomness, as an unseeded request gets)."""
    gen = torch.Generator().manual_seed(5)
    logits = [torch.randn(1, vocab, generator=gen) * 1.5 for _ in range(n)]
    dedup = ContextDeduper(key.spec.context_width, key.spec.dedup, key.spec.dedup_max_history)
    stream_key = stream.stream_key(seed)
    out = []
    for position in range(n):
        rows = sampler.sampler_rows([key.row_keys()], contexts=[dedup.context], watermark=[not dedup.next_repeated()],
                                    greedy=[False], stream_keys=[stream_key], positions=[position])
        token = int(dispatch.sample(logits[position], rows).tokens[0])
        dedup.push(token)
        out.append(token)
    return out


def test_unseeded_generations_differ_from_the_first_token_and_a_seed_reproduces_one():
    key = WatermarkKey(0x4EAD_0000_0000_0002, HEAD["gumbel"])
    unseeded = [_sample(key, None) for _ in range(6)]
    assert len({tuple(t) for t in unseeded}) == 6
    assert len({tuple(t[:key.spec.context_width]) for t in unseeded}) == 6  # the heads differ already
    assert _sample(key, 1234) == _sample(key, 1234)
    # A deterministic key on the same model repeats one text whatever the stream.
    plain = WatermarkKey(0x4EAD_0000_0000_0002, WatermarkSpec())
    assert len({tuple(_sample(plain, None)) for _ in range(3)}) == 1


NULL_TEXTS = 20_000


@pytest.mark.statistical
@pytest.mark.slow
def test_a_head_key_is_calibrated_on_null_text_into_the_far_tail():
    """P(p <= t) <= t for head keys on uniform null text, checked at 0.1, 0.01 and 1e-3
    against the binomial; in the far tail, where counting cannot reach, the reported p is the
    single-key detector's own (one candidate: no search, no correction; that detector's tail is
    tested against high-precision values in test_stats.py): equal to a deterministic key's
    result on the same secret, spec and text. bench.diversity_head null counts 100,000."""
    rng = np.random.default_rng(3030)
    config = DetectorConfig()
    p_values = np.empty(NULL_TEXTS)
    for i in range(NULL_TEXTS):
        algorithm = "gumbel" if i % 2 else "dual_key_gumbel"
        key = WatermarkKey(int(rng.integers(1, 2**63)), HEAD[algorithm])
        tokens = rng.integers(0, 5000, int(rng.integers(30, 300)))
        result = detect(tokens, salted_candidates([Candidate.inline(key)]), config)
        p_values[i] = result.p_value
        if i % 1000 == 0:
            twin = WatermarkKey(key.secret, key.spec.model_copy(update={"mode": "deterministic", "diversity": "salt"}))
            assert result.log10_p_value == detect(tokens, [Candidate.inline(twin)], config).log10_p_value
    for level in (0.1, 0.01, 1e-3):
        hits = int(np.sum(p_values <= level))
        assert hits <= NULL_TEXTS * level or binomial_two_sided_p(hits, NULL_TEXTS, level) > 1e-3, (level, hits)
    assert int(np.sum(p_values <= 1e-4)) <= 8  # expected <= 2; 8 or more has probability < 1e-3
    assert math.isfinite(float(np.min(p_values)))
