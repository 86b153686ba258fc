"""The page as issue 34's newcomer met it, in headless Chromium against a real gateway whose
tenant token is the demo's kind (`make run` issues it): a tenant token without the `evidence`
scope, for a tenant whose key is `diverse` (dual key), with the default probe guard (a text
family checked 3 times a day).

Item 1: the page draws what the tier returns (spans without per-token evidence, the heat map
only with it, and why not); item 2: a 429 says when to retry and what checks without a limit;
item 3: a verdict the page has no words of its own for (the public check of a revoked key's
text, `key_revoked`) is shown as the API says it; item 5: a diverse key's 16 salts are one key
on the page and in the signed report; item 7: the ledger lists exact copies first and names
each generation's tenant; item 10: "none confidence", "p ≤ 1", the public panel's title, one
date format, the Keys tab's mode column.

The helpers that search for a text with some property (a span, a shared phrase) detect with
the admin token: the operator tier is not counted by the probe guard, so the tenant token's
three checks a text are the page's.
"""

from __future__ import annotations

import re

import httpx
import pytest

from tests.service import gateway as gw
from tests.service.test_ui import (HUMAN, _no_console_errors, _open, _shot, _underlines, _visible, _wait,  # noqa: F401
                                   browser, client, generate)

pytestmark = pytest.mark.slow

GARDEN = ("My grandmother kept a garden behind the house, and every summer she grew more tomatoes than the "
          "family could possibly eat. We carried baskets of them to the neighbours, who smiled politely and "
          "then, I suspect, passed them on to their own neighbours in turn. ")


# Prose for texts of their own: the probe guard counts every text sharing half its word 4-grams
# with another as one family, so each test that checks with acme's token checks its own text.
TRAIN = ("The morning train was late again, and the platform filled with people reading the same "
         "apologetic announcement on the board. A man beside me explained, to nobody in particular, that "
         "the signals had failed near the river crossing and that it happened every autumn when the leaves "
         "came down. By the time the train arrived we had all heard his theory twice.")
LETTER = ("Dear Sam, thank you for the books you sent last month. I have finished the one about the lighthouse "
          "keepers and started the history of the canal, which is slower going but full of odd details: the "
          "engineers used horses to tow the barges until well after the railway opened, and some of the "
          "stables still stand beside the locks. Write soon and tell me how the new job is going.")


def _salted(key: dict) -> bool:
    """Whether the detector tests this listed key under each of its salts (watermark.spec.salted)."""
    return key["spec"].get("mode") == "diverse" and key["spec"].get("diversity", "salt") == "salt"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # No `scopes`: the tenant tokens are the demo's kind. acme's key is diverse, as `make run`'s is.
    gateway = gw.start(tmp_path_factory.mktemp("ui-first-hour"), secrets=gw.FIXED_SECRETS, modes={"acme": "diverse"},
                       max_tokens_cap=512, max_evidence_tokens=400)
    yield gateway
    gateway.stop()


def _operator(server, text: str, **body) -> dict:
    response = client(server, "admin").post("/v1/detect", json={"text": text, **body})
    assert response.status_code == 200, response.text
    return response.json()


def _fresh_check_page(browser, server, who) -> None:
    """Check in a new document with ``who``'s token entered, or none (None: the public check)."""
    from selenium.webdriver.common.by import By

    if who is None:
        browser.get("about:blank")
        browser.get(f"{server.url}/ui#check")
        browser.execute_script("sessionStorage.clear()")
        browser.get("about:blank")
        browser.get(f"{server.url}/ui#check")
    else:
        _open(browser, server, who)
        _wait(browser, lambda d: "Using a token" in d.find_element(By.ID, "token-status").text)


def _check(browser, server, who, text, *, wait_report=True):
    """Check ``text`` with ``who``'s token (None: no token, the public check) in a new document."""
    from selenium.webdriver.common.by import By

    _fresh_check_page(browser, server, who)
    browser.execute_script("arguments[0].value = arguments[1]", _visible(browser, "check-text"), text)
    browser.find_element(By.ID, "check-submit").click()
    _wait(browser, lambda d: d.find_element(By.ID, "verdict-title").text or d.find_element(By.ID, "error").is_displayed())
    if wait_report and browser.find_element(By.ID, "verdict-title").text:
        _wait(browser, lambda d: d.find_element(By.ID, "report-status").get_attribute("data-verified"), 30)


def _text(browser, element_id: str) -> str:
    return browser.find_element("id", element_id).text


# ---------------------------------------------------------------- item 1: what the tier returns


def _generation_with_a_span(server) -> tuple[dict, dict]:
    for seed in range(1, 13):
        out = generate(server, seed=seed, max_tokens=150)
        result = _operator(server, out["text"], tenant="acme")
        if result["watermarked"] and result["spans"]:
            return out, result
    raise AssertionError("no output with a span in 12 seeds")


def test_a_tenant_token_without_evidence_sees_the_spans_underlined_and_no_heat_map(server, browser):
    """Before: "1 watermarked stretch is underlined in the text below", the heat-map switch and
    its legend, over plain text (the spans were drawn only around evidence tokens). Now the
    stretches the answer holds are underlined where they are, the switch and the score legend
    are gone, and the panel says why there are no per-token scores in the server's words."""
    from selenium.webdriver.common.by import By

    out, full = _generation_with_a_span(server)
    refusal = client(server).post("/v1/detect", json={"text": out["text"], "evidence": True})
    assert refusal.status_code == 403  # refused before anything is counted
    _check(browser, server, "acme", out["text"])
    answer = client(server).post("/v1/detect", json={"text": out["text"]}).json()  # the page's second count
    spans = [(s["char_start"], s["char_end"]) for s in answer.get("spans") or []]
    assert browser.find_element(By.ID, "verdict-title").text.startswith("Watermarked by tenant acme, key v1")
    assert _text(browser, "heat") == out["text"]
    marks = _underlines(browser)
    assert marks == spans, (marks, spans)
    if spans:
        assert f"{len(spans)} watermarked stretch" in _text(browser, "explain")
        assert _text(browser, "heat-title") == "The text, its watermarked stretches underlined"
        assert browser.find_element(By.CSS_SELECTOR, "#legend .wm-span-swatch").is_displayed()
    assert not browser.find_elements(By.CSS_SELECTOR, "#heat .tok")
    assert not browser.find_element(By.ID, "heat-toggle").is_displayed()
    assert not any(e.is_displayed() for e in browser.find_elements(By.CSS_SELECTOR, "#legend .heat-only"))
    note = _text(browser, "heat-note")
    token_id = client(server).get("/v1/me").json()["token_id"]
    # The refusal's reason, with the command it names made this token's own.
    reason = refusal.json()["error"]["message"].split(";")[0].split(":")[0].replace("TOKEN_ID", token_id)
    assert note.startswith("No per-token scores (the heat map) for this check: ") and reason in note, (note, reason)
    assert "leave 'evidence' out" not in note and "TOKEN_ID" not in note
    _shot(browser, "check")
    _no_console_errors(browser)


# ---------------------------------------------------------------- item 2: the 429


def test_the_fourth_check_of_a_text_says_when_to_retry_and_what_checks_without_a_limit(server, browser):
    """Before: the probe guard's 429 message alone, neither when to retry nor that `hallmark
    detect` checks locally without a limit."""
    from selenium.webdriver.common.by import By

    # Edited a little each time: the same text again is an exact repeat, answered without counting.
    texts = [f"{TRAIN} {TRAIN} edit{i}" for i in range(5)]
    for text in texts[:3]:
        _check(browser, server, "acme", text)
        assert not browser.find_element(By.ID, "error").is_displayed()
    probe = client(server).post("/v1/detect", json={"text": texts[3]})
    assert probe.status_code == 429 and probe.json()["error"]["code"] == "probe_guard"
    retry = int(probe.headers["retry-after"])
    browser.execute_script("document.getElementById('verdict-title').textContent = ''")
    browser.execute_script("arguments[0].value = arguments[1]", _visible(browser, "check-text"), texts[4])
    browser.find_element(By.ID, "check-submit").click()
    error = _visible(browser, "error", timeout=60).text
    assert error.startswith("429") and probe.json()["error"]["message"] in error, error
    unit = "second" if retry < 90 else "minute" if retry < 5400 else "hour"
    assert re.search(rf"Try again in about \d+ {unit}s? \(after \d\d:\d\d\)\.", error), error
    assert "hallmark detect --tenant acme --text-file FILE checks a text without this limit" in error, error


# ---------------------------------------------------------------- item 3: verdicts the page did not know


def test_a_public_check_of_a_revoked_keys_text_shows_what_the_api_says(server, browser):
    """The public check of text under a revoked key: the page shows the API's verdict and its
    words (before issue 31's change, "watermarked"; after it, `key_revoked`), never a verdict
    of its own."""
    from selenium.webdriver.common.by import By

    key_id = gw.add_tenant(server, "initech")
    long = next(out for seed in range(1, 9) for out in [generate(server, "initech", seed=seed, max_tokens=300)]
                if _operator(server, out["text"], tenant="initech")["total_tokens"] >= 220)
    gw.revoke(server, key_id)
    api = httpx.post(f"{server.url}/v1/public/detect", json={"text": long["text"]}, timeout=300).json()
    _check(browser, server, None, long["text"])
    words = api["verdict_text"]
    assert _text(browser, "explain").splitlines()[0] == words[0].upper() + words[1:] + "."
    titles = {"watermarked": "Watermarked", "key_revoked": "Watermark of a revoked key"}
    assert _text(browser, "verdict-title") == titles[api["verdict"]]
    if api["verdict"] == "key_revoked":
        assert "revoked" in browser.find_element(By.ID, "verdict").get_attribute("class").split()
    _no_console_errors(browser)


def test_verdicts_of_the_reworked_tiers_are_shown_in_words(server, browser):
    """Issue 31 reworks what the tiers answer: a `verdict` field (`key_revoked`, `not_tested`,
    `passes_lenient_threshold`, ...), a confidence band, and for a tenant no p-value, spans or
    per-key table on most texts. Answers of that shape (the fetch of /v1/detect replaced in
    this page only) are drawn from what they hold: the verdict in words, no "p unknown", no
    empty tables, and what the answer leaves out said once."""
    from selenium.webdriver.common.by import By

    key = {"tenant": "acme", "key_id": "key_0123456789abcdef", "version": 1, "state": "revoked",
           "fingerprint": "a1b2c3", "algorithm": "dual_key_gumbel"}
    tenant = {"tier": "tenant", "verdict": "key_revoked", "watermarked": False, "confidence": "none",
              "threshold": 1e-6, "scored_tokens": 140, "total_tokens": 150, "key": key, "keys_tested": 16,
              "basis": [], "ledger_matches": [],
              # A tenant's k-gram citation without the numbers that say why it is not a copy.
              "kgram_matches": [{"generation_id": "0" * 32, "key_id": key["key_id"], "matched_kgrams": 3,
                                 "text_kgrams": 140, "generation_kgrams": 150, "share": 0.021429, "passes": False,
                                 "key_state_at_generation": "active", "key_state_now": "revoked"}]}
    public = {"tier": "public", "verdict": "key_revoked", "watermarked": False, "provider": "Hallmark",
              "tenant": None, "confidence": "none", "tokens": 230, "basis": [],
              "verdict_text": "carries a watermark of Hallmark under a key revoked as compromised: anyone holding "
                              "the leaked key could have made it"}
    stub = """const answers = arguments[0];
        const real = window.fetch;
        window.fetch = (path, init) => answers[path] ?
            Promise.resolve(new Response(JSON.stringify(answers[path]), {status: 200, headers: {"Content-Type": "application/json"}})) :
            real(path, init);"""
    for who in ("acme", None):
        _fresh_check_page(browser, server, who)
        browser.execute_script(stub, {"/v1/detect": tenant, "/v1/public/detect": public})
        browser.execute_script("arguments[0].value = arguments[1]", _visible(browser, "check-text"), "some text")
        browser.find_element(By.ID, "check-submit").click()
        _wait(browser, lambda d: d.find_element(By.ID, "verdict-title").text)
        assert "revoked" in browser.find_element(By.ID, "verdict").get_attribute("class").split()
        page = _text(browser, "check-result")
        assert "p unknown" not in page and "key_revoked" not in page
        if who:
            assert _text(browser, "verdict-title") == "Watermark of a revoked key: tenant acme, key v1"
            assert _text(browser, "verdict-detail") == "140 of 150 tokens scored (threshold 10−6)."
            explanation = _text(browser, "explain")
            assert "revoked as compromised" in explanation and "leaves out the p-value, the watermarked " \
                "stretches and the per-key table" in explanation and "No key of" not in explanation, explanation
            assert not browser.find_element(By.ID, "per-key-panel").is_displayed()
            assert browser.find_element(By.CSS_SELECTOR, "#ledger .kgram-weak .hint").text == (
                "tenant acme; 3 of 140 eight-token sequences shared (2 %): not enough to call it a copy; "
                "key active at generation, revoked now")
        else:
            assert _text(browser, "verdict-title") == "Watermark of a revoked key"
            assert _text(browser, "verdict-detail") == "Public check of 230 tokens."
            assert _text(browser, "explain").splitlines()[0].startswith("Carries a watermark of Hallmark under a key")


# ---------------------------------------------------------------- item 5: keys, not salts


def test_a_diverse_key_is_one_key_under_its_salts_on_the_page_and_in_the_report(server, browser):
    """Before: "1 key tested, 16 with their salts" on the page, 16 identical rows under "Every
    key tested", "16 keys" in the signed report."""
    from selenium.webdriver.common.by import By

    from watermark.salt import SALTS

    text = f"{LETTER} {LETTER}"
    # The store's keys (other tests of the module may add some): diverse ones are tested under each salt.
    admin = client(server, "admin")
    keys = [k for t in admin.get("/v1/admin/tenants").json()["tenants"]
            for k in admin.get("/v1/admin/keys", params={"tenant": t["name"]}).json()["keys"]]
    tests = sum(SALTS if _salted(k) else 1 for k in keys)
    states = [s for s in ("active", "verify-only", "revoked") if any(k["state"] == s for k in keys)]
    counted = f"all {states[0]}" if len(states) == 1 else ", ".join(
        f"{sum(k['state'] == s for k in keys)} {s}" for s in states)
    _check(browser, server, "admin", text)
    tested = f"{len(keys)} keys tested ({tests} tests with their salts; {counted})"
    assert f"No key of any tenant matches: {tested};" in _text(browser, "explain"), _text(browser, "explain")
    browser.find_element(By.ID, "per-key-summary").click()
    rows = [[c.text for c in row.find_elements(By.TAG_NAME, "td")]
            for row in browser.find_elements(By.CSS_SELECTOR, "#per-key tbody tr")]
    assert sorted(r[1] for r in rows) == sorted(k["key_id"] for k in keys), rows
    salts = {r[1]: r[4] for r in rows}
    for k in keys:
        diverse = _salted(k)
        assert re.fullmatch(rf"{SALTS}, best \d+", salts[k["key_id"]]) if diverse else salts[k["key_id"]] == "—", salts
    assert _text(browser, "per-key-summary") == f"Every key tested: {tested}"
    _check(browser, server, "acme", text)
    answer = client(server).post("/v1/detect", json={"text": text}).json()
    expected = "1 key tested under 16 salts (active)" if answer.get("per_key") else \
        f"{answer['keys_tested']} tests (each key, a diverse key under each of its salts)"
    assert f"No key of tenant acme matches: {expected};" in _text(browser, "explain")
    statement = answer["report"]["statement"]
    assert statement["scope"]["keys"] == 1 and "the 1 key of tenant acme" in statement["verdict_text"], statement
    _no_console_errors(browser)


# ---------------------------------------------------------------- item 7: the ledger panel


def _exact_copy_with_other_matches(server) -> tuple[dict, dict]:
    """A generation whose text the operator's check finds as an exact copy and also shares
    k-grams with other generations (the bundled model repeats pydoc boilerplate), preferably
    another tenant's."""
    found = None
    for seed in range(40, 56):
        if found and seed >= 46:
            break  # another tenant's is preferred, not worth minutes of generating
        for who in ("globex", "acme"):
            out = generate(server, who, seed=seed, max_tokens=150)
            result = _operator(server, out["text"])
            others = [m for m in result["kgram_matches"] if m["generation_id"] != out["generation_id"]]
            if result["ledger_matches"] and others:
                tenants = {t for m in others for t in [_tenant_of(server, m["generation_id"])]}
                if tenants - {who}:
                    return out, result
                found = found or (out, result)
    assert found, "no generation shared k-grams with another one"
    return found


def _tenant_of(server, generation_id: str) -> str:
    return client(server, "admin").get(f"/v1/generations/{generation_id}").json()["tenant"]


def test_the_ledger_lists_the_exact_copy_first_and_names_each_generations_tenant(server, browser):
    """Before: weak k-gram matches above the exact copy, and for an admin other tenants'
    generations without saying whose."""
    from selenium.webdriver.common.by import By

    out, result = _exact_copy_with_other_matches(server)
    _check(browser, server, "admin", out["text"])
    cards = browser.find_elements(By.CSS_SELECTOR, "#ledger .match")
    kinds = [("exact" if "Exact copy" in c.text else "copy" if "kgram-match" in c.get_attribute("class") else "weak")
             for c in cards]
    assert kinds[0] == "exact" and kinds == sorted(kinds, key=["exact", "copy", "weak"].index), kinds
    assert out["generation_id"] in cards[0].text
    for card in cards[1:]:
        generation_id = card.find_element(By.CSS_SELECTOR, "a[data-id]").get_attribute("data-id")
        assert card.find_element(By.CLASS_NAME, "hint").text.startswith(f"tenant {_tenant_of(server, generation_id)}; ")
    assert "Only exact copies" not in _text(browser, "ledger")
    _no_console_errors(browser)


# ---------------------------------------------------------------- item 10: wording


def test_the_public_check_of_a_human_text_says_no_none_confidence_and_titles_its_report(server, browser):
    text = f"{HUMAN} {GARDEN} {HUMAN} {GARDEN}"
    _check(browser, server, None, text)
    assert _text(browser, "verdict-title") == "Not watermarked"
    detail = _text(browser, "verdict-detail")
    assert re.fullmatch(r"Public check of \d+ tokens\.", detail) and "none" not in detail, detail
    assert _text(browser, "ledger-title") == "Signed report"
    _check(browser, server, "globex", text)  # a token's answer has the ledger again
    assert _text(browser, "ledger-title") == "Provenance ledger"


def test_a_tenants_bound_above_a_tenth_is_not_written_p_at_most_1(server, browser):
    text = f"{GARDEN}{GARDEN}{HUMAN}"
    _check(browser, server, "globex", text)
    answer = client(server, "globex").post("/v1/detect", json={"text": text}).json()
    detail = _text(browser, "verdict-detail")
    assert "p ≤ 1," not in detail and "p ≤ 1" not in _text(browser, "check-result")
    if answer.get("log10_p_value") == 0:
        assert detail.startswith("p > 0.1, "), detail
    if answer.get("log10_p_value") is None:  # above the threshold: the band only (issue 31)
        assert answer["p_band"] == "p > 1e-06" and detail.startswith("p > 10−6, "), detail
        assert "p unknown" not in _text(browser, "check-result")


def test_the_record_page_writes_every_time_one_way(server, browser):
    from selenium.webdriver.common.by import By

    out = generate(server, seed=61, max_tokens=12)
    _open(browser, server, "acme", "record")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#recent tbody tr td.nowrap"))
    browser.find_element(By.ID, "record-id").send_keys(out["generation_id"])
    browser.find_element(By.ID, "record-submit").click()
    _wait(browser, lambda d: d.find_element(By.ID, "record-title").text == out["generation_id"])
    facts = dict(zip([e.text for e in browser.find_elements(By.CSS_SELECTOR, "#record-facts dt")],
                     [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#record-facts dd")]))
    listed = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#recent tbody td.nowrap")]
    for shown in [facts["Created"], facts["Updated"], *listed]:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", shown), shown


def test_the_keys_tab_has_a_mode_column(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _open(browser, server, "admin", "keys")
    _wait(browser, lambda d: d.find_element(By.ID, "tab-keys").is_displayed())
    browser.find_element(By.ID, "tab-keys").click()
    headers = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#keys-table thead th")]
    assert headers[4] == "Mode", headers
    for tenant, mode in (("acme", "diverse"), ("globex", "deterministic")):
        Select(browser.find_element(By.ID, "keys-tenant")).select_by_value(tenant)
        _wait(browser, lambda d: [r.find_elements(By.TAG_NAME, "td")[4].text
                                  for r in d.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr")] == [mode])
    _no_console_errors(browser)
