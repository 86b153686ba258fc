"""Every command's `--help` says what its options take (issue 25, item 9): flags show no
value (`--json <bool>` was shown, and `--json true` refused), options with a closed set of
values list it and refuse others, and every option has a help text. Run through the real
command line (`python -m service.cli`, what the console script calls)."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import get_args

import pytest
import typer

from service.cli import app


def hallmark(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True, timeout=120)


def _commands() -> list[tuple[list[str], object]]:
    found = []

    def walk(command, names: list[str]) -> None:
        subs = getattr(command, "commands", {})
        if not subs:
            found.append((names, command))
        for name, sub in subs.items():
            walk(sub, names + [name])

    walk(typer.main.get_command(app), [])
    return found


COMMANDS = _commands()


def test_the_command_tree_is_all_there():
    names = {" ".join(n) for n, _ in COMMANDS}
    assert {"detect", "keys create", "keys rotate", "keys import", "serve", "quickstart", "doctor"} <= names
    assert len(names) >= 30


@pytest.mark.parametrize("names", [n for n, _ in COMMANDS], ids=[" ".join(n) for n, _ in COMMANDS])
def test_help_shows_no_value_for_flags_and_describes_every_option(names):
    command = dict((" ".join(n), c) for n, c in COMMANDS)[" ".join(names)]
    run = hallmark(*names, "--help")
    assert run.returncode == 0, run.stderr
    assert "<bool>" not in run.stdout
    for param in command.params:
        if param.param_type_name != "option" or param.hidden:
            continue
        assert param.help, f"hallmark {' '.join(names)} {param.opts[0]} has no help text"
        if param.is_flag:  # shown bare: `--json`, `--spans / --no-spans`
            line = next(line for line in run.stdout.splitlines() if line.strip().startswith(param.opts[0]))
            assert not re.search(re.escape(param.opts[0]) + r" <", line), line


@pytest.mark.parametrize("names, option, choices", [
    (["keys", "create"], "--algorithm", ["gumbel", "dual_key_gumbel"]),
    (["keys", "create"], "--dedup", ["none", "single_turn", "all"]),
    (["keys", "create"], "--coin", ["ordinary", "keyed"]),
    (["keys", "rotate"], "--algorithm", ["gumbel", "dual_key_gumbel"]),
    (["keys", "import"], "--coin", ["ordinary", "keyed"]),
    (["detect"], "--algorithm", ["gumbel", "dual_key_gumbel"]),
    (["detect"], "--dedup", ["none", "single_turn", "all"]),
    (["detect"], "--coin", ["ordinary", "keyed"]),
    (["detect"], "--statistic", ["auto", "max", "weighted", "routed"]),
])
def test_closed_sets_are_listed_and_enforced(names, option, choices):
    shown = hallmark(*names, "--help").stdout
    assert f"{option} <{'|'.join(choices)}>" in shown
    refused = hallmark(*names, option, "nosuch")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        f"Error: Invalid value for '{option}': 'nosuch' is not one of {', '.join(repr(c) for c in choices)}.")


def test_the_cli_choices_are_the_domains_own():
    from detector.detect import DualStatistic
    from service.cli import choices
    from watermark.spec import Algorithm, CoinKind, DedupScope

    assert get_args(choices.Algorithm) == get_args(Algorithm)
    assert get_args(choices.DedupScope) == get_args(DedupScope)
    assert get_args(choices.CoinKind) == get_args(CoinKind)
    assert get_args(choices.DualStatistic) == get_args(DualStatistic)


def test_a_flag_takes_no_value():
    """`--json true` stays a usage error (flags take no value); the help no longer says otherwise."""
    run = hallmark("doctor", "--json", "true")
    assert run.returncode == 2 and "Got unexpected extra argument(s) (true)" in run.stderr
    assert re.search(r"^\s+--json\s+Print", hallmark("doctor", "--help").stdout, re.MULTILINE)
