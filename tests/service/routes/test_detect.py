"""What ``POST /v1/detect`` (service/routes/detect.py) keeps off the event loop: bodies over
``detect_parse_inline_bytes`` are parsed and validated elsewhere (here in a worker thread:
``detect_workers`` 0), answered as a small body's are, and a malformed one gets the same 422
as a small malformed one; a principal over its share of lane time while another is active has
even its small bodies detected elsewhere. Timing belongs to bench/detect_flood.py."""

from __future__ import annotations

import random
import threading

import httpx
import pytest

from service import detection
from service.routes import detect as route
from tests.service import gateway as gw


@pytest.fixture(scope="module")
def parsing(tmp_path_factory):
    gateway = gw.start(tmp_path_factory.mktemp("parse"), draft_model=None, detect_parse_inline_bytes=2_048)
    yield gateway
    gateway.stop()


@pytest.fixture
def parsed_on(monkeypatch):
    """The thread each body was parsed on (the real parse, recorded)."""
    threads: list[threading.Thread] = []
    real = route._well_formed

    def recorded(raw, content_type):
        threads.append(threading.current_thread())
        return real(raw, content_type)

    monkeypatch.setattr(route, "_well_formed", recorded)
    return threads


def test_a_body_over_the_inline_size_is_parsed_off_the_event_loop_and_answered_alike(parsing, parsed_on):
    auth = {"Authorization": f"Bearer {parsing.tokens['acme']}"}
    rng = random.Random(5)
    small = [rng.randrange(300, 5000) for _ in range(200)]  # ~1.2 KB of JSON
    large = small + [rng.randrange(300, 5000) for _ in range(1_800)]  # ~12 KB
    with httpx.Client(base_url=parsing.url, timeout=120) as client:
        inline = client.post("/v1/detect", json={"token_ids": small}, headers=auth)
        off = client.post("/v1/detect", json={"token_ids": large}, headers=auth)
    assert inline.status_code == 200 and off.status_code == 200, (inline.text, off.text)
    assert len(parsed_on) == 2
    loop_thread, other = parsed_on
    assert other is not loop_thread  # the large body's parse ran on a worker thread, not the loop's
    assert off.json()["total_tokens"] == len(large) and inline.json()["total_tokens"] == len(small)
    assert set(off.json()) == set(inline.json())  # the same answer's shape


def test_a_malformed_body_over_the_inline_size_gets_the_same_422_as_a_small_one(parsing):
    auth = {"Authorization": f"Bearer {parsing.tokens['acme']}", "Content-Type": "application/json"}
    with httpx.Client(base_url=parsing.url, timeout=120) as client:
        answers = [client.post("/v1/detect", content='{"token_ids": [' + "7, " * n + '"x"]}', headers=auth)
                   for n in (3, 3_000)]
        broken = [client.post("/v1/detect", content='{"token_ids": [' + "7, " * n, headers=auth) for n in (3, 3_000)]
    for small, large in (answers, broken):
        assert small.status_code == large.status_code == 422, (small.text, large.text)
        assert small.json()["error"]["code"] == large.json()["error"]["code"]


@pytest.fixture(scope="module")
def streaming(tmp_path_factory):
    # A share so small that one detection's lane time puts its principal over it; a window long
    # enough that "another principal began a turn lately" holds across a busy machine's pauses.
    gateway = gw.start(tmp_path_factory.mktemp("share"), draft_model=None, detect_fair_share=1e-6,
                       detect_fair_window_s=60)
    yield gateway
    gateway.stop()


def test_an_over_share_principals_small_body_is_detected_off_the_event_loop(streaming, monkeypatch):
    threads: list[threading.Thread] = []
    real = detection.detect

    def recorded(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(detection, "detect", recorded)
    auth = {"Authorization": f"Bearer {streaming.tokens['acme']}"}
    other = {"Authorization": f"Bearer {streaming.tokens['globex']}"}
    with httpx.Client(base_url=streaming.url, timeout=120) as client:
        answers = [client.post("/v1/detect", json={"text": f"a short check number {i}"}, headers=auth)
                   for i in range(2)]
        answers.append(client.post("/v1/detect", json={"text": "another tenant's check"}, headers=other))
        answers.append(client.post("/v1/detect", json={"text": "a short check number 2"}, headers=auth))
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    first, alone, others, contended = threads
    assert alone is first  # over its share but alone: nobody to delay, it keeps the loop
    assert others is first  # another principal's first check: on the loop
    assert contended is not first  # over its share while another is active: a worker thread
    assert set(answers[3].json()) == set(answers[0].json())
