"""/metrics on its own listener (HALLMARK_METRICS_LISTEN), and detection metrics that do not
reveal a single check on a quiet server: counts in whole tens, no detection latencies."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.service import gateway as gw


def _samples(text: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def test_metrics_on_their_own_listener_and_detections_in_whole_tens(tmp_path):
    port = gw._free_port()
    server = gw.start(tmp_path, draft_model=None, metrics_listen=f"127.0.0.1:{port}")
    try:
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        assert httpx.get(server.url + "/metrics").status_code == 404
        headers = {"Authorization": f"Bearer {server.tokens['acme']}"}
        assert httpx.post(server.url + "/v1/detect", json={"text": "one quiet check"}, headers=headers,
                          timeout=60).status_code == 200
        one = _samples(httpx.get(metrics_url, timeout=10).text)
        detections = [s for s in one if s.name == "hallmark_detections_total"]
        assert detections and all(s.value == 0 for s in detections)  # one check: nothing to see
        routes = [s for s in one if s.labels.get("route") in ("/v1/detect", "/v1/public/detect")]
        assert all(s.value == 0 for s in routes)
        assert not any(s.name.startswith("hallmark_http_request_duration_seconds") for s in routes)
        for i in range(9):
            httpx.post(server.url + "/v1/detect", json={"text": f"check {i}"}, headers=headers, timeout=60)
        ten = _samples(httpx.get(metrics_url, timeout=10).text)
        assert sum(s.value for s in ten if s.name == "hallmark_detections_total") == 10
        # Other routes are exported as before.
        assert any(s.labels.get("route") == "/v1/detect" and s.value == 10 for s in ten
                   if s.name == "hallmark_http_requests_total")
    finally:
        server.stop()
