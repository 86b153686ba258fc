"""The Generate tab says plainly what the bundled demo model is (issue 34, item 9: "Hello" →
"SBADTT POlitellFAAAA", explained only at README line 1,396), and what it says is true of the
model the gateway serves: its name, its size, and that a generation on the page names it."""

from __future__ import annotations

import re

import pytest
from safetensors import safe_open

from service.model_paths import BUNDLED_TARGET, resolve_model_path
from tests.service.test_ui import _open, _visible, _wait, browser, server  # noqa: F401 - the fixtures

pytestmark = pytest.mark.slow


def _parameters(name: str) -> int:
    """The model's parameter count, from its weights file (not from a figure written elsewhere)."""
    total = 0
    with safe_open(f"{resolve_model_path(name)}/model.safetensors", framework="numpy") as weights:
        for key in weights.keys():
            count = 1
            for size in weights.get_slice(key).get_shape():
                count *= size
            total += count
    return total


def test_the_generate_tab_says_what_the_demo_model_is(server, browser):
    from selenium.webdriver.common.by import By

    _open(browser, server, "acme", "generate")
    note = _visible(browser, "gen-demo-note").text
    named = re.search(r"bundled demo model \((\S+), what make run serves\)", note)
    assert named and named.group(1) == BUNDLED_TARGET, note
    assert "gibberish" in note and "pydoc" in note and "not to be read" in note
    millions = re.search(r"a (\d+) M-parameter model", note)
    assert millions and int(millions.group(1)) == round(_parameters(BUNDLED_TARGET) / 1e6), note

    # The model this gateway serves, as the page's own generation reports it, is the one named.
    _wait(browser, lambda d: "tenant acme" in d.find_element(By.ID, "token-status").text)
    browser.find_element(By.ID, "gen-max").clear()
    browser.find_element(By.ID, "gen-max").send_keys("20")
    browser.find_element(By.ID, "gen-submit").click()
    _visible(browser, "gen-id")
    summary = browser.find_element(By.ID, "gen-summary").text
    assert re.search(rf"Model\s+{re.escape(BUNDLED_TARGET)}\b", summary), summary
