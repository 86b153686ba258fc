"""``GET /.well-known/hallmark-keys.json``: the public keys that sign receipts and detection
reports (retired ones too, so old receipts keep verifying). Public: no token needed."""

from __future__ import annotations

from fastapi import APIRouter

from service.routes.deps import ServicesDep

router = APIRouter()


@router.get("/.well-known/hallmark-keys.json")
def signing_keys_route(services: ServicesDep):
    return services.public_keyset()
