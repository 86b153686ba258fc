"""Settings as docs/reference/configuration.md states them (issue 25, noticed beside it): `HALLMARK_DRAFT_MODEL=`
(empty) disables speculation, while other empty variables keep their defaults; `hallmark
doctor` names a rule across settings instead of printing "HALLMARK_:"."""

from __future__ import annotations

import pytest

from service.settings import ServiceSettings
from tests.service.test_cli_first_hour import fresh_dir, run  # noqa: F401 - the fixture


def test_an_empty_draft_model_disables_speculation(monkeypatch, fresh_dir):
    assert ServiceSettings().draft_model == "hallmark-tiny-draft"
    monkeypatch.setenv("HALLMARK_DRAFT_MODEL", "")
    assert ServiceSettings().draft_model is None
    # An explicit value still wins over the environment, as for every setting.
    assert ServiceSettings(draft_model="hallmark-tiny-draft").draft_model == "hallmark-tiny-draft"
    monkeypatch.setenv("HALLMARK_DRAFT_MODEL", "hallmark-tiny-draft")
    assert ServiceSettings().draft_model == "hallmark-tiny-draft"


def test_the_local_engine_then_runs_without_a_draft(monkeypatch, fresh_dir):
    from service.engines.local.engine import create_local_engine

    monkeypatch.setenv("HALLMARK_DRAFT_MODEL", "")
    engine = create_local_engine(ServiceSettings(device="cpu"))
    assert engine.draft_name is None


@pytest.mark.parametrize("variable", ["HALLMARK_MAX_BATCH", "HALLMARK_LOG_FORMAT", "HALLMARK_VLLM_URL"])
def test_other_empty_variables_keep_their_defaults(monkeypatch, fresh_dir, variable):
    monkeypatch.setenv(variable, "")
    default = ServiceSettings.model_fields[variable.removeprefix("HALLMARK_").lower()].default
    assert getattr(ServiceSettings(), variable.removeprefix("HALLMARK_").lower()) == default


def test_doctor_names_a_rule_across_settings(monkeypatch, capsys, fresh_dir):
    monkeypatch.setenv("HALLMARK_DEFAULT_MAX_TOKENS", "5000")
    code, out, _ = run(monkeypatch, capsys, "doctor")
    assert code == 1 and "HALLMARK_:" not in out
    assert "FAIL  settings     invalid settings: default_max_tokens cannot exceed max_tokens_cap" in out
    monkeypatch.setenv("HALLMARK_DEFAULT_MAX_TOKENS", "x")
    code, out, _ = run(monkeypatch, capsys, "doctor")
    assert code == 1 and "HALLMARK_DEFAULT_MAX_TOKENS: Input should be a valid integer" in out
