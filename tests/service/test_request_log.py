"""The request log and request id on a real HTTP server (uvicorn on a local port) where a test
needs a route that fails: a 500 carries the request id in its answer, and the traceback and
the access line in the log carry it too, so an operator finds the one from the other.
(The per-request lines of a real `hallmark quickstart` process are in test_first_hour_server.)"""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from service.app import create_app
from service.logs import JsonFormatter, RequestIdFilter, logging_config
from service.settings import ServiceSettings
from tests.service import gateway as gw
from tests.service.test_stream_provenance import ScriptedEngine


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(RequestIdFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def failing_server(tmp_path):
    store_settings, tokens = gw.provision(tmp_path)
    app = create_app(ServiceSettings(), engine=ScriptedEngine(), store_settings=store_settings)

    @app.get("/boom")
    def boom():
        raise RuntimeError("a bug")

    captured = Captured()
    logger = logging.getLogger("hallmark")
    logger.addHandler(captured)
    previous = logger.level
    logger.setLevel(logging.INFO)
    url, server, thread = gw.serve(app)
    try:
        yield url, captured
    finally:
        server.should_exit = True
        thread.join(30)
        logger.removeHandler(captured)
        logger.setLevel(previous)


def test_a_500_carries_the_request_id_in_the_answer_and_in_every_log_line(failing_server):
    url, captured = failing_server
    response = httpx.get(url + "/boom", headers={"x-request-id": "req-500"}, timeout=30)
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert response.headers["x-request-id"] == "req-500"
    mine = [r for r in captured.records if getattr(r, "request_id", None) == "req-500"]
    traceback = [r for r in mine if r.name == "hallmark.http" and r.exc_info]
    access = [r for r in mine if r.name == "hallmark.access"]
    assert len(traceback) == 1 and "RuntimeError: a bug" in JsonFormatter().format(traceback[0])
    assert len(access) == 1 and access[0].levelno == logging.ERROR
    assert (access[0].method, access[0].route, access[0].status) == ("GET", "/boom", 500)


def test_a_json_line_stays_one_line_with_a_traceback():
    try:
        raise ValueError("first\nsecond")
    except ValueError:
        import sys

        record = logging.LogRecord("hallmark.http", logging.ERROR, __file__, 1, "failed on %s", ("x",),
                                   sys.exc_info())
    record.request_id = "abc"
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "failed on x" and parsed["request_id"] == "abc"
    assert "ValueError: first\nsecond" in parsed["exception"]


def test_an_unknown_log_format_is_refused():
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        logging_config("xml")
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        ServiceSettings(log_format="xml")
