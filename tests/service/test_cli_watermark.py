"""`hallmark prf` and `hallmark detect` through the real command line."""

import json
import subprocess
import sys

import pytest

from tests.synthetic import generate
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


def hallmark(*args, stdin=None, env=None):
    return subprocess.run([sys.executable, "-m", "service.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=300, env=env)


def test_prf_golden_vectors_and_line_errors(philox_golden, tmp_path):
    cases = philox_golden["cases"][:20]
    lines = [json.dumps({"key": c["key"], "context": c["context"], "tokens": c["tokens"]}) for c in cases]
    lines.insert(3, "{not json")
    lines.insert(7, json.dumps({"key": "-5", "context": [1], "tokens": [1]}))
    lines.insert(9, json.dumps({"key": "5", "context": [], "tokens": [1]}))
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    run = hallmark("prf", "--jsonl", str(path))
    assert run.returncode != 0 and run.stderr.strip().startswith("error:")
    out = [json.loads(line) for line in run.stdout.splitlines()]
    errors = [o for o in out if "error" in o]
    assert [e["line"] for e in errors] == [4, 8, 10]
    good = [o for o in out if "error" not in o]
    assert [o["words"] for o in good] == [c["words"] for c in cases]
    assert [o["uniforms"] for o in good] == [c["uniforms"] for c in cases]


def test_detect_inline_key_from_file(tmp_path):
    key = WatermarkKey(2**63 + 7, WatermarkSpec(algorithm="dual_key_gumbel"))
    tokens, _ = generate(key, 120, seed=2)
    key_file = tmp_path / "key"
    key_file.write_text(str(key.secret))
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps(tokens))
    run = hallmark("detect", "--token-ids-file", str(ids), "--key-file", str(key_file),
                   "--algorithm", "dual_key_gumbel", "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["watermarked"] and result["log10_p_value"] < -6
    assert str(key.secret) not in run.stdout + run.stderr
    wrong = hallmark("detect", "--token-ids", json.dumps(tokens), "--key", "12345", "--algorithm",
                     "dual_key_gumbel", "--json")
    assert not json.loads(wrong.stdout)["watermarked"]


def test_detect_jsonl_batch_streams_and_reports_bad_lines(tmp_path):
    key = WatermarkKey(99, WatermarkSpec())
    tokens, _ = generate(key, 100, seed=4)
    lines = [
        json.dumps({"token_ids": tokens, "key": {"secret": "99", "algorithm": "gumbel", "context_width": 4}}),
        json.dumps({"token_ids": tokens, "key": {"secret": "98"}}),
        json.dumps({"token_ids": [1, 2], "key": {"secret": "1", "context_width": 40}}),
        json.dumps({"token_ids": "nope", "key": {"secret": "1"}}),
        json.dumps({"key": {"secret": "1"}}),
    ]
    run = hallmark("detect", "--jsonl", "-", stdin="\n".join(lines) + "\n")
    assert run.returncode != 0
    out = [json.loads(line) for line in run.stdout.splitlines()]
    assert out[0]["watermarked"] and not out[1]["watermarked"]
    assert [o.get("line") for o in out[2:]] == [3, 4, 5]
    assert "context_width" in out[2]["error"]


@pytest.mark.parametrize("args,needle", [
    (["detect", "--token-ids", "[1,2]", "--key", "5", "--context-width", "0"], "context_width"),
    (["detect", "--token-ids", "[1,2]", "--key", str(2**64)], "2**64"),
    (["detect", "--token-ids", "[1,2]"], "give a key"),
    (["detect", "--token-ids", "[1,-2]", "--key", "3"], "token ids"),
    (["detect", "--key", "3"], "exactly one input"),
    (["detect", "--token-ids", "[1]", "--key", "3", "--threshold", "2"], "threshold"),
])
def test_detect_bad_input_one_line(args, needle):
    run = hallmark(*args)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]


def test_detect_unknown_algorithm_is_a_usage_error_naming_the_choices():
    """--algorithm is a choice (listed in --help): a wrong value is a usage error, as a port
    out of range is (before: a one-line spec error after the inputs were read)."""
    run = hallmark("detect", "--token-ids", "[1,2]", "--key", "5", "--algorithm", "sbw")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    error = run.stderr.strip().splitlines()[-1]
    assert error == "Error: Invalid value for '--algorithm': 'sbw' is not one of 'gumbel', 'dual_key_gumbel'."


def test_prf_key_forms_are_those_of_key_import(tmp_path):
    """The CLI reads a secret as keys.importing.parse_secret does (decimal, leading zeros
    allowed, or 0x hex; a JSON integer too), and refuses Python literal forms that int(x, 0)
    would take (0o, 0b, underscores, a sign) without echoing them."""
    accepted = ["10", "010", "0xA", "0Xa", 10]
    refused = ["0o12", "0b1010", "1_0", "+10", True, "0x" + "1" * 17]
    lines = [json.dumps({"key": k, "context": [1, 2, 3, 4], "tokens": [5, 6]}) for k in accepted + refused]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    run = hallmark("prf", "--jsonl", str(path))
    out = [json.loads(line) for line in run.stdout.splitlines()]
    words = {json.dumps(o["words"]) for o in out[:len(accepted)]}
    assert len(words) == 1 and all("error" not in o for o in out[:len(accepted)]), out
    assert all("error" in o for o in out[len(accepted):]), out
    for o, k in zip(out[len(accepted):], refused):
        assert str(k) not in o["error"] or len(str(k)) <= 4
    assert run.returncode != 0


def test_detect_text_says_what_normalisation_changed_without_json():
    # The JSON result has `normalization`; the one-line answer must say it too, or a user
    # reading it cannot tell that the text was altered before it was scored.
    run = hallmark("detect", "--text", "Hel\u200blo w\u043erld,  here\r\n", "--tokenizer", "bundled", "--key", "5")
    assert run.returncode == 0, run.stderr
    line = run.stdout.strip()
    assert "normalised" in line and "1 zero_width" in line and "1 homoglyph" in line and "1 line_endings" in line
    assert "scored" in line
    plain = hallmark("detect", "--text", "Hello world", "--tokenizer", "bundled", "--key", "5")
    assert "normalised" not in plain.stdout
