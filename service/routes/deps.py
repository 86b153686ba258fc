"""Route dependencies as ``Annotated`` aliases: ``ServicesDep`` (what the running gateway
holds), ``IdentityDep`` (who the bearer token is; expert tokens are refused: they are for
detection only) and ``DetectIdentityDep`` (any token, expert tokens included).

Both are async: a cached token costs no thread hop; a token cache miss looks the token up
in a worker thread (:func:`service.auth.authenticate_async`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from service.auth import Identity, authenticate_async
from service.errors import Forbidden
from service.state import Services


async def services_dep(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(services_dep)]


async def detect_identity_dep(services: ServicesDep, authorization: Annotated[str | None, Header()] = None) -> Identity:
    return await authenticate_async(services, authorization)


async def identity_dep(services: ServicesDep, authorization: Annotated[str | None, Header()] = None) -> Identity:
    identity = await authenticate_async(services, authorization)
    if identity.expert:
        raise Forbidden("an expert token is for detection only (POST /v1/detect)")
    return identity


IdentityDep = Annotated[Identity, Depends(identity_dep)]
DetectIdentityDep = Annotated[Identity, Depends(detect_identity_dep)]
