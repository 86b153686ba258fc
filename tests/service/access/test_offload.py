"""Large detections in a worker process (service.access.offload), against a running gateway:
the answer is the one the gateway's own thread gives, the worker reads keys revoked after it
started, and a small check of another principal is answered while large ones keep a worker busy."""

from __future__ import annotations

import concurrent.futures
import random
import time

import httpx
import pytest

from service import detection
from service.access import offload
from service.auth import authenticate
from service.schemas import DetectBody
from tests.service import gateway as gw
from tests.service.access.conftest import with_expert_and_generation

VOLATILE = {"report", "created_at", "detected_at", "elapsed_ms"}


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    gateway = gw.start(tmp_path_factory.mktemp("offload"), draft_model=None, secrets=gw.FIXED_SECRETS,
                       detect_workers=1, public_tokens_per_day=1e7, probe_family_per_day=100, key_cache_seconds=0.5,
                       detect_worker_nice=7)
    client = with_expert_and_generation(gateway)
    yield gateway
    client.close()
    gateway.stop()


def _stable(found: dict) -> dict:
    return {k: v for k, v in found.items() if k not in VOLATILE}


def test_a_large_body_is_answered_by_the_worker_as_by_the_gateways_thread(workers):
    services = workers.app.state.services
    ids = services.engine.tokenizer().encode(workers.generated, add_special_tokens=False)
    rng = random.Random(1)
    body = {"token_ids": ids + [rng.randrange(300, 5000) for _ in range(2_500)]}  # over the inline size
    expert = {"Authorization": f"Bearer {workers.tokens['expert']}"}
    answered = workers.client.post("/v1/detect", json=body, headers=expert)
    assert answered.status_code == 200, answered.text
    assert getattr(services, "_offload", None) is not None  # the pool answered it
    assert any(p.is_alive() for p in services._offload._pool._processes.values())
    here = detection.detect(services, authenticate(services, expert["Authorization"]), DetectBody(**body))
    assert _stable(answered.json()) == _stable(here)
    assert answered.json()["ledger_matches"] or answered.json()["kgram_matches"]  # the worker read the ledger


def test_the_worker_runs_at_a_lower_cpu_priority_than_the_gateway(workers):
    """The worker takes what the gateway's event loop leaves (issue 31 item 5), by the
    settings' ``detect_worker_nice`` (7 here; 10 by default)."""
    import psutil

    services = workers.app.state.services
    text = (workers.generated + " ") * 12
    answered = workers.client.post("/v1/detect", json={"text": text},
                                   headers={"Authorization": f"Bearer {workers.tokens['acme']}"})
    assert answered.status_code == 200, answered.text
    own = psutil.Process().nice()
    pids = list(services._offload._pool._processes)
    assert services.settings.detect_worker_nice == 7 != offload.WORKER_NICE
    assert pids and all(psutil.Process(pid).nice() == min(19, own + 7) for pid in pids)


def test_a_large_body_is_parsed_in_the_worker_and_a_malformed_one_gets_the_same_422(workers, monkeypatch):
    """Over ``detect_parse_inline_bytes`` (16 KiB) the body's JSON parse and validation run in
    the worker (service.routes.detect._parsed), not on the gateway's event loop."""
    calls = []
    real = offload.Offload.call

    async def counted(self, services, fn, *args):
        calls.append(fn.__name__)
        return await real(self, services, fn, *args)

    monkeypatch.setattr(offload.Offload, "call", counted)
    auth = {"Authorization": f"Bearer {workers.tokens['acme']}", "Content-Type": "application/json"}
    rng = random.Random(3)
    ids = [rng.randrange(300, 5000) for _ in range(4_000)]  # ~24 KB of JSON
    answered = workers.client.post("/v1/detect", json={"token_ids": ids}, headers=auth)
    assert answered.status_code == 200, answered.text
    assert answered.json()["total_tokens"] == len(ids)
    assert calls == ["_well_formed"]
    small, large = (workers.client.post("/v1/detect", content='{"token_ids": [' + "7, " * n + '"x"]}', headers=auth)
                    for n in (3, 6_000))
    assert small.status_code == large.status_code == 422, (small.text, large.text)
    assert small.json()["error"]["code"] == large.json()["error"]["code"]
    assert calls == ["_well_formed"] * 2  # the small one on the loop


def test_the_tenant_and_public_tiers_answer_large_bodies_through_the_worker(workers):
    text = (workers.generated + " ") * 12  # > the inline size in characters
    tenant = workers.client.post("/v1/detect", json={"text": text},
                                 headers={"Authorization": f"Bearer {workers.tokens['acme']}"})
    assert tenant.status_code == 200, tenant.text
    assert tenant.json()["watermarked"] is True
    public = workers.client.post("/v1/public/detect", json={"text": text})
    assert public.status_code == 200, public.text
    assert public.json()["verdict"] == "watermarked"
    # A large text under the public minimum: its count (made in the worker) is the gateway's own.
    services = workers.app.state.services
    dashes = "-" * 2_500
    count = len(detection.Tokenised(services.engine.tokenizer()).encode(dashes)[0])
    assert count < services.settings.public_min_tokens
    short = workers.client.post("/v1/public/detect", json={"text": dashes})
    assert short.status_code == 200, short.text
    assert short.json()["tokens"] == count and short.json()["confidence"] == "none"


def test_a_small_check_is_answered_while_another_principal_floods_large_bodies(workers):
    rng = random.Random(2)
    flood = {"Authorization": f"Bearer {workers.tokens['globex']}"}
    with httpx.Client(base_url=workers.url, timeout=120) as other, \
            concurrent.futures.ThreadPoolExecutor(4) as pool:
        bodies = [{"token_ids": [rng.randrange(300, 8000) for _ in range(8000)]} for _ in range(8)]
        sent = [pool.submit(other.post, "/v1/detect", json=body, headers=flood) for body in bodies]
        small = workers.client.post("/v1/detect", json={"text": "a short check of its own"},
                                    headers={"Authorization": f"Bearer {workers.tokens['acme']}"})
        statuses = sorted(f.result().status_code for f in sent)
    assert small.status_code == 200
    assert set(statuses) <= {200, 429} and 200 in statuses  # 429: the flood's own slots and lane queue


def test_the_worker_sees_a_key_revoked_after_it_started(workers):
    """The gateway clears its key cache on a revocation; the worker is not told, and sees it
    within its key cache's time (key_cache_seconds, as another replica would)."""
    text = (workers.generated + " ") * 12
    auth = {"Authorization": f"Bearer {workers.tokens['acme']}"}
    assert workers.client.post("/v1/detect", json={"text": text}, headers=auth).json()["key"]["state"] == "active"
    keys = workers.client.get("/v1/admin/keys", params={"tenant": "acme"},
                              headers={"Authorization": f"Bearer {workers.tokens['admin']}"}).json()["keys"]
    for key in keys:
        gw.revoke(workers, key["key_id"])
    deadline = time.monotonic() + 30
    while True:  # polled until the worker's key cache (0.5 s here) has expired
        after = workers.client.post("/v1/detect", json={"text": text}, headers=auth)
        assert after.status_code == 200, after.text
        if after.json()["key"]["state"] == "revoked" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert after.json()["key"]["state"] == "revoked"
