"""Reading keys from secret files and vLLM watermark configs, never echoing them."""

from __future__ import annotations

import json

import pytest

from keys.errors import InvalidInput
from keys.importing import parse_secret, read_secret_file, read_vllm_config
from watermark.spec import WatermarkSpec

SECRET = 0xC0FFEE1234ABCDEF


@pytest.mark.parametrize("text", [str(SECRET), f"0x{SECRET:x}", f"0X{SECRET:X}", f"  {SECRET}\n"])
def test_decimal_and_hex(text):
    assert parse_secret(text, source="test") == SECRET


@pytest.mark.parametrize("text, bits", [("", 256), ("abc", 256), ("-5", 256), ("1.5", 256), ("0x", 256),
                                        ("0x1g", 256), (str(2**256), 256), ("0x1" + "0" * 64, 256),
                                        (str(2**64), 64), ("0x1" + "0" * 16, 64), (f"{SECRET} {SECRET}", 256)])
def test_malformed_secrets_are_refused_without_echo(text, bits):
    with pytest.raises(InvalidInput) as caught:
        parse_secret(text, source="the secret file s.txt", bits=bits)
    message = caught.value.user_message
    assert "s.txt" in message
    if len(text.strip()) > 3:  # shorter inputs ("abc", "0x") occur in any sentence
        assert text.strip() not in message


def test_256_bit_secrets_parse():
    assert parse_secret(str(2**256 - 1), source="test") == 2**256 - 1
    assert parse_secret("0x" + "f" * 64, source="test") == 2**256 - 1


def test_secret_file(tmp_path):
    (tmp_path / "s").write_text(f"0x{SECRET:016x}\n")
    assert read_secret_file(tmp_path / "s") == SECRET
    with pytest.raises(InvalidInput, match="does not exist"):
        read_secret_file(tmp_path / "missing")


VLLM = {"key": SECRET, "algorithm": "dual_key_gumbel", "context_width": 3, "alpha": 0.2,
        "deduplicate_contexts": "all", "deduplicate_contexts_max_history": None, "prf": "philox",
        "allow_target_only_watermarking": True}


def test_vllm_config_json(tmp_path):
    path = tmp_path / "wm.json"
    path.write_text(json.dumps(VLLM))
    secret, spec = read_vllm_config(path)
    assert secret == SECRET
    assert spec == WatermarkSpec(algorithm="dual_key_gumbel", context_width=3, alpha=0.2, dedup="all",
                                 dedup_max_history=None)


def test_vllm_config_yaml_nested_under_watermark_config_with_a_hex_key(tmp_path):
    path = tmp_path / "vllm.yaml"
    path.write_text(f"model: deepseek-ai/DeepSeek-V3.2\ntensor_parallel_size: 8\nwatermark_config:\n"
                    f"  key: '0x{SECRET:x}'\n  algorithm: gumbel\n  context_width: 5\n")
    secret, spec = read_vllm_config(path)
    assert secret == SECRET and spec.algorithm == "gumbel" and spec.context_width == 5


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON or YAML"),
    ('{"algorithm": "gumbel"}', "has no 'key'"),
    ('[1, 2]', "does not hold a watermark config"),
    (f'{{"key": {SECRET}, "algorithm": "kgw"}}', "unsupported vLLM watermark algorithm"),
    (f'{{"key": {SECRET}, "context_width": 0}}', "context_width"),
    (f'{{"key": {SECRET}, "bogus": 1}}', "bogus"),
    ('{"key": -3}', "does not hold a key .* at most 64 bits"),
    ('{"key": true}', "not an integer"),
    (f'{{"key": {2**64}}}', r"not in \[0, 2\*\*64 - 1\]"),
    (f'{{"key": {2**256}, "prf": "hmac_sha256"}}', r"not in \[0, 2\*\*256 - 1\]"),
    (f'{{"key": {SECRET}, "prf": "sha1"}}', "unknown prf"),
])
def test_bad_vllm_configs(tmp_path, content, message):
    path = tmp_path / "wm.json"
    path.write_text(content)
    with pytest.raises(InvalidInput, match=message) as caught:
        read_vllm_config(path)
    assert str(SECRET) not in caught.value.user_message and "\n" not in caught.value.user_message


def test_a_broken_yaml_file_is_not_quoted(tmp_path):
    path = tmp_path / "wm.yaml"
    path.write_text(f"key: {SECRET}\nalgorithm: [gumbel\n")
    with pytest.raises(InvalidInput) as caught:
        read_vllm_config(path)
    assert str(SECRET) not in caught.value.user_message
