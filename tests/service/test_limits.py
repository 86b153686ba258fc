"""Load limits: token buckets on every backend (this process, the database, a real Redis),
a token cache that a flood of unknown tokens cannot empty, per-tenant generation limits
(429 with Retry-After), and two gateway processes on one PostgreSQL database holding the
combined detection limit."""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from keys import migrate
from keys.db import create_store_engine, open_store
from keys.settings import StoreSettings
from service.caching import TokenCache
from service.limits import DatabaseBuckets, FailoverBuckets, MemoryBuckets, RedisBuckets
from tests.keys.conftest import reachable_pg_server
from tests.service import gateway as gw

REDIS_URL = os.environ.get("HALLMARK_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pg():
    server = reachable_pg_server()
    yield server
    server.close()


def _pg_url(pg) -> str:
    url = pg.url_for(pg.create_database())
    engine = create_store_engine(url)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    return url


def _redis():
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001
        if os.environ.get("CI"):
            pytest.fail(f"Redis not reachable at {REDIS_URL}: {exc}")
        pytest.skip(f"Redis not reachable at {REDIS_URL}")
    return client


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "redis"])
def buckets(request, tmp_path):
    if request.param == "memory":
        yield MemoryBuckets()
    elif request.param == "redis":
        _redis()
        yield RedisBuckets(REDIS_URL, prefix=f"hallmark-test:{secrets.token_hex(4)}:")
    else:
        url = f"sqlite:///{tmp_path / 'b.db'}" if request.param == "sqlite" else _pg_url(request.getfixturevalue("pg"))
        store = open_store(StoreSettings(database_url=url), check_schema=False, create=True)
        migrate.upgrade(store.engine)
        yield DatabaseBuckets(store)
        store.close()


def test_bucket_takes_refuses_refunds(buckets):
    rate, burst = 0.001, 3.0  # refills one unit in ~17 minutes: nothing refills during the test
    # Generation token buckets ("gen:"): the only ones a refund may go to on PostgreSQL (migration 0013).
    assert [buckets.take("gen:a", 1, rate, burst) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = buckets.take("gen:a", 1, rate, burst)
    assert 900 < wait < 1100  # (1 - level) / rate
    assert buckets.take("gen:b", 1, rate, burst) == 0.0  # buckets are independent
    assert buckets.take("gen:a", -2, rate, burst) == 0.0  # a refund
    assert buckets.take("gen:a", 2, rate, burst) == 0.0
    assert math.isinf(buckets.take("gen:c", 4, rate, burst))  # more than the bucket ever holds
    assert buckets.take("gen:c", -10, rate, burst) == 0.0 and buckets.take("gen:c", 3, rate, burst) == 0.0  # capped


def test_on_postgresql_a_detection_bucket_takes_no_refund_and_keeps_its_rate(buckets):
    """The owner's hallmark_take_bucket() is the table's one write path on PostgreSQL (issue 31):
    a detection's rate bucket cannot be refunded, and a caller passing a larger rate or burst
    than the bucket was created with refills nothing."""
    if not isinstance(buckets, DatabaseBuckets) or not buckets._postgres:
        pytest.skip("PostgreSQL's owner function")
    assert [buckets.take("detect:t", 1, 0.001, 2.0) for _ in range(2)] == [0.0, 0.0]
    with pytest.raises(Exception, match="refund"):
        buckets.take("detect:t", -2, 0.001, 2.0)
    assert buckets.take("detect:t", 1, 1e9, 1e9) > 100  # still the pinned 0.001 a second


def test_a_failing_shared_backend_falls_back_to_this_process():
    class Down:
        def take(self, *args):
            raise ConnectionError("down")

    failover = FailoverBuckets(Down())
    assert [failover.take("x", 1, 0.001, 2) for _ in range(2)] == [0.0, 0.0]
    assert failover.take("x", 1, 0.001, 2) > 0


def test_a_flood_of_unknown_tokens_evicts_no_known_token():
    cache = TokenCache(ttl=60, max_entries=100)
    for i in range(100):
        cache.store(f"known{i}", i)
    loads = 0

    def load():
        nonlocal loads
        loads += 1
        return None

    for i in range(100_000):
        assert cache.get_or_load(f"fake{i}", load) is None
    assert all(cache.lookup(f"known{i}") == (True, i) for i in range(100))
    # The most recent unknown tokens are remembered: repeating one costs no load.
    assert cache.get_or_load("fake99999", load) is None and loads == 100_000


# ------------------------------------------------------------------ per-tenant generation limits

@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    gateway = gw.start(tmp_path_factory.mktemp("limits"), draft_model=None, max_tokens_cap=40, default_max_tokens=8,
                       tenant_max_concurrent_generations=1, tenant_tokens_per_minute=60)
    yield gateway
    gateway.stop()


def _generate(server, who, **body):
    return httpx.post(server.url + "/v1/generate", json={"prompt": "The function", **body},
                      headers={"Authorization": f"Bearer {server.tokens[who]}"}, timeout=120)


@pytest.mark.slow
def test_tenant_concurrency_limit_gives_429_with_retry_after(limited, monkeypatch):
    engine = limited.app.state.services.engine
    real_generate = engine.generate
    release = threading.Event()

    async def held(request):  # the first generation waits until the test lets it go
        while not release.is_set():
            await asyncio.sleep(0.02)
        async for event in real_generate(request):
            yield event

    monkeypatch.setattr(engine, "generate", held)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(_generate, limited, "acme", max_tokens=2)
        services = limited.app.state.services
        acme = services.tenant_id("acme")
        deadline = time.monotonic() + 30
        while not services.tenant_limits.running(acme) and time.monotonic() < deadline:
            time.sleep(0.02)
        second = _generate(limited, "acme", max_tokens=2)
        assert second.status_code == 429 and second.headers["Retry-After"] == "1", second.text
        assert second.json()["error"]["code"] == "too_many_concurrent_generations"
        release.set()
        assert first.result().status_code == 200
    monkeypatch.setattr(engine, "generate", real_generate)
    assert not services.tenant_limits.running(acme)
    assert _generate(limited, "acme", max_tokens=2).status_code == 200
    assert _generate(limited, "globex", max_tokens=2).status_code == 200


@pytest.mark.slow
def test_tenant_token_budget_gives_429_with_retry_after(limited):
    # 60 tokens a minute: 40 reserved, the unused part given back, then the budget runs out.
    first = _generate(limited, "globex", max_tokens=40, temperature=0)
    assert first.status_code == 200
    used = first.json()["usage"]["completion_tokens"]
    refused = None
    for _ in range(5):
        response = _generate(limited, "globex", max_tokens=40, temperature=0)
        if response.status_code == 429:
            refused = response
            break
    assert refused is not None, used
    assert refused.json()["error"]["code"] == "token_rate_limited" and int(refused.headers["Retry-After"]) >= 1


# ------------------------------------------------------------------ shared limits across replicas

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(store_settings: StoreSettings, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    environment = {**os.environ, "PYTHONPATH": str(REPO), "HALLMARK_DATABASE_URL": store_settings.database_url,
                   "HALLMARK_KEK_FILE": str(store_settings.kek_file), "HALLMARK_DEVICE": "cpu",
                   "HALLMARK_MODEL": gw.TEST_MODEL, **env}
    process = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port),
                                "--draft-model", ""], cwd=REPO, env=environment,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return process, f"http://127.0.0.1:{port}"


def _wait_ready(process: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited: {process.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("gateway did not become ready")


def test_two_redis_clients_share_one_budget():
    _redis()
    prefix = f"hallmark-test:{secrets.token_hex(4)}:"
    replicas = [RedisBuckets(REDIS_URL, prefix=prefix) for _ in range(2)]  # as two processes would hold
    taken = [replicas[i % 2].take("detect:t", 1, 0.001, 6) == 0.0 for i in range(12)]
    assert taken == [True] * 6 + [False] * 6


@pytest.mark.slow
@pytest.mark.postgres
def test_two_gateway_processes_hold_the_combined_detection_limit(pg, tmp_path):
    env = {"HALLMARK_DETECT_RATE_PER_MINUTE": "0.1", "HALLMARK_DETECT_BURST": "6"}
    store_settings, tokens = gw.provision(tmp_path, _pg_url(pg))
    replicas = [_serve(store_settings, env) for _ in range(2)]
    try:
        for process, url in replicas:
            _wait_ready(process, url)
        headers = {"Authorization": f"Bearer {tokens['acme']}"}
        # A new input each time: one input sent again and again is the probe guard's (service/access).
        statuses = [httpx.post(replicas[i % 2][1] + "/v1/detect", json={"token_ids": [1, 2, 3 + i]}, headers=headers,
                               timeout=60).status_code for i in range(12)]
        assert statuses.count(200) == 6 and statuses.count(429) == 6, statuses
        assert statuses[:6] == [200] * 6
        # Another token has its own budget on both replicas.
        other = {"Authorization": f"Bearer {tokens['globex']}"}
        assert all(httpx.post(url + "/v1/detect", json={"token_ids": [1]}, headers=other, timeout=60).status_code
                   == 200 for _, url in replicas)
    finally:
        for process, _ in replicas:
            process.send_signal(signal.SIGTERM)
        for process, _ in replicas:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
