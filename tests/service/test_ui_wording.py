"""The page's wording (issue 25, item 11), in a real browser against a real gateway: the keys
tested are named by the states they have (not "active, verify-only and revoked" for one active
key), and every power of ten in the explanations is written as the p-values beside them are
(10 and a superscript, never "10^-140")."""

from __future__ import annotations

import re

import pytest

from tests.service import gateway as gw
from tests.service.test_ui import HUMAN, _edited_copy, _open, _visible, _wait, browser  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # Per-token evidence needs the evidence scope; these tests check one text several times (service/access).
    gateway = gw.start(tmp_path_factory.mktemp("ui-wording"), secrets=gw.FIXED_SECRETS, max_tokens_cap=512,
                       max_evidence_tokens=400, scopes=("evidence",), evidence_per_day=10_000,
                       probe_family_per_day=1_000)
    yield gateway
    gateway.stop()


def _check(driver, server, who, text) -> str:
    _open(driver, server, who)
    _wait(driver, lambda d: "Using a token" in d.find_element("id", "token-status").text, 30)
    driver.execute_script("arguments[0].value = arguments[1]", _visible(driver, "check-text"), text)
    driver.find_element("id", "check-submit").click()
    _wait(driver, lambda d: d.find_element("id", "verdict-title").text, 120)
    return driver.find_element("id", "explain").text


def test_one_active_key_is_named_as_one_active_key(server, browser):
    explanation = _check(browser, server, "acme", HUMAN)
    assert "No key of tenant acme matches: 1 key tested (active);" in explanation, explanation
    assert "verify-only" not in explanation and "revoked" not in explanation


def test_an_admin_sees_every_tenants_keys_counted_by_state(server, browser):
    explanation = _check(browser, server, "admin", HUMAN)
    assert "No key of any tenant matches: 2 keys tested (all active);" in explanation, explanation
    # The operator's p is the core's, not a bound: written with its mantissa.
    assert re.search(r"^p = \d", browser.find_element("id", "verdict-detail").text), \
        browser.find_element("id", "verdict-detail").text


def test_powers_of_ten_are_superscripts_everywhere(server, browser):
    text, generation_id = _edited_copy(server)
    explanation = _check(browser, server, "acme", text)
    assert browser.find_element("id", "verdict-title").text == f"Edited copy of generation {generation_id}"
    ledger = browser.find_element("id", "ledger").text
    for shown in (explanation, ledger):
        assert "10^" not in shown and not re.search(r"\de-\d", shown), shown
    # The chance-collision bound and the shared tokens' p, as the verdict's p is written: a
    # tenant's p-values are rounded up to a power of ten (service/access), so they read as bounds.
    assert re.search(r"probability below 10⁻[⁰¹²³⁴⁵⁶⁷⁸⁹]+,", explanation), explanation
    assert re.search(r"watermark \(p ≤ 10⁻[⁰¹²³⁴⁵⁶⁷⁸⁹]+\)", explanation), explanation
    # Above the threshold a tenant sees only the band, the threshold written the same way (issue 31).
    assert re.search(r"^p (≤ 10−\d+|> 0\.1|> 10−6),", browser.find_element("id", "verdict-detail").text), \
        browser.find_element("id", "verdict-detail").text
    assert re.search(r"chance-collision bound 10⁻[⁰¹²³⁴⁵⁶⁷⁸⁹]+", ledger), ledger
