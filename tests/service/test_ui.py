"""The page at /ui in a real browser (headless Chromium through selenium) against a real
gateway with the bundled models, plus the JSON routes the page uses (evidence, admin, me).

One server for the module. The browser tests skip with a reason where Chromium or its
driver is missing (``make test`` installs them from the system's packages; CI runs as root);
``HALLMARK_REQUIRE_BROWSER=1`` turns that skip into a failure. ``HALLMARK_UI_SCREENSHOTS=DIR``
saves a PNG of each page into DIR (how docs/ui-*.png are made).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import httpx
import pytest

from tests.service import gateway as gw

pytestmark = pytest.mark.slow

HUMAN = ("The committee met on Tuesday to review the budget. After a long discussion about the new "
         "library's opening hours, the parking situation near the station and the cost of repairing the "
         "roof, they agreed to postpone the decision until the next quarter, when more data would be "
         "available to everyone involved. Several members asked for a written summary before then.")
CHROMIUM = os.environ.get("HALLMARK_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("HALLMARK_CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOTS = os.environ.get("HALLMARK_UI_SCREENSHOTS")


# Fixed key secrets: a watermarked sample is a function of the key as well as the seed, so with
# the random keys of other modules every run of this one generated other texts, and the outputs
# the browser tests pick through the API (a seed with a span, an excerpt the watermark alone
# misses) could be missing in one run in many (one CI run found no ledger-only excerpt). With
# these keys a seed gives the same text on every run.
SECRETS = gw.FIXED_SECRETS


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The page's Check shows per-token evidence: the tenant tokens hold the evidence scope (service/access).
    gateway = gw.start(tmp_path_factory.mktemp("ui"), secrets=SECRETS, max_tokens_cap=512, max_evidence_tokens=400,
                       scopes=("evidence",), evidence_per_day=10_000,
                       probe_family_per_day=1_000)  # these tests check one text many times
    yield gateway
    gateway.stop()


def client(server, who="acme") -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.tokens[who]}"}, timeout=300)


def generate(server, who="acme", **body):
    body = {"prompt": "The function returns", "max_tokens": 120, "temperature": 1.0, "seed": 5, **body}
    response = client(server, who).post("/v1/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


# ---------------------------------------------------------------- JSON routes


def test_the_modules_keys_are_fixed_so_its_texts_are_the_same_on_every_run(server):
    assert gw.stored_secrets(server) == SECRETS
    # Another prompt than the page tests': identical outputs would share their k-grams with theirs.
    body = {"prompt": "Fixed keys", "seed": 3, "max_tokens": 12}
    assert generate(server, **body)["text"] == generate(server, **body)["text"]


def test_evidence_maps_every_token_to_the_original_text(server):
    out = generate(server)
    text = out["text"]
    # The core's evidence at full precision: the operator tier (a tenant's is coarsened, service/access).
    result = client(server, "admin").post("/v1/detect", json={"text": text, "evidence": True, "tenant": "acme"}).json()
    evidence = result["evidence"]
    assert result["watermarked"] and evidence["key"]["key_id"] == result["key"]["key_id"]
    assert evidence["statistic"] == result["per_key"][0]["statistic"]
    tokens = evidence["tokens"]
    assert len(tokens) == result["total_tokens"] and sum(t["scored"] for t in tokens) == result["scored_tokens"]
    assert abs(sum(t["score"] for t in tokens if t["scored"]) - result["per_key"][0]["score"]) < 1e-3
    assert "".join(text[t["char_start"]:t["char_end"]] for t in tokens) == text
    assert all(t["reason"] in (None, "repeated_context") for t in tokens)
    # Without the flag the result is unchanged (no evidence field).
    assert "evidence" not in client(server).post("/v1/detect", json={"text": text}).json()


def test_evidence_is_capped_with_413(server):
    response = client(server).post("/v1/detect", json={"text": HUMAN * 6, "evidence": True})
    assert response.status_code == 413
    assert "limit is 400" in response.json()["error"]["message"]
    assert client(server).post("/v1/detect", json={"text": HUMAN * 6}).status_code == 200


def test_admin_routes_are_scoped(server):
    admin, tenant = client(server, "admin"), client(server, "acme")
    me = tenant.get("/v1/me").json()
    assert {k: v for k, v in me.items() if k not in ("token_id", "last_used_at")} == {
        "tenant": "acme", "admin": False, "kind": "standard", "scopes": ["evidence"], "expires_at": None}
    assert admin.get("/v1/me").json()["admin"] is True
    assert tenant.get("/v1/admin/tenants").status_code == 403
    assert tenant.post("/v1/admin/keys/rotate", json={"tenant": "acme"}).status_code == 403
    assert {t["name"] for t in admin.get("/v1/admin/tenants").json()["tenants"]} == {"acme", "globex"}
    keys = admin.get("/v1/admin/keys", params={"tenant": "globex"}).json()["keys"]
    assert [k["state"] for k in keys] == ["active"] and "secret" not in keys[0]
    assert admin.post("/v1/admin/keys/rotate", json={"tenant": "nosuch"}).status_code == 404
    response = admin.post(f"/v1/admin/keys/{keys[0]['key_id']}/revoke", json={"reason": ""})
    assert response.status_code == 422 and response.json()["error"]["type"] == "invalid_request_error"


def test_admin_state_conflicts_are_409_in_the_conflict_shape(server):
    """A revoked key revoked again, a tenant without an active key rotated: 409 with type
    conflict_error (before: type invalid_request_error, code bad_request), not retried."""
    from keys.db import open_store
    from keys.lifecycle import create_key
    from keys.tenants import create_tenant

    store = open_store(server.store_settings, require_kek=True)
    try:
        with store.transaction() as session:
            create_tenant(session, name="initech", actor="test")
            key_id = create_key(session, store.keyring, tenant="initech", actor="test").key_id
    finally:
        store.close()
    admin = client(server, "admin")
    assert admin.post(f"/v1/admin/keys/{key_id}/revoke", json={"reason": "leaked"}).status_code == 200
    again = admin.post(f"/v1/admin/keys/{key_id}/revoke", json={"reason": "leaked"})
    assert again.status_code == 409 and again.headers["x-should-retry"] == "false"
    assert again.json()["error"]["type"] == "conflict_error" and again.json()["error"]["code"] == "conflict"
    assert "already revoked" in again.json()["error"]["message"]
    rotate = admin.post("/v1/admin/keys/rotate", json={"tenant": "initech"})
    assert rotate.status_code == 409 and rotate.json()["error"]["type"] == "conflict_error"
    assert "no active key" in rotate.json()["error"]["message"] and rotate.headers["x-should-retry"] == "false"


def test_tenant_scoped_admin_token_sees_its_tenant_only(server):
    from keys.db import open_store
    from keys.tokens import issue_token

    store = open_store(server.store_settings, require_kek=True)
    try:
        with store.transaction() as session:
            raw = issue_token(session, tenant="globex", admin=True, actor="test").raw_token
    finally:
        store.close()
    scoped = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {raw}"}, timeout=60)
    assert [t["name"] for t in scoped.get("/v1/admin/tenants").json()["tenants"]] == ["globex"]
    assert scoped.get("/v1/admin/keys", params={"tenant": "acme"}).status_code == 403
    assert {k["tenant"] for k in scoped.get("/v1/admin/keys").json()["keys"]} == {"globex"}
    acme_key = client(server, "admin").get("/v1/admin/keys", params={"tenant": "acme"}).json()["keys"][0]
    # Another tenant's key answers as an unknown key does (404), so its existence does not leak.
    assert scoped.post(f"/v1/admin/keys/{acme_key['key_id']}/revoke", json={"reason": "x"}).status_code == 404
    assert scoped.get("/v1/admin/audit", params={"tenant": "acme"}).status_code == 403
    assert {e["tenant"] for e in scoped.get("/v1/admin/audit").json()["events"]} == {"globex"}


def test_page_is_static_and_locked_down(server):
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        page = anonymous.get("/ui")
        assert page.status_code == 200 and "<script src=\"/ui/app.js\"" in page.text
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe-inline" not in csp
        assert "<style" not in page.text and " style=" not in page.text and "http" not in page.text.split("<body>")[1]
        assert not re.search(r"<script(?![^>]*\bsrc=)", page.text)  # no inline script
        assert not re.search(r"\son[a-z]+\s*=", page.text)  # no inline event handlers
        for asset in ("app.js", "app.css", "favicon.svg"):
            assert anonymous.get(f"/ui/{asset}").status_code == 200
        assert anonymous.get("/ui/../app.py").status_code == 404
        assert anonymous.get("/", follow_redirects=False).headers["location"] == "/ui"


# ---------------------------------------------------------------- the page in Chromium


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()) and not shutil.which("chromedriver"):
        message = (f"Chromium ({CHROMIUM}) or chromedriver ({CHROMEDRIVER}) missing: "
                   "run scripts/ensure-browser.sh (make test does)")
        if os.environ.get("HALLMARK_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,1000", "--force-device-scale-factor=1", "--lang=en-GB"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def _wait(driver, condition, timeout=120):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # A condition that reads a table the page is re-rendering meets an element the page just
    # replaced: the wait tries again, as for one not there yet.
    return WebDriverWait(driver, timeout, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(condition)


def _visible(driver, element_id, timeout=120):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    return _wait(driver, ec.visibility_of_element_located((By.ID, element_id)), timeout)


def _open(driver, server, who, page="check"):
    """Open the page in a fresh tab state with ``who``'s token entered in the header form."""
    driver.get(f"{server.url}/ui#{page}")
    driver.execute_script("sessionStorage.clear()")
    # A new document each time (a change of fragment alone would keep the previous page state).
    driver.get("about:blank")
    driver.get(f"{server.url}/ui#{page}")
    field = _visible(driver, "token-input")
    field.clear()
    field.send_keys(server.tokens[who] if who in server.tokens else who)
    driver.find_element("id", "token-save").click()


def _shot(driver, name):
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        # The whole page, not just the window: size the window to the document first.
        height = driver.execute_script("return Math.max(document.body.scrollHeight, 700)")
        driver.set_window_size(1280, min(height + 20, 2400))
        driver.execute_script("window.scrollTo(0, 0)")
        driver.save_screenshot(str(Path(SCREENSHOTS) / f"ui-{name}.png"))
        driver.set_window_size(1280, 1000)


def _underlines(driver) -> list[tuple[int, int]]:
    """Character offsets (code points, as in Python) of each underlined span in Check's text."""
    return [tuple(m) for m in driver.execute_script("""
        const box = document.getElementById('heat'), out = [];
        for (const mark of box.querySelectorAll('mark.wm-span')) {
          const range = document.createRange();
          range.setStart(box, 0);
          range.setEndBefore(mark);
          const before = Array.from(range.toString()).length;
          out.push([before, before + Array.from(mark.textContent).length]);
        }
        return out;""")]


def _no_console_errors(driver):
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
              and "favicon" not in e["message"] and "the server responded with a status of 4" not in e["message"]]
    assert not errors, errors  # CSP violations are reported here


def _seed_with_a_span(server) -> tuple[int, str, dict]:
    """A seed whose 150-token output has a localised span (some outputs of the tiny model stop
    early or loop, and are then detected as a whole without any span passing on its own).
    Generation is deterministic for a key and a seed, so the page's run produces the same text
    (and with the module's fixed keys, every run of the module the same seed)."""
    for seed in range(1, 9):
        out = generate(server, seed=seed, max_tokens=150)
        result = client(server).post("/v1/detect", json={"text": out["text"]}).json()
        if result["watermarked"] and result["spans"]:
            return seed, out["text"], result
    raise AssertionError("no output with a span in 8 seeds")


def test_generate_then_check_shows_watermarked_with_spans(server, browser):
    from selenium.webdriver.common.by import By

    seed, text, expected = _seed_with_a_span(server)
    _open(browser, server, "acme", "generate")
    _wait(browser, lambda d: "tenant acme" in d.find_element(By.ID, "token-status").text)
    assert browser.execute_script("return sessionStorage.getItem('hallmark.token')") == server.tokens["acme"]
    assert browser.execute_script("return localStorage.length + document.cookie.length") == 0
    prompt = browser.find_element(By.ID, "gen-prompt")
    prompt.clear()
    prompt.send_keys("The function returns")
    browser.find_element(By.ID, "gen-max").clear()
    browser.find_element(By.ID, "gen-max").send_keys("150")
    browser.find_element(By.ID, "gen-seed").send_keys(str(seed))
    browser.find_element(By.ID, "gen-submit").click()
    generation_id = _visible(browser, "gen-id").text
    assert len(generation_id) == 32
    output = browser.find_element(By.ID, "gen-output").text
    assert len(output) > 100
    assert "dual_key_gumbel" in browser.find_element(By.ID, "gen-summary").text
    # The receipt verifies in the browser (WebCrypto Ed25519 against /.well-known/hallmark-keys.json).
    _wait(browser, lambda d: d.find_element(By.ID, "receipt-status").get_attribute("data-verified"), 30)
    receipt = browser.find_element(By.ID, "receipt-status")
    assert receipt.get_attribute("data-verified") == "true" and "signature verifies" in receipt.text, receipt.text
    _shot(browser, "generate")

    browser.find_element(By.ID, "gen-to-check").click()
    _wait(browser, lambda d: d.find_element(By.ID, "verdict-title").text)
    assert browser.execute_script("return document.getElementById('check-text').value") == text
    title = browser.find_element(By.ID, "verdict-title").text
    assert title.startswith("Watermarked by tenant acme, key v1 (active)"), title
    assert "tokens scored" in browser.find_element(By.ID, "verdict-detail").text
    spans = browser.find_elements(By.CSS_SELECTOR, "#heat mark.wm-span")
    assert len(spans) == len(expected["spans"]) >= 1
    hot = browser.find_elements(By.CSS_SELECTOR, "#heat .tok.h4, #heat .tok.h5")
    assert hot and browser.find_elements(By.CSS_SELECTOR, "#legend .swatch.h5")
    # The rendered text is the checked text, character for character.
    assert browser.execute_script("return document.getElementById('heat').textContent") == \
        browser.execute_script("return document.getElementById('check-text').value")
    assert generation_id in browser.find_element(By.ID, "ledger").text
    _wait(browser, lambda d: d.find_element(By.ID, "report-status").get_attribute("data-verified"), 30)
    assert browser.find_element(By.ID, "report-status").get_attribute("data-verified") == "true"
    _shot(browser, "check-evidence")  # docs/ui-check.png, the demo token's view: test_ui_first_hour.py
    _no_console_errors(browser)

    browser.find_element(By.CSS_SELECTOR, f"#ledger a[data-id='{generation_id}']").click()
    _wait(browser, lambda d: d.find_element(By.ID, "record-title").text == generation_id)
    facts = browser.find_element(By.ID, "record-facts").text
    assert "acme" in facts and "hallmark-tiny-dsv32" in facts
    _shot(browser, "record")


def test_an_altered_receipt_does_not_verify_in_the_browser(server, browser):
    import json

    out = generate(server, seed=21, max_tokens=16)
    raw = json.dumps(out["receipt"], separators=(",", ":"), ensure_ascii=False)
    _open(browser, server, "acme")
    script = """const [raw, text, done] = arguments;
        const doc = HallmarkVerify.parseRaw(raw);
        HallmarkVerify.verifySigned(doc, {text, expectedType: "hallmark.receipt"}).then(r => done(r));"""
    browser.set_script_timeout(30)
    assert browser.execute_async_script(script, raw, out["text"])["ok"] is True
    assert browser.execute_async_script(script, raw, out["text"] + " ")["ok"] is False
    altered = raw.replace(f'"output_tokens":{out["usage"]["completion_tokens"]}', '"output_tokens":1')
    assert altered != raw
    result = browser.execute_async_script(script, altered, out["text"])
    assert result["ok"] is False and "bad signature" in result["message"]


def test_human_text_is_not_watermarked_and_explained(server, browser):
    from selenium.webdriver.common.by import By

    _open(browser, server, "acme")
    area = _visible(browser, "check-text")
    _wait(browser, lambda d: "tenant acme" in d.find_element(By.ID, "token-status").text)
    area.clear()
    browser.execute_script("arguments[0].value = arguments[1]", area, HUMAN)
    browser.find_element(By.ID, "check-submit").click()
    _wait(browser, lambda d: d.find_element(By.ID, "verdict-title").text)
    assert browser.find_element(By.ID, "verdict-title").text == "Not watermarked"
    explanation = browser.find_element(By.ID, "explain").text
    assert "No key of tenant acme matches" in explanation and "not proof that a person wrote it" in explanation
    assert not browser.find_elements(By.CSS_SELECTOR, "#heat mark.wm-span")
    _shot(browser, "check-human")
    _no_console_errors(browser)


def _edited_copy(server) -> tuple[str, str]:
    """A text holding a short excerpt of a generation inside human text: too short for the
    watermark to pass on its own, long enough to share 8-token sequences with its ledger
    record. Chosen through the API: excerpts of growing length from a few starting words
    (how short an excerpt the watermark alone misses depends on the generated text, which
    depends on the key: with the module's fixed keys the same excerpt on every run)."""
    out = generate(server, seed=11, max_tokens=150)
    words = out["text"].split(" ")
    seen = []
    for start in (8, 24, 40, 0):
        for length in range(5, 30):
            text = f"{HUMAN} {' '.join(words[start:start + length])} {HUMAN}"
            result = client(server).post("/v1/detect", json={"text": text}).json()
            seen.append((start, length, result["watermarked"], result["basis"]))
            if not result["watermarked"] and "ledger" in result["basis"]:
                assert out["generation_id"] in {m["generation_id"] for m in result["kgram_matches"]}
                return text, out["generation_id"]
            if result["watermarked"]:
                break  # longer excerpts from this start only get stronger
    raise AssertionError(f"no excerpt gave a ledger-only match: {out['text']!r} {seen}")


def test_an_edited_copy_is_shown_as_matched_through_the_ledger(server, browser):
    from selenium.webdriver.common.by import By

    text, generation_id = _edited_copy(server)
    _open(browser, server, "acme")
    area = _visible(browser, "check-text")
    _wait(browser, lambda d: "tenant acme" in d.find_element(By.ID, "token-status").text)
    browser.execute_script("arguments[0].value = arguments[1]", area, text)
    browser.find_element(By.ID, "check-submit").click()
    _wait(browser, lambda d: d.find_element(By.ID, "verdict-title").text)
    assert browser.find_element(By.ID, "verdict-title").text == f"Edited copy of generation {generation_id}"
    explanation = browser.find_element(By.ID, "explain").text
    assert "The watermark alone is not significant" in explanation and "eight-token sequences" in explanation
    assert browser.find_elements(By.CSS_SELECTOR, f"#ledger .kgram-match a[data-id='{generation_id}']")
    _shot(browser, "check-edited-copy")
    _no_console_errors(browser)


def test_a_wrong_token_shows_the_apis_error(server, browser):
    from selenium.webdriver.common.by import By

    _open(browser, server, "hm_not_a_real_token")
    error = _visible(browser, "error", timeout=30)
    assert "401" in error.text and "unknown, revoked or expired API token" in error.text
    assert "not accepted" in browser.find_element(By.ID, "token-status").text
    # Screen-reader basics: every form control has a label, the error is an alert, focus starts
    # at the skip link and then reaches the navigation before the token field.
    unlabelled = browser.execute_script(
        "return [...document.querySelectorAll('input, select, textarea')]"
        ".filter(e => !e.labels.length && !e.getAttribute('aria-label')).map(e => e.id)")
    assert unlabelled == []
    assert error.get_attribute("role") == "alert"
    browser.get(f"{server.url}/ui")
    _visible(browser, "error", timeout=30)
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    order = []
    for _ in range(4):
        ActionChains(browser).send_keys(Keys.TAB).perform()
        order.append(browser.execute_script("return document.activeElement.id || document.activeElement.className"))
    assert order == ["skip", "tab-check", "tab-generate", "tab-record"], order


def test_keys_page_rotates_a_key(server, browser):
    from selenium.webdriver.common.by import By

    _open(browser, server, "admin", "keys")
    _wait(browser, lambda d: d.find_element(By.ID, "tab-keys").is_displayed())
    browser.find_element(By.ID, "tab-keys").click()
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr")) >= 1)
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, "keys-tenant")).select_by_value("globex")
    _wait(browser, lambda d: "globex" in d.find_element(By.ID, "audit-table").text)
    before = len(browser.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr"))
    browser.find_element(By.ID, "keys-rotate").click()
    dialog = _visible(browser, "confirm")
    assert "Rotate the key of globex" in dialog.text
    _shot(browser, "keys-confirm")
    browser.find_element(By.ID, "confirm-ok").click()
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr")) == before + 1)
    states = [row.find_elements(By.CSS_SELECTOR, "td")[2].text
              for row in browser.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr")]
    assert states[:2] == ["active", "verify-only"], states
    assert "key.rotated" in browser.find_element(By.ID, "audit-table").text
    keys = client(server, "admin").get("/v1/admin/keys", params={"tenant": "globex"}).json()["keys"]
    assert sorted(k["state"] for k in keys) == ["active", "verify-only"]
    _shot(browser, "keys")
    _no_console_errors(browser)


def test_a_text_over_the_evidence_limit_is_still_checked(server, browser):
    """The page asks for per-token evidence, which is capped (413 beyond; 400 tokens on this
    server, 5,000 by default): a longer text is checked without the heat map instead of
    failing with "leave 'evidence' out", which the page's user cannot do."""
    from selenium.webdriver.common.by import By

    _open(browser, server, "acme")
    area = _visible(browser, "check-text")
    _wait(browser, lambda d: "tenant acme" in d.find_element(By.ID, "token-status").text)
    browser.execute_script("arguments[0].value = arguments[1]", area, HUMAN * 6)
    browser.find_element(By.ID, "check-submit").click()
    _wait(browser, lambda d: d.find_element(By.ID, "verdict-title").text)
    assert browser.find_element(By.ID, "verdict-title").text == "Not watermarked"
    note = browser.find_element(By.ID, "heat-note").text
    assert note.startswith("No per-token scores (the heat map) for this check: evidence was asked for ") and \
        "the limit is 400 (HALLMARK_MAX_EVIDENCE_TOKENS)" in note and "leave 'evidence' out" not in note, note
    assert not browser.find_element(By.ID, "heat-toggle").is_displayed()
    assert not browser.find_element(By.ID, "error").is_displayed()
    assert browser.execute_script("return document.getElementById('heat').textContent") == HUMAN * 6


def test_a_stream_cut_before_done_is_reported(server, browser):
    """A generation stream that ends without its `done` event (server or network gone) says so
    instead of leaving a partial output that looks finished. The stream is cut in the browser
    (fetch replaced for this page) after one delta."""
    from selenium.webdriver.common.by import By

    _open(browser, server, "acme", "generate")
    _wait(browser, lambda d: "tenant acme" in d.find_element(By.ID, "token-status").text)
    browser.execute_script("""
        window.fetch = async () => new Response(new ReadableStream({start(c) {
            c.enqueue(new TextEncoder().encode('data: {"type": "started", "generation_id": "x"}\\n\\n' +
                                               'data: {"type": "delta", "text": "The function"}\\n\\n'));
            c.close(); }}), {status: 200, headers: {"Content-Type": "text/event-stream"}});""")
    browser.find_element(By.ID, "gen-submit").click()
    assert "stream ended before the generation finished" in _visible(browser, "error", timeout=30).text
    assert browser.find_element(By.ID, "gen-output").text == "The function"
    assert not browser.find_element(By.ID, "gen-summary-panel").is_displayed()


def test_the_api_reference_works_offline(server, browser):
    """/docs is Swagger UI served by the gateway (files from the fastapi-offline package), not
    from a CDN (FastAPI's default): on a machine without internet access (this one) the
    default page stayed blank."""
    from selenium.webdriver.common.by import By

    docs = httpx.get(f"{server.url}/docs", timeout=30)
    html = docs.text
    assert "cdn." not in html and "/ui/swagger-ui-bundle.js" in html and "/openapi.json" in html
    # The page's headers: its CSP (no inline script: Swagger UI is started by /ui/docs.js), no framing.
    page = httpx.get(f"{server.url}/ui", timeout=30).headers
    for header in ("content-security-policy", "x-frame-options", "x-content-type-options", "referrer-policy"):
        assert docs.headers[header] == page[header], header
    assert "frame-ancestors 'none'" in docs.headers["content-security-policy"] and docs.headers["x-frame-options"] == "DENY"
    assert not re.search(r"<script(?![^>]*\bsrc=)", html)  # no inline script
    browser.get(f"{server.url}/docs")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".swagger-ui .info .title"), 60)
    assert "Hallmark" in browser.find_element(By.CSS_SELECTOR, ".swagger-ui .info .title").text
    # Issue 34, item 10: the reference opens with what the service is and how to present a token.
    description = browser.find_element(By.CSS_SELECTOR, ".swagger-ui .info .description").text
    assert "watermark" in description and "Authorization: Bearer" in description, description
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path"), 60)
    paths = {e.text for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    assert "/v1/detect" in {p.replace("\u200b", "") for p in paths}
    # Opened operations with "Try it out" and the schemas render under the CSP too (its select
    # boxes draw their arrows with data: images).
    for summary in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary")[:3]:
        summary.click()
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".try-out__btn"), 30)
    for button in browser.find_elements(By.CSS_SELECTOR, ".try-out__btn")[:2]:
        button.click()
    browser.execute_script("document.querySelectorAll('.model-box-control, .models-control').forEach(b => b.click())")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-body select"), 30)
    _no_console_errors(browser)


def test_revoking_needs_a_reason_that_is_not_blank(server, browser):
    """The dialog keeps a blank reason (spaces pass `required`) instead of closing on the API's 422."""
    from selenium.webdriver.common.by import By

    _open(browser, server, "admin", "keys")
    _wait(browser, lambda d: d.find_element(By.ID, "tab-keys").is_displayed())
    browser.find_element(By.ID, "tab-keys").click()
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr button"))
    browser.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr button")[0].click()
    _visible(browser, "confirm")
    browser.find_element(By.ID, "confirm-reason").send_keys("   ")
    browser.find_element(By.ID, "confirm-ok").click()
    assert browser.find_element(By.ID, "confirm").get_attribute("open") is not None
    assert "recorded in the audit log" in browser.execute_script(
        "return document.getElementById('confirm-reason').validationMessage")
    assert not browser.find_element(By.ID, "error").is_displayed()
    browser.find_element(By.ID, "confirm-cancel").click()
    assert browser.find_element(By.ID, "confirm").get_attribute("open") is None
    _no_console_errors(browser)


def test_keys_page_tells_a_tenant_token_it_needs_an_admin_token(server, browser):
    from selenium.webdriver.common.by import By

    _open(browser, server, "acme", "keys")
    _wait(browser, lambda d: "tenant acme" in d.find_element(By.ID, "token-status").text)
    assert not browser.find_element(By.ID, "tab-keys").is_displayed()
    assert "needs an admin token" in _visible(browser, "keys-admin-only").text
    assert not browser.find_element(By.ID, "keys-rotate").is_displayed()


def test_looking_up_an_empty_generation_id_says_what_to_enter(server, browser):
    from selenium.webdriver.common.by import By

    _open(browser, server, "acme", "record")
    _wait(browser, lambda d: "tenant acme" in d.find_element(By.ID, "token-status").text)
    browser.find_element(By.ID, "record-id").send_keys("  ")
    browser.find_element(By.ID, "record-submit").click()
    assert "enter a generation id" in _visible(browser, "error", timeout=30).text
    assert not browser.find_element(By.ID, "record-result").is_displayed()


def _ax_description(driver) -> str:
    """The accessible description Chromium computes for the focused element (DevTools protocol)."""
    found = driver.execute_cdp_cmd("Runtime.evaluate", {"expression": "document.activeElement"})
    tree = driver.execute_cdp_cmd("Accessibility.getPartialAXTree", {
        "objectId": found["result"]["objectId"], "fetchRelatives": False})
    return ((tree["nodes"][0].get("description") or {}).get("value")) or ""


def test_token_scores_are_reachable_by_keyboard_alone(server, browser):
    """No mouse: Tab reaches the heat map as one stop (its first token), ←/→/Home/End move
    between tokens, the focused token's score shows below the text and is its accessible
    name; Tab leaves and Shift+Tab comes back to the token last visited; the per-token table
    opens from the keyboard and fits a 320 px window."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    text = generate(server, seed=5, max_tokens=60)["text"]
    scores = {t["index"]: t for t in client(server).post(
        "/v1/detect", json={"text": text, "evidence": True}).json()["evidence"]["tokens"]}
    _open(browser, server, "acme", "check")
    _wait(browser, lambda d: "tenant acme" in d.find_element(By.ID, "token-status").text)
    browser.execute_script("document.getElementById('check-text').value = arguments[0]", text)
    browser.find_element(By.ID, "check-submit").send_keys(Keys.ENTER)
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#heat .tok"))
    keys = ActionChains(browser)
    focused = lambda: browser.switch_to.active_element  # noqa: E731

    def expect_token(index):
        token = focused()
        assert "tok" in token.get_attribute("class").split() and token.get_attribute("data-index") == str(index)
        t = scores[index]
        note = f"score {t['score']:.2f}" if t["scored"] else "not scored"
        readout = browser.find_element(By.ID, "heat-readout").text
        assert readout.startswith(f"Token {index}, ") and note in readout, readout
        # What a screen reader gets: the token's text as its name (blank for a space), and the
        # quoted token with its score as its description.
        assert token.accessible_name.strip() in text
        description = _ax_description(browser)
        assert f"token {index}: {note}" in description, description
        return token

    rendered = [int(i) for i in browser.execute_script(
        "return Array.from(document.querySelectorAll('#heat .tok'), (e) => e.dataset.index)")]
    assert len(rendered) >= 20 and set(rendered) <= set(scores)
    browser.execute_script("document.getElementById('heat-toggle').focus()")  # the stop before the text
    keys.send_keys(Keys.TAB).perform()
    expect_token(rendered[0])
    for step in range(1, 4):
        keys.send_keys(Keys.ARROW_RIGHT).perform()
        expect_token(rendered[step])
    keys.send_keys(Keys.ARROW_LEFT).perform()
    expect_token(rendered[2])
    keys.send_keys(Keys.END).perform()
    expect_token(rendered[-1])
    keys.send_keys(Keys.HOME).perform()
    keys.send_keys(Keys.ARROW_RIGHT).perform()
    expect_token(rendered[1])
    # One tab stop: Tab leaves the text for the table's toggle; Shift+Tab returns to the same token.
    keys.send_keys(Keys.TAB).perform()
    assert focused().tag_name == "summary"
    keys.key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()
    expect_token(rendered[1])

    keys.send_keys(Keys.TAB).perform()
    keys.send_keys(Keys.ENTER).perform()
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#token-table tbody tr"), 10)
    rows = browser.find_elements(By.CSS_SELECTOR, "#token-table tbody tr")
    assert len(rows) == len(rendered)
    first = scores[rendered[0]]
    cells = [c.text for c in rows[0].find_elements(By.TAG_NAME, "td")]
    assert cells[0] == str(rendered[0]) and cells[2] == (f"{first['score']:.2f}" if first["scored"] else "—")
    try:
        browser.set_window_size(320, 900)
        widths = browser.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        # What sticks out (outside the boxes that scroll on purpose), to say what to fix.
        wide = browser.execute_script(
            "const w = document.documentElement.clientWidth;"
            "return Array.from(document.querySelectorAll('body *'))"
            "  .filter((e) => !e.closest('.table-wrap') && e.getBoundingClientRect().right > w + 1)"
            "  .slice(0, 8).map((e) => `${e.tagName}.${e.className} in #${e.parentElement.id}.${e.parentElement.className}`)")
        assert widths[0] <= widths[1], (widths, wide)
    finally:
        browser.set_window_size(1280, 1000)
    _no_console_errors(browser)


@pytest.mark.parametrize("width", [320, 360])
def test_no_page_is_wider_than_a_phone(server, browser, width):
    """Every page fits a 320/360 px wide window (wide tables scroll inside their box)."""
    from selenium.webdriver.common.by import By

    _open(browser, server, "admin", "keys")
    _wait(browser, lambda d: d.find_element(By.ID, "tab-keys").is_displayed())
    try:
        browser.set_window_size(width, 900)
        for page in ("check", "generate", "record", "keys"):
            browser.find_element(By.ID, f"tab-{page}").click()
            _wait(browser, lambda d: d.find_element(By.ID, f"page-{page}").is_displayed())
            if page == "keys":
                _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#audit-table tbody tr"))
            if page == "record":
                _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#recent tbody tr"))
            widths = browser.execute_script(
                "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
            assert widths[0] <= widths[1], (page, widths)
    finally:
        browser.set_window_size(1280, 1000)


def test_generations_are_listed_newest_first_paged_and_filtered(server):
    first = generate(server, seed=11, max_tokens=8)
    second = generate(server, seed=12, max_tokens=8)
    acme = client(server)
    page = acme.get("/v1/generations", params={"limit": 1}).json()
    assert [g["id"] for g in page["generations"]] == [second["generation_id"]]
    assert page["has_more"] and page["next_offset"] == 1
    older = acme.get("/v1/generations", params={"limit": 1, "offset": 1}).json()
    assert [g["id"] for g in older["generations"]] == [first["generation_id"]]
    started = acme.get(f"/v1/generations/{second['generation_id']}").json()["created_at"]
    recent = acme.get("/v1/generations", params={"since": started}).json()["generations"]
    assert [g["id"] for g in recent] == [second["generation_id"]]
    before = acme.get("/v1/generations", params={"until": started, "limit": 200}).json()["generations"]
    assert second["generation_id"] not in [g["id"] for g in before] and first["generation_id"] in [g["id"] for g in before]
    key = second["watermark"]["key_id"]
    assert all(g["key_id"] == key for g in acme.get("/v1/generations", params={"key_id": key}).json()["generations"])
    assert acme.get("/v1/generations", params={"key_id": "key_nosuch"}).json()["generations"] == []
    # Tenant scoping: globex sees none of acme's; the admin sees both tenants'.
    assert all(g["tenant"] == "globex" for g in client(server, "globex").get("/v1/generations").json()["generations"])
    everyone = client(server, "admin").get("/v1/generations", params={"limit": 200}).json()["generations"]
    assert second["generation_id"] in [g["id"] for g in everyone]
    assert acme.get("/v1/generations", params={"limit": 0}).status_code == 422
    assert acme.get("/v1/generations", params={"since": "yesterday"}).status_code == 422
    # Only ISO 8601 date-times (the schema's format): not a Unix time, not a bare date.
    for value in ("0.5", "1733200000", "2026-12-03"):
        assert acme.get("/v1/generations", params={"until": value}).status_code == 422, value


def test_ledger_list_command(server, monkeypatch, capsys):
    import json
    import sys

    from service.cli import main

    out = generate(server, seed=13, max_tokens=8)
    monkeypatch.setenv("HALLMARK_DATABASE_URL", server.store_settings.database_url)
    monkeypatch.setenv("HALLMARK_KEK_FILE", str(server.store_settings.kek_file))
    def run(*argv):
        monkeypatch.setattr(sys, "argv", ["hallmark", *argv])
        try:
            main()
        except SystemExit as exc:
            return exc.code
        return 0

    assert run("ledger", "list", "--tenant", "acme", "--limit", "1", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [g["id"] for g in listed] == [out["generation_id"]]
    assert run("ledger", "list", "--since", "not-a-time") == 1
    assert "--since takes an ISO 8601 time" in capsys.readouterr().err
    assert run("ledger", "list", "--offset", str(2 ** 70)) == 1
    assert capsys.readouterr().err.strip().count("\n") == 0
