"""``GET /.well-known/hallmark-keys.json``: the public keys that sign receipts and detection
reports (retired ones too, so old receipts keep verifying). Public: no token needed."""

from __future__ import annotations

from fastapi import APIRouter

from service.responses import KeySet, ok
from service.routes.deps import ServicesDep

router = APIRouter(tags=["Provenance"])


@router.get("/.well-known/hallmark-keys.json", summary="The signing keys", responses=ok(KeySet))
def signing_keys_route(services: ServicesDep):
    """The public keys that sign receipts and detection reports, retired ones included, with the
    transparency log's key: what offline verification pins. No token needed."""
    return services.public_keyset()
