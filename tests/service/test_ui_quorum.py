"""Issue 32 item 4, the page's part (service/ui/static/quorum.js), in a real browser: a receipt
fetched again once a witnessed checkpoint covers it is checked against a tlog-policy, counting
good Ed25519 cosignatures only; a quorum that needs an ML-DSA-44 witness is "cannot check here"
(never "ok"), with the pointer to `hallmark receipt verify --policy`; a policy whose witness key
is not the one that cosigned, or whose log is another, is refused. Witnesses are the
tests' own, written from the C2SP texts (tests/service/c2sp_witness.py)."""

from __future__ import annotations

import json

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from ledger.log.note import NoteSigner
from tests.service import gateway
from tests.service.c2sp_witness import Witness
from tests.service.test_ui import _open, browser  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow

SCRIPT = """const [raw, policy, done] = arguments;
    HallmarkQuorum.verifyWitnessed(HallmarkVerify.parseRaw(raw), policy)
      .then(r => done(r), e => done({ok: "error", message: String(e)}));"""


@pytest.fixture(scope="module")
def witnessed(tmp_path_factory):
    """A gateway whose policy needs both an Ed25519 and an ML-DSA-44 witness, a receipt fetched
    again once a checkpoint both cosigned covers it, and the witnesses."""
    tmp = tmp_path_factory.mktemp("uiquorum")
    ed, pq = Witness("w1.example/ed", "ed25519").start(), Witness("w2.example/pq", "ml-dsa-44").start()
    policy = tmp / "policy.txt"
    policy.write_text(f"witness ed {ed.vkey} {ed.url}\nwitness pq {pq.vkey} {pq.url}\ngroup both all ed pq\n"
                      "quorum both\n")
    running = gateway.start(tmp, witness_policy=str(policy), witness_timeout_seconds=0.5, witness_attempts=2)
    try:
        log_vkey = running.app.state.services.log_authority().verifier.vkey
        for w in (ed, pq):
            w.trust(log_vkey)
        headers = {"Authorization": f"Bearer {running.tokens['acme']}"}
        out = httpx.post(running.url + "/v1/generate", headers=headers, timeout=300,
                         json={"prompt": "The function returns", "max_tokens": 4, "seed": 3}).json()
        assert running.app.state.services.publish_checkpoint() is not None
        again = httpx.get(f"{running.url}/v1/generations/{out['generation_id']}/receipt", headers=headers,
                          timeout=30)
        assert again.status_code == 200, again.text
        yield running, again.text, log_vkey, ed, pq, out["generation_id"]
    finally:
        running.stop()
        for w in (ed, pq):
            w.stop()


def _check(driver, raw, policy):
    return driver.execute_async_script(SCRIPT, raw, policy)


def test_the_page_checks_the_ed25519_quorum_and_says_it_cannot_count_ml_dsa(witnessed, browser):  # noqa: F811
    running, raw, log_vkey, ed, pq, generation_id = witnessed
    _open(browser, running, "acme", "record")
    browser.execute_script("localStorage.clear()")
    browser.set_script_timeout(30)
    ed_only = f"log {log_vkey}\nwitness ed {ed.vkey}\nwitness pq {pq.vkey}\nquorum ed\n"
    ok = _check(browser, raw, ed_only)
    assert ok["ok"] is True and "witnessed at size" in ok["message"] and "by ed (quorum ed met)" in ok["message"], ok
    assert "ML-DSA-44 cosignatures cannot be checked in the browser" in ok["message"]

    both = f"log {log_vkey}\nwitness ed {ed.vkey}\nwitness pq {pq.vkey}\ngroup both all ed pq\nquorum both\n"
    unchecked = _check(browser, raw, both)
    assert unchecked["ok"] is None and "hallmark receipt verify --policy" in unchecked["message"], unchecked

    stranger = Witness("w1.example/ed", "ed25519")  # the same name, another key: its cosignature is not there
    wrong_key = _check(browser, raw, f"log {log_vkey}\nwitness ed {stranger.vkey}\nquorum ed\n")
    assert wrong_key["ok"] is False and "lacks the policy's witness quorum" in wrong_key["message"], wrong_key
    other_log = NoteSigner(log_vkey.split("+")[0], Ed25519PrivateKey.generate()).verifier.vkey
    wrong_log = _check(browser, raw, f"log {other_log}\nwitness ed {ed.vkey}\nquorum ed\n")
    assert wrong_log["ok"] is False and "not signed by a log the policy lists" in wrong_log["message"], wrong_log
    altered = json.loads(raw)
    altered["log"]["tlog_proof"] = altered["log"]["tlog_proof"].replace("index ", "index 1", 1)
    moved = _check(browser, json.dumps(altered), ed_only)
    assert moved["ok"] is False, moved
    bad = _check(browser, raw, "quorum nobody\n")
    assert bad["ok"] is False and "the witness policy: policy line 1" in bad["message"], bad

    # The Record tab: paste the policy, check the looked-up generation's receipt; the page says
    # plainly that ML-DSA-44 cosignatures are not counted here.
    browser.find_element(By.ID, "record-id").send_keys(generation_id)
    browser.find_element(By.ID, "record-submit").click()
    WebDriverWait(browser, 60).until(lambda d: d.find_element(By.ID, "record-result").is_displayed())
    browser.find_element(By.CSS_SELECTOR, "#record-witness summary").click()
    hint = browser.find_element(By.ID, "record-witness").text
    assert "ML-DSA-44 cosignatures cannot be checked in the browser" in hint and "hallmark receipt verify --policy" in hint
    browser.find_element(By.ID, "record-policy").send_keys(ed_only)
    browser.find_element(By.ID, "record-check-receipt").click()
    status = browser.find_element(By.ID, "record-receipt-status")
    WebDriverWait(browser, 60).until(lambda d: status.get_attribute("data-verified") in ("true", "false", "null"))
    assert status.get_attribute("data-verified") == "true", status.text
    assert "quorum ed met" in status.text
