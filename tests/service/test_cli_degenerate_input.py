"""Degenerate input to the CLI's detection (issue 25, item 8): empty text, an empty token
list and token ids outside the named model's vocabulary are one-line errors with exit 1, as
the API refuses them; and a --tokenizer that names nothing fails at once, without asking the
Hugging Face hub (it retried for ~23 s before)."""

from __future__ import annotations

import json

import pytest

from tests.service.test_cli_first_hour import fresh_dir, run  # noqa: F401 - the fixture


@pytest.mark.parametrize("argv, message", [
    (["--text", ""], "text is empty: there is nothing to score"),
    (["--text", "  \n "], "text is empty (only whitespace): there is nothing to score"),
    (["--token-ids", "[]"], "token_ids is empty: there is nothing to score"),
    (["--token-ids", "[1, 99999]", "--tokenizer", "bundled"],
     "token_ids[1] = 99999 is outside the model's vocabulary [0, 8192)"),
])
def test_degenerate_input_is_one_line_and_exit_1(monkeypatch, capsys, fresh_dir, argv, message):
    code, out, err = run(monkeypatch, capsys, "detect", "--key", "5", *argv)
    assert code == 1 and out == "", out
    assert len(err.splitlines()) == 1 and message in err, err


def test_an_empty_text_file_is_refused(monkeypatch, capsys, fresh_dir):
    empty = fresh_dir / "empty.txt"
    empty.write_text("")
    code, out, err = run(monkeypatch, capsys, "detect", "--key", "5", "--text-file", str(empty))
    assert code == 1 and out == "" and err == "error: text is empty: there is nothing to score; send the text to check\n"


def test_in_vocabulary_ids_are_still_scored(monkeypatch, capsys, fresh_dir):
    code, out, err = run(monkeypatch, capsys, "detect", "--key", "5", "--token-ids", "[1, 8191]",
                         "--tokenizer", "bundled", "--json")
    assert code == 0, err
    assert json.loads(out)["total_tokens"] == 2


def test_an_empty_token_list_in_a_batch_is_that_lines_error(monkeypatch, capsys, fresh_dir):
    batch = fresh_dir / "batch.jsonl"
    batch.write_text(json.dumps({"token_ids": [], "key": {"secret": "5"}}) + "\n" +
                     json.dumps({"token_ids": [3, 4, 5], "key": {"secret": "5"}}) + "\n")
    code, out, err = run(monkeypatch, capsys, "detect", "--jsonl", str(batch))
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 1 and "1 line(s) failed" in err
    assert lines[0] == {"line": 1, "error": "token_ids is empty: there is nothing to score; send the token ids to check"}
    assert lines[1]["total_tokens"] == 3


def test_a_scan_line_with_empty_text_is_that_lines_error():
    from service.scan.corpus import parse

    assert "text is empty" in parse(1, json.dumps({"text": ""})).error
    assert "token_ids is empty" in parse(2, json.dumps({"token_ids": []})).error
    assert parse(3, json.dumps({"text": "x"})).error is None


def test_an_unknown_tokenizer_name_fails_at_once_without_the_network(monkeypatch, capsys, fresh_dir):
    import socket

    attempts = []

    def connect(self, address, *args):
        attempts.append(address)
        raise OSError("no network in this test")

    def getaddrinfo(host, *args, **kwargs):
        attempts.append(host)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    code, out, err = run(monkeypatch, capsys, "detect", "--key", "5", "--text", "hello there",
                         "--tokenizer", "someword")
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert "cannot load tokenizer 'someword': no such directory, bundled model or Hugging Face model in the " \
           "local cache" in err and "--tokenizer bundled" in err
    assert attempts == []  # before: the hub client's HEAD requests, retried for ~23 s
