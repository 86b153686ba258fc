"""Route dependencies as ``Annotated`` aliases: ``ServicesDep`` (what the running gateway
holds) and ``IdentityDep`` (who the bearer token is).

Both are async: a cached token costs no thread hop; a token cache miss looks the token up
in a worker thread (:func:`service.auth.authenticate_async`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from service.auth import Identity, authenticate_async
from service.state import Services


async def services_dep(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(services_dep)]


async def identity_dep(services: ServicesDep, authorization: Annotated[str | None, Header()] = None) -> Identity:
    return await authenticate_async(services, authorization)


IdentityDep = Annotated[Identity, Depends(identity_dep)]
