"""The closed sets of values CLI options take, as ``Literal`` types: Typer lists them in
``--help`` and refuses anything else with a usage error naming them.

Free of pydantic and of the domain, so that ``hallmark --help`` stays light; a test
(tests/service/test_cli_help.py) checks that each equals the domain's own type.
"""

from __future__ import annotations

from typing import Literal

Algorithm = Literal["gumbel", "dual_key_gumbel"]  # watermark.spec.Algorithm
DedupScope = Literal["none", "single_turn", "all"]  # watermark.spec.DedupScope
CoinKind = Literal["ordinary", "keyed"]  # watermark.spec.CoinKind
Mode = Literal["diverse", "deterministic"]  # watermark.spec.Mode
DualStatistic = Literal["auto", "max", "weighted", "routed"]  # detector.detect.DualStatistic
