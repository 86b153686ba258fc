"""The gateway's OpenAPI document as the tests of it read it (test_openapi, test_openapi_docs)."""

from __future__ import annotations

from service import openapi
from service.app import create_app
from service.settings import ServiceSettings


def build_doc() -> dict:
    app = create_app(ServiceSettings(max_tokens_cap=64, default_max_tokens=16))
    return openapi.build(app, max_tokens_cap=64, vocab_size=8192)


def operations(doc):
    """(method, path, operation) of every operation."""
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            yield method, path, operation
