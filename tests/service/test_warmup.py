"""Issue 30 item 3: the detector's compiled paths are built when the gateway starts, before
``/readyz`` can answer, and no detection compiles anything afterwards."""

from __future__ import annotations

import sys
import threading

import httpx
import pytest
import uvicorn

from service import warmup
from service.app import create_app
from service.settings import ServiceSettings
from tests.service import gateway as gw

numba = pytest.importorskip("numba")


def _signatures() -> dict[str, int]:
    """Compiled signatures per numba dispatcher of Hallmark's modules (a compile adds one):
    watermark.jit.compile_all puts the compiled functions in their module's globals. (Not
    gc.get_objects(): the gateway's start freezes them out of the collector's view.)"""
    from numba.core.registry import CPUDispatcher

    return {f"{name}.{attr}": len(value.signatures) for name, module in list(sys.modules.items())
            if name.split(".")[0] in ("watermark", "detector", "service") and module is not None
            for attr, value in list(vars(module).items()) if isinstance(value, CPUDispatcher)}


def test_readyz_answers_only_after_the_warm_up(tmp_path, monkeypatch):
    entered, release, done = threading.Event(), threading.Event(), threading.Event()
    original = warmup.warm_detection

    def held(engine=None):
        entered.set()
        release.wait(300)
        try:
            return original(engine)
        finally:
            done.set()

    monkeypatch.setattr(warmup, "warm_detection", held)
    store_settings, _ = gw.provision(tmp_path, secrets=gw.FIXED_SECRETS)
    app = create_app(ServiceSettings(model=gw.TEST_MODEL, draft_model=gw.TEST_DRAFT, device="cpu"),
                     store_settings=store_settings)
    port = gw._free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert entered.wait(300), "the warm-up never started"
        # Held in the warm-up: nothing answers yet, readiness included.
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert not server.started
        release.set()
        assert done.wait(300)
        while not server.started and thread.is_alive():  # the lifespan's last steps, then the socket
            thread.join(0.05)
        r = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "ready"
    finally:
        release.set()
        server.should_exit = True
        thread.join(60)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    gateway = gw.start(tmp_path_factory.mktemp("warm"), secrets=gw.FIXED_SECRETS, modes={"acme": "diverse"},
                       probe_family_per_day=1000)
    yield gateway
    gateway.stop()


def test_no_detection_compiles_after_start(served):
    before = _signatures()
    assert before, "numba loaded at start, with compiled functions"
    headers = {"Authorization": f"Bearer {served.tokens['acme']}"}
    generated = httpx.post(served.url + "/v1/generate", headers=headers, timeout=300,
                           json={"prompt": "The function returns", "max_tokens": 80, "seed": 2}).json()
    bodies = [{"text": generated["text"]}, {"text": generated["text"] + " edited"},
              {"token_ids": generated["token_ids"]}, {"text": generated["text"], "statistic": "max"},
              {"text": "A short human text, nothing to find here at all."}]
    for who in ("acme", "globex"):
        for body in bodies:
            r = httpx.post(served.url + "/v1/detect", json=body, timeout=60,
                           headers={"Authorization": f"Bearer {served.tokens[who]}"})
            assert r.status_code in (200, 409), r.text  # 409: a statistic the key cannot use
    after = _signatures()
    grown = {k: (before.get(k, 0), v) for k, v in after.items() if v != before.get(k, 0)}
    assert not grown, f"a detection compiled {len(grown)} numba function(s) after start"
