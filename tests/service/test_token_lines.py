"""`hallmark detect --jsonl`'s fast reading of token-id lines gives json.loads's result,
and every line it cannot vouch for goes through json.loads (same values, same errors)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from service.cli.token_lines import parse_line
from watermark import jit


@pytest.fixture(autouse=True, params=["numpy", "compiled"])
def reading(request, monkeypatch):
    """Every test on both readings of the list: numpy's (before numba is loaded) and the
    compiled pass (service.cli.token_lines_compiled, once it is)."""
    compiled = request.param == "compiled"
    if compiled:
        assert jit.load(), "numba is a dependency"
    monkeypatch.setattr(jit, "loaded", lambda: compiled)
    return request.param

VALID = ['{"token_ids": [1, 2, 3], "key": {"secret": 5}}', '{"key": {"secret": "0x5"}, "token_ids":[0,4294967295]}',
         '{"token_ids": []}', '{"token_ids": [ ]}', '{"token_ids":\n[7,\t8 ,9]}', '{"token_ids": [0]}',
         '{"a": "x", "token_ids": [10, 100, 1000]}']
# Lines json.loads reads differently, refuses, or that only look like a token list.
OTHER = ['{"token_ids": [01, 2]}', '{"token_ids": [1, 2,]}', '{"token_ids": [1,,2]}', '{"token_ids": [1 2]}',
         '{"token_ids": [1.5]}', '{"token_ids": [true]}', '{"token_ids": [-1]}', '{"token_ids": [+1]}',
         '{"token_ids": [1e3]}', '{"token_ids": ["1"]}', '{"token_ids": [[1]]}', '{"token_ids": [1, 2]',
         '{"note": "\\"token_ids\\": [1]", "token_ids": [2]}', '{"x": {"token_ids": [3]}}',
         '{"token_ids": [1], "token_ids": [2]}', '[1, 2]', '{"token_ids": [１]}', '{"token_ids": [1]} x',
         '{"token_ids": [99999999999999999999]}', '{"token_ids": [4294967296]}', '{"token_ids": null}',
         # the key elsewhere in the line, before or after the list (the fast path counts it around the list)
         '{"k": {"token_ids": 1}, "token_ids": [2]}', '{"token_ids": [2], "k": {"token_ids": 1}}',
         '{"name": "token_ids", "token_ids": [3]}', '{"token_ids": [3], "name": "token_ids"}',
         '{"token_ids": [00]}', '{"token_ids": [1, 00]}', '{"token_ids": [0, 0, 10, 100]}', '{"token_ids": [1,\r0]}',
         '{"token_ids": [1,\r01]}', '{"token_ids": [1 ,\t 2\x0b]}', '{"token_ids": [1/2]}', '{"token_ids": [1:2]}',
         '{"token_ids": [1,2 3]}', '{"token_ids": [1 ,2 , ]}', '{"token_ids": [ , 1]}', '{"token_ids": [1,2,,]}',
         '{"token_ids": [,]}', '{"token_ids": [0 ]}', '{"token_ids": [12345678901]}', '{"token_ids": [4294967295, 04]}',
         '{"token_ids": [1,]', '{"token_ids": [é]}', '{"token_ids": [1]}\n', '{"token_ids":[\r\n]}']


def _checked(parse, line: str):
    """A line as the CLI sees it: parsed, then its token-id list checked (the CLI checks a
    list; parse_line's arrays come checked). Errors as (type, message)."""
    from service.cli.watermark_cmds import _token_list

    try:
        item = parse(line)
        if isinstance(item, dict) and isinstance(item.get("token_ids"), list):
            item["token_ids"] = _token_list(item["token_ids"])
    except json.JSONDecodeError:
        return "invalid JSON"
    except ValueError as exc:
        return ("error", str(exc))
    if isinstance(item, dict) and isinstance(item.get("token_ids"), np.ndarray):
        item = {**item, "token_ids": item["token_ids"].tolist()}
    return item


@pytest.mark.parametrize("line", VALID + OTHER)
def test_lines_read_as_json_loads_reads_them(line):
    assert _checked(parse_line, line) == _checked(json.loads, line)


def test_valid_lines_take_the_fast_path():
    for line in VALID:
        assert isinstance(parse_line(line)["token_ids"], np.ndarray)


def test_random_lines_and_a_long_one():
    rng = random.Random(7)
    for _ in range(300):
        ids = [rng.choice([0, 1, 9, 10, 2**32 - 1, rng.randrange(2**32)]) for _ in range(rng.randrange(0, 40))]
        spacing = rng.choice([",", ", ", " ,", ",\n "])
        line = '{"key": {"secret": 1}, "token_ids": [' + spacing.join(map(str, ids)) + "]}"
        got = parse_line(line)
        assert isinstance(got["token_ids"], np.ndarray) and got["token_ids"].tolist() == ids
        assert got["key"] == {"secret": 1}
    long = list(range(0, 200_000, 3))
    assert parse_line(json.dumps({"token_ids": long}))["token_ids"].tolist() == long


def test_random_bodies_read_as_json_loads_reads_them():
    """Random byte strings over the characters a list body may hold, and a few it may not:
    whatever json.loads makes of the line, parse_line makes of it too."""
    rng = random.Random(11)
    alphabet = ["0", "1", "7", "9", ",", " ", "\t", "\n", "\r", "-", ".", "e", "x", "4294967295", "4294967296"]
    for _ in range(3000):
        body = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        line = '{"token_ids": [' + body + '], "key": {"secret": 1}}'
        assert _checked(parse_line, line) == _checked(json.loads, line), line
