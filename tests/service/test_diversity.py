"""Issue 24 over real HTTP with the bundled models: a `diverse` key gives a new text for
the same prompt, a seed reproduces one (salt, coin and speculative draws included), `n`
choices differ, and every output is detected, with its salt named by the result and by the
ledger (which records it in the entry's hashed ``details``)."""

from __future__ import annotations

import httpx
import pytest

from tests.service import gateway as gw
from tests.synthetic import generate as generate_synthetic
from tests.synthetic import human_like
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

openai = pytest.importorskip("openai")

PROMPT = "The function returns"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # acme: dual key (the engine speculates with the draft model); globex: single key, the
    # mode whose regenerations were all one text before issue 24.
    gateway = gw.start(tmp_path_factory.mktemp("diversity"), secrets=gw.FIXED_SECRETS,
                       modes={"acme": "diverse", "globex": "diverse"}, max_tokens_cap=256)
    yield gateway
    gateway.stop()


def client(server, who="acme") -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.tokens[who]}"}, timeout=300)


def generate(server, who="acme", **body):
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 1.0, **body}
    response = client(server, who).post("/v1/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("who", ["globex", "acme"])
def test_two_default_generations_of_one_prompt_differ(server, who):
    # Unseeded regenerations of one prompt take the 16 salts in turn (watermark.salt.SaltRotation):
    # each is an independent draw, so (40 tokens at T = 1) they differ.
    outputs = [generate(server, who) for _ in range(4)]
    assert outputs[0]["watermark"]["spec"]["mode"] == "diverse"
    assert len({o["text"] for o in outputs}) == 4, [o["text"] for o in outputs]
    salts = [o["watermark"]["salt"] for o in outputs]
    assert salts == [(salts[0] + i) % 16 for i in range(4)]
    for out in outputs:
        assert 0 <= out["watermark"]["salt"] < 16
        record = client(server, who).get(f"/v1/generations/{out['generation_id']}").json()
        assert record["details"]["salt"] == out["watermark"]["salt"]


@pytest.mark.parametrize("who", ["globex", "acme"])
def test_a_seed_reproduces_a_text(server, who):
    a, b = generate(server, who, seed=1234), generate(server, who, seed=1234)
    assert a["token_ids"] == b["token_ids"] and a["text"] == b["text"]
    assert a["watermark"]["salt"] == b["watermark"]["salt"] and a["generation_id"] != b["generation_id"]
    others = [generate(server, who, seed=seed)["token_ids"] for seed in (1, 2, 3)]
    assert any(t != a["token_ids"] for t in others)


def test_a_diverse_generation_is_detected_and_names_its_salt(server):
    out = next(o for o in (generate(server, "acme", seed=s, max_tokens=150) for s in range(1, 9))
               if len(o["token_ids"]) >= 100)
    salt = out["watermark"]["salt"]
    for body in ({"text": out["text"]}, {"token_ids": out["token_ids"]}):
        result = client(server).post("/v1/detect", json=body).json()
        assert result["watermarked"] and result["p_value"] < 1e-6, result["log10_p_value"]
        assert result["key"]["key_id"] == out["watermark"]["key_id"] and result["key"]["salt"] == salt
        # The ledger identifies the generation (exact copy by text, k-grams by token ids):
        # its recorded salt alone is tested (service.ledger_salts), no Šidák over 16.
        assert result["keys_tested"] == 1
        if "text" in body:
            exact = [m for m in result["ledger_matches"] if m["generation_id"] == out["generation_id"]]
            assert exact and exact[0]["salt"] == salt
    # An edited copy (one token in 20 replaced; k-grams are 8 tokens): the ledger's k-grams
    # find the generation, and the shared tokens are scored under the salt it recorded.
    edited = list(out["token_ids"])
    for i in range(10, len(edited), 20):
        edited[i] = (edited[i] + 1) % 4000
    result = client(server).post("/v1/detect", json={"token_ids": edited}).json()
    found = [m for m in result["kgram_matches"] if m["generation_id"] == out["generation_id"]]
    assert found and found[0]["passes"], result["kgram_matches"]


def test_without_the_ledger_every_salt_is_tested(server):
    """Text under the tenant's key that the ledger never recorded (generated outside the
    service): the key is tested under its 16 salts, and the matching salt is named."""
    key = WatermarkKey(gw.FIXED_SECRETS["acme"], WatermarkSpec(algorithm="dual_key_gumbel", mode="diverse"))
    tokens, _ = generate_synthetic(key.with_salt(5), 150, seed=4)
    result = client(server).post("/v1/detect", json={"token_ids": tokens}).json()
    # One key under its 16 salts: 16 tests, one key (salts are not keys: issue 34, item 5).
    assert result["watermarked"] and result["tests"] == 16 and result["keys_tested"] == 1 and result["key"]["salt"] == 5
    assert result["kgram_matches"] == [] and result["ledger_matches"] == []
    human = client(server).post("/v1/detect", json={"token_ids": human_like(150, seed=2)}).json()
    assert not human["watermarked"] and human["tests"] == 16 and human["keys_tested"] == 1


def test_n_choices_over_http_differ_are_each_recorded_and_detected(server):
    api = openai.OpenAI(base_url=server.url + "/v1", api_key=server.tokens["globex"], max_retries=0)
    out = api.completions.create(model="hallmark", prompt=PROMPT, max_tokens=40, n=4, temperature=1.0)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    extra = out.model_extra["hallmark"]["choices"]
    salts = [c["watermark"]["salt"] for c in extra]
    assert len(set(salts)) == 4  # distinct salts: no two choices can be the same draw
    assert len({c.text for c in out.choices}) >= 3
    assert len({c["generation_id"] for c in extra}) == 4
    assert out.usage.completion_tokens == sum(len(c["token_ids"]) for c in extra)
    for choice, meta in zip(out.choices, extra):
        assert meta["token_ids"] and choice.text
        result = client(server, "globex").post("/v1/detect", json={"token_ids": meta["token_ids"]}).json()
        assert result["key"]["salt"] == meta["watermark"]["salt"] or not result["watermarked"]
    chat = api.chat.completions.create(model="hallmark", messages=[{"role": "user", "content": "hi"}], max_tokens=20, n=2, seed=9)
    again = api.chat.completions.create(model="hallmark", messages=[{"role": "user", "content": "hi"}], max_tokens=20, n=2, seed=9)
    assert [c.message.content for c in chat.choices] == [c.message.content for c in again.choices]
    assert chat.choices[0].message.content != chat.choices[1].message.content
