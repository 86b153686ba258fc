"""Route dependencies as ``Annotated`` aliases: ``ServicesDep`` (what the running gateway
holds) and ``IdentityDep`` (who the bearer token is).

Both are async on purpose: they are short and CPU-bound, and a thread-pool hop per call
would cost more than the work.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from service.auth import Identity, authenticate
from service.state import Services


async def services_dep(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(services_dep)]


async def identity_dep(services: ServicesDep, authorization: Annotated[str | None, Header()] = None) -> Identity:
    return authenticate(services, authorization)


IdentityDep = Annotated[Identity, Depends(identity_dep)]
