"""One /v1/detect looks the ledger up once: the exact-copy query and one k-gram look-up of the
text (every form, every key of the tenant) feed both the salt narrowing (service.ledger_salts)
and the ledger basis, whose shared positions come from the same rows and whose salts and key
states the look-up read once; a tenant whose every key has generations costs no query per key."""

from __future__ import annotations

import random

import httpx
import pytest
from sqlalchemy import event

from ledger import kgrams
from ledger.entries import record_generation
from keys.lifecycle import create_key
from keys.material import detection_keys
from service import detection
from service.auth import authenticate
from service.schemas import DetectBody
from watermark.spec import WatermarkSpec

from tests.service import gateway


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request, tmp_path_factory):
    # acme's key `diverse`: the salt narrowing reads the look-up too. On both backends: the
    # look-up's statements are written per dialect (ledger.kgram_cache._read_all).
    server, database, url = None, None, None
    if request.param == "postgres":
        from tests.keys.conftest import PgDatabase, reachable_pg_server

        server = reachable_pg_server()
        database = PgDatabase(server)
        url = database.reset()
    gw = gateway.start(tmp_path_factory.mktemp("lookup"), database_url=url, secrets=gateway.FIXED_SECRETS,
                       modes={"acme": "diverse"})
    try:
        r = httpx.post(gw.url + "/v1/generate", headers={"Authorization": f"Bearer {gw.tokens['acme']}"},
                       json={"prompt": "The function returns", "max_tokens": 120, "seed": 3}, timeout=300)
        assert r.status_code == 200, r.text
        services = gw.app.state.services
        rng = random.Random(4)
        with services.store.transaction() as session:
            for _ in range(19):  # 20 keys in all, every one with a generation
                create_key(session, services.store.keyring, tenant="acme", actor="test", spec=WatermarkSpec())
        with services.store.transaction() as session:
            for key in detection_keys(session, services.store.keyring, tenant="acme"):
                tokens = [rng.randrange(1000) for _ in range(100)]
                record_generation(session, tenant_id=key.tenant_id, key_id=key.key_id, key_version=key.version,
                                  engine="local", model="tiny", spec=key.spec, prompt_tokens=3,
                                  watermarked_tokens=len(tokens), unwatermarked_reason=None, output_text="other",
                                  token_ids=tokens, kgram_set=kgrams.kgram_set(key.key_id, key.material.secret,
                                                                               tokens))
        services.key_cache.clear()
        yield gw, r.json()
    finally:
        gw.stop()
        if database is not None:
            database.close()
            server.close()  # drops the database it created


def _statements(services, body):
    seen: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    identity = authenticate(services, f"Bearer {served_token[0]}")
    detection.detect(services, identity, body)  # warm: keys opened, caches filled
    event.listen(services.store.engine, "before_cursor_execute", count)
    try:
        out = detection.detect(services, identity, body)
    finally:
        event.remove(services.store.engine, "before_cursor_execute", count)
    return out, seen


served_token: list[str] = []


@pytest.mark.parametrize("edit", [False, True])
def test_one_ledger_look_up_per_request(served, edit):
    gw, generated = served
    served_token[:] = [gw.tokens["acme"]]
    services = gw.app.state.services
    words = generated["text"].split(" ")
    text = " ".join(w.upper() if edit and i % 5 == 0 else w for i, w in enumerate(words))
    out, seen = _statements(services, DetectBody(text=text))
    # The k-gram read: every statement touching the table (with the in-process index,
    # ledger.kgram_index, it probes no digest: it reads the candidates' rows and the log's news).
    kgram_look_ups = [s for s in seen if "ledger_kgrams" in s]
    exact_look_ups = [s for s in seen if "output_sha256" in s.partition("WHERE")[2]]
    assert len(kgram_look_ups) == 1, kgram_look_ups  # not one per key (20), nor again for the basis
    assert len(exact_look_ups) == 1, exact_look_ups  # not again for the salts
    # The salts and key states of what it found (at generation and now), the entries' leaves
    # and the latest checkpoint: read once, in the look-up (ledger.read.detection_facts), not
    # by the narrowing, each form's shared-token test, each basis and the report again.
    facts_reads = [s for s in seen if "JOIN log_leaves" in s and "JOIN watermark_keys" in s
                   and "log_checkpoints" in s]
    assert len(facts_reads) == 1, facts_reads
    assert not [s for s in seen if s.startswith("SELECT watermark_keys.id, watermark_keys.state")]
    # Every statement of the request: 2 (issue 30 item 4; at most 3 was the pin), in one read
    # transaction: the exact copies' ids, the k-gram rows with the matched generations' rows
    # (the id recovery's and the log check's, unless kept already: ledger.kgram_cache.VerifiedRows),
    # the scope's count and the scheme 1 keys; those generations' entries, leaves, tenants, key
    # states and the latest checkpoint (the exact copies and the report's proofs).
    # BEGIN and COMMIT are not queries.
    queries = [q for q in seen if q.split()[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK")]
    assert len(queries) <= 2, (len(queries), "\n".join(queries))
    assert out["kgram_matches"][0]["key_state_now"] == "active"
    assert out["kgram_matches"][0]["key_state_at_generation"] == "active"
    assert [m["generation_id"] for m in out["kgram_matches"]] == [generated["generation_id"]]
    assert bool(out["ledger_matches"]) is not edit
    # The diverse key was tested under its generation's recorded salt alone (the narrowing).
    assert out["key"]["salt"] == generated["watermark"]["salt"] is not None
    # The same answer as the reference path (every form and look-up on its own).
    identity = authenticate(services, f"Bearer {gw.tokens['acme']}")
    reference = detection.detect(services, identity, DetectBody(text=text), batched=False)
    assert reference["kgram_matches"] == out["kgram_matches"]
    assert reference["ledger_matches"] == out["ledger_matches"]


def test_the_shared_token_test_reads_the_detectors_scores(served, monkeypatch):
    # Scores are computed once per token list and key in a request (detector.scoring.ScoreMemo):
    # the ledger basis's shared-token test reads the detector's instead of scoring again.
    from detector import scoring

    gw, generated = served
    services = gw.app.state.services
    identity = authenticate(services, f"Bearer {gw.tokens['acme']}")
    body = DetectBody(text=generated["text"])
    detection.detect(services, identity, body)  # warm
    computed = []
    for name in ("dual_scores", "token_scores"):
        original = getattr(scoring, name)

        def counting(key, scored, *rest, _original=original):
            computed.append((key, scored.positions.tobytes(), scored.tokens.tobytes(), rest))
            return _original(key, scored, *rest)

        monkeypatch.setattr(scoring, name, counting)
    out = detection.detect(services, identity, body)
    assert out["kgram_matches"] and out["kgram_matches"][0]["log10_shared_p"] is not None  # the test ran
    assert computed and len(computed) == len(set(computed)), "a key's scores of one token list computed twice"
    monkeypatch.undo()
    assert detection.detect(services, identity, body, batched=False)["kgram_matches"] == out["kgram_matches"]


def test_forms_that_tokenise_alike_are_one_test(served, monkeypatch):
    # A normalised form whose tokens are the text's own (a normalisation that only touched
    # what the tokeniser ignores) is the same test: scored once, no Bonferroni factor for it.
    gw, generated = served
    services = gw.app.state.services
    identity = authenticate(services, f"Bearer {gw.tokens['acme']}")
    text = generated["text"].replace(" ", "\u00a0", 3)  # a form the normalisation rewrites
    as_sent = detection.tokenize_with_offsets(services.engine.tokenizer(), text)
    monkeypatch.setattr(detection, "tokenize_with_offsets", lambda tokenizer, form: as_sent)
    out = detection.detect(services, identity, DetectBody(text=text))
    alone = detection.detect(services, identity, DetectBody(text=text, normalize=False))
    assert out["normalization"]["scored"] == "as_sent"
    assert "bonferroni x" not in out["correction"]
    assert out["log10_p_value"] == alone["log10_p_value"]
