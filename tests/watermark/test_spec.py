import pytest
from pydantic import ValidationError

from watermark.key import WatermarkKey, fingerprint
from watermark.spec import WatermarkSpec


def test_defaults_match_vllm_watermark_config():
    spec = WatermarkSpec()
    assert (spec.algorithm, spec.context_width, spec.alpha, spec.dedup, spec.dedup_max_history) == (
        "gumbel", 4, 0.1, "single_turn", 8192)
    assert spec.prf == "philox4x32-10-v1"


def test_vllm_config_imports_as_is():
    key, spec = WatermarkSpec.from_vllm({
        "algorithm": "dual_key_gumbel", "key": 42, "alpha": 0.2, "context_width": None,
        "deduplicate_contexts": "all", "deduplicate_contexts_max_history": None, "prf": "philox",
        "allow_target_only_watermarking": True,
    })
    assert key == 42
    assert spec.algorithm == "dual_key_gumbel" and spec.alpha == 0.2 and spec.context_width == 4
    assert spec.dedup == "all" and spec.dedup_max_history is None
    assert WatermarkSpec.model_validate(spec.to_vllm()) == spec


@pytest.mark.parametrize("field,value", [
    ("context_width", 0), ("context_width", 17), ("context_width", 2.5), ("alpha", -0.1), ("alpha", 1.5),
    ("algorithm", "sbw"), ("dedup", "sometimes"), ("dedup_max_history", 0), ("prf", "hmac"),
])
def test_invalid_fields_rejected(field, value):
    with pytest.raises(ValidationError):
        WatermarkSpec(**{field: value})


def test_keyed_coin_requires_dual_key():
    with pytest.raises(ValidationError, match="dual_key_gumbel"):
        WatermarkSpec(coin="keyed")
    WatermarkSpec(algorithm="dual_key_gumbel", coin="keyed")


def test_vllm_sbw_is_refused_with_a_message():
    with pytest.raises(ValueError, match="unsupported vLLM watermark algorithm"):
        WatermarkSpec.from_vllm({"key": 1, "algorithm": "sbw"})


def test_key_repr_and_fingerprint_do_not_reveal_secret():
    secret = 0x1234_5678_9ABC_DEF0
    key = WatermarkKey(secret)
    text = repr(key) + str(key)
    for form in (str(secret), hex(secret), f"{secret:x}"):
        assert form not in text
    assert len(key.fingerprint) == 6 and key.fingerprint == fingerprint(secret)
    assert fingerprint(secret) != fingerprint(secret + 1)


def test_mode_absent_is_deterministic_and_stored_specs_read_as_before():
    # Every spec written before modes existed (key rows, ledger entries, keyrings) has no
    # "mode": it reads as deterministic and serialises exactly as before.
    old = {"algorithm": "gumbel", "context_width": 4, "alpha": 0.1, "dedup": "single_turn",
           "dedup_max_history": 8192, "prf": "philox4x32-10-v1", "coin": "ordinary"}
    spec = WatermarkSpec.model_validate(old)
    assert spec.mode == "deterministic" and spec.public_dict() == old
    diverse = WatermarkSpec.model_validate({**old, "mode": "diverse"})
    assert diverse.public_dict() == {**old, "mode": "diverse"}
    assert WatermarkSpec.model_validate(diverse.public_dict()) == diverse
    with pytest.raises(ValidationError):
        WatermarkSpec(mode="random")


def test_vllm_keys_are_deterministic_and_a_diverse_spec_has_no_vllm_form():
    _, spec = WatermarkSpec.from_vllm({"key": 42, "algorithm": "dual_key_gumbel"})
    assert spec.mode == "deterministic" and spec.to_vllm()["algorithm"] == "dual_key_gumbel"
    with pytest.raises(ValueError, match="salt"):
        WatermarkSpec(mode="diverse").to_vllm()
