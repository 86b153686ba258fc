"""The page's Check without a token goes through the public check (a real Chromium): the
verdict in words and a band, no heat map or key table, and the signed report verifies in
the browser."""

from __future__ import annotations

import pytest

from tests.service import gateway as gw
from tests.service.access.texts import HUMAN
from tests.service.test_ui import _no_console_errors, _visible, _wait, browser  # noqa: F401 - the fixture


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    gateway = gw.start(tmp_path_factory.mktemp("ui-public"), draft_model=None, secrets=gw.FIXED_SECRETS)
    yield gateway
    gateway.stop()


def _check_without_token(browser, server, text):
    from selenium.webdriver.common.by import By

    browser.get("about:blank")  # a new document each time, with no token (this module never enters one)
    browser.get(f"{server.url}/ui#check")
    box = _visible(browser, "check-text")
    browser.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'))",
                           box, text)
    browser.execute_script("document.getElementById('verdict-title').textContent = ''")
    browser.find_element(By.ID, "check-submit").click()
    _wait(browser, lambda d: d.find_element(By.ID, "verdict-title").text)
    _wait(browser, lambda d: d.find_element(By.ID, "report-status").get_attribute("data-verified"), 30)


def test_the_check_without_a_token_uses_the_public_check(server, browser):
    import httpx
    from selenium.webdriver.common.by import By

    generated = httpx.post(server.url + "/v1/generate", json={"prompt": "The history of the city", "max_tokens": 230,
                                                              "seed": 3},
                           headers={"Authorization": f"Bearer {server.tokens['acme']}"}, timeout=300).json()["text"]
    _check_without_token(browser, server, generated)
    assert browser.execute_script("return sessionStorage.getItem('hallmark.token')") in (None, "")
    assert browser.find_element(By.ID, "verdict-title").text == "Watermarked"
    detail = browser.find_element(By.ID, "verdict-detail").text
    assert detail.startswith("Public check of ") and ", strong confidence," in detail and "watermark and the ledger" in detail
    assert not browser.find_element(By.ID, "heat-panel").is_displayed()
    assert not browser.find_element(By.ID, "per-key-panel").is_displayed()
    assert "p =" not in browser.find_element(By.ID, "check-result").text
    assert browser.find_element(By.ID, "report-status").get_attribute("data-verified") == "true"
    _check_without_token(browser, server, HUMAN)
    assert browser.find_element(By.ID, "verdict-title").text == "Not watermarked"
    assert browser.find_element(By.ID, "report-status").get_attribute("data-verified") == "true"
    _check_without_token(browser, server, "Just a few words.")
    assert browser.find_element(By.ID, "verdict-title").text == "Too short to say"
    _no_console_errors(browser)
