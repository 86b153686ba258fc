"""The page's token field and stale state, in a real browser against a real gateway (issue 25,
items 1 and 6): a typed token is used by Enter, Check, Generate and Look up without pressing
"Use token" first; a failed look-up does not leave the previous record under its error; an
error leaves with its page; a new token clears what the previous one fetched."""

from __future__ import annotations

import pytest

from tests.service import gateway as gw
from tests.service.test_ui import HUMAN, _visible, _wait, browser  # noqa: F401 - the browser fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    gateway = gw.start(tmp_path_factory.mktemp("ui-token"), max_tokens_cap=512)
    yield gateway
    gateway.stop()


def _fresh(driver, server, page="check"):
    """The page in a new document with no token stored in the tab."""
    driver.get(f"{server.url}/ui#{page}")
    driver.execute_script("sessionStorage.clear()")
    driver.get("about:blank")
    driver.get(f"{server.url}/ui#{page}")
    return _visible(driver, "token-input")


def _type_token(driver, server, who):
    field = _visible(driver, "token-input")
    field.clear()
    field.send_keys(server.tokens.get(who, who))


def _status(driver) -> str:
    return driver.find_element("id", "token-status").text


def _shown(driver, element_id) -> bool:
    return driver.find_element("id", element_id).is_displayed()


def _check(driver, text):
    area = _visible(driver, "check-text")
    driver.execute_script("arguments[0].value = arguments[1]", area, text)
    driver.find_element("id", "check-submit").click()


def test_check_uses_a_typed_token_without_use_token(server, browser):
    _fresh(browser, server)
    assert "No token yet" in _status(browser)
    _type_token(browser, server, "acme")
    _check(browser, HUMAN)
    _wait(browser, lambda d: d.find_element("id", "verdict-title").text, 60)
    assert browser.find_element("id", "verdict-title").text == "Not watermarked"
    assert not _shown(browser, "error")
    assert "tenant acme" in _status(browser)
    assert browser.execute_script("return sessionStorage.getItem('hallmark.token')") == server.tokens["acme"]


def test_generate_uses_a_typed_token_without_use_token(server, browser):
    _fresh(browser, server, "generate")
    _type_token(browser, server, "acme")
    browser.find_element("id", "gen-max").clear()
    browser.find_element("id", "gen-max").send_keys("8")
    browser.find_element("id", "gen-submit").click()
    generation_id = _visible(browser, "gen-id", 60).text
    assert len(generation_id) == 32
    assert browser.find_element("id", "gen-output").text
    assert not _shown(browser, "error")
    assert "tenant acme" in _status(browser)


def test_enter_in_the_token_field_uses_the_token(server, browser):
    from selenium.webdriver.common.keys import Keys

    _fresh(browser, server)
    _type_token(browser, server, "acme")
    browser.find_element("id", "token-input").send_keys(Keys.ENTER)
    _wait(browser, lambda d: "tenant acme" in _status(d), 30)


def test_a_failed_look_up_hides_the_previous_record_and_its_error_leaves_with_the_page(server, browser):
    import httpx

    out = httpx.post(f"{server.url}/v1/generate", json={"prompt": "Stale", "max_tokens": 6},
                     headers={"Authorization": f"Bearer {server.tokens['acme']}"}, timeout=120)
    assert out.status_code == 200, out.text
    generation_id = out.json()["generation_id"]
    _fresh(browser, server, "record")
    _type_token(browser, server, "admin")
    field = browser.find_element("id", "record-id")
    field.send_keys(generation_id)
    browser.find_element("id", "record-submit").click()
    _wait(browser, lambda d: d.find_element("id", "record-title").text == generation_id, 60)
    assert _shown(browser, "record-result")

    field.clear()
    field.send_keys("0" * 32)
    browser.find_element("id", "record-submit").click()
    error = _visible(browser, "error", 30)
    assert "404" in error.text
    assert not _shown(browser, "record-result")
    assert browser.find_element("id", "record-title").text == ""

    browser.find_element("id", "tab-keys").click()
    _visible(browser, "keys-admin", 30)
    _wait(browser, lambda d: not d.find_element("id", "error").is_displayed(), 10)


def test_a_new_token_clears_the_previous_tokens_check_result(server, browser):
    _fresh(browser, server)
    _type_token(browser, server, "acme")
    browser.find_element("id", "token-save").click()
    _wait(browser, lambda d: "tenant acme" in _status(d), 30)
    _check(browser, HUMAN)
    _visible(browser, "check-result", 60)

    _type_token(browser, server, "hm_not_a_real_token")
    browser.find_element("id", "token-save").click()
    error = _visible(browser, "error", 30)
    assert "401" in error.text
    assert "not accepted" in _status(browser)
    assert not _shown(browser, "check-result")

    # And Check with the wrong token typed (not saved) fails with that token's error,
    # not with the previous token's result.
    _fresh(browser, server)
    _type_token(browser, server, "acme")
    _check(browser, HUMAN)
    _visible(browser, "check-result", 60)
    _type_token(browser, server, "hm_not_a_real_token")
    browser.find_element("id", "check-submit").click()
    _wait(browser, lambda d: "401" in d.find_element("id", "error").text, 30)
    assert not _shown(browser, "check-result")
