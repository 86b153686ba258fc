"""Reading keys that come from elsewhere: a secret file, or a vLLM watermark config.

Nothing here echoes what it reads: a malformed secret is reported by file name only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from keys.errors import InvalidInput
from watermark import prf
from watermark.spec import WatermarkSpec
from watermark.validation import summary

_DECIMAL = re.compile(r"[0-9]{1,78}")
_HEX = re.compile(r"0[xX][0-9a-fA-F]{1,64}")
# vLLM's own config file nests the watermark settings under this option name.
_NESTED_NAMES = ("watermark_config", "watermark-config")


def parse_secret(text: str, *, source: str, bits: int = 256) -> int:
    """A secret of at most ``bits`` bits (64 or 256) written in decimal or 0x hex (surrounding
    whitespace ignored). The key's own size is checked against its spec's PRF on import."""
    token = text.strip() if isinstance(text, str) else ""
    if _DECIMAL.fullmatch(token):
        value = int(token, 10)
    elif _HEX.fullmatch(token):
        value = int(token, 16)
    else:
        raise InvalidInput(f"{source} does not hold a key (a decimal or 0x-hex integer of at most {bits} bits)")
    try:
        return prf.check_key(value, bits)
    except ValueError:
        raise InvalidInput(f"the key in {source} is not in [0, 2**{bits} - 1]") from None


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"the {what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise InvalidInput(f"cannot read the {what} {path}: {reason}") from None


def read_secret_file(path: Path | str) -> int:
    path = Path(path)
    return parse_secret(_read(path, "secret file"), source=f"the secret file {path}")


def read_vllm_config(path: Path | str) -> tuple[int, WatermarkSpec]:
    """(secret, spec) from a JSON or YAML file holding vLLM's ``--watermark-config`` dict
    (key included), either at the top level or under ``watermark_config`` (as in a vLLM
    ``--config`` YAML file)."""
    path = Path(path)
    text = _read(path, "vLLM config file")
    try:
        # JSON is YAML, but a JSON-specific error message is clearer for a .json file.
        data: Any = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError):
        # The parser's message may quote the file, which holds the key: do not repeat it.
        raise InvalidInput(f"the vLLM config file {path} is not valid JSON or YAML") from None
    if isinstance(data, dict):
        for name in _NESTED_NAMES:
            if isinstance(data.get(name), dict):
                data = data[name]
                break
    if not isinstance(data, dict):
        raise InvalidInput(f"the vLLM config file {path} does not hold a watermark config object")
    config = dict(data)
    if "key" not in config:
        raise InvalidInput(f"the vLLM watermark config in {path} has no 'key'")
    raw_key = config.pop("key")
    if isinstance(raw_key, bool) or not isinstance(raw_key, (int, str)):
        raise InvalidInput(f"the 'key' in {path} is not an integer")
    try:
        bits = prf.key_bits(str(config.get("prf", prf.DEFAULT)))
    except ValueError as exc:
        raise InvalidInput(f"the vLLM watermark config in {path}: {exc}") from None
    secret = parse_secret(str(raw_key), source=f"the 'key' of {path}", bits=bits)
    try:
        _, spec = WatermarkSpec.from_vllm({**config, "key": secret})
    except ValidationError as exc:
        raise InvalidInput(f"invalid watermark spec in {path}: {summary(exc, default='spec')}") from None
    except ValueError as exc:
        raise InvalidInput(f"the vLLM watermark config in {path}: {exc}") from None
    return secret, spec
