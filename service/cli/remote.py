"""Talking to a gateway from a verifying command (``receipt verify --url``, ``ledger
witness --url``): https only, except to this machine.

A verifier fetching public keys or checkpoints over plain http could be handed anyone's
(a network attacker's keys verify the attacker's forgeries). Pinning the log key protects
the key set; https protects the rest and the first contact. Loopback (localhost, 127.0.0.1,
::1) is exempt: nothing crosses a network.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from service.cli.app import CliError

LOOPBACK = ("localhost", "127.0.0.1", "::1")


def base_url(url: str) -> str:
    """``url`` without a trailing slash; :class:`CliError` unless https (or http to loopback)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise CliError(f"not a URL: {url!r}") from None
    if parts.scheme == "https" and parts.hostname:
        return url.rstrip("/")
    if parts.scheme == "http" and parts.hostname in LOOPBACK:
        return url.rstrip("/")
    if parts.scheme == "http":
        raise CliError(f"--url must be https:// (plain http is allowed only to localhost, 127.0.0.1 or ::1): {url}")
    raise CliError(f"--url must be an https:// URL of a Hallmark gateway: {url}")


def fetch(url: str, path: str, *, params: dict[str, Any] | None = None, as_json: bool = True) -> Any:
    """GET ``path`` of the gateway at ``url`` (checked by :func:`base_url`): parsed JSON, or text."""
    import httpx

    target = base_url(url) + path
    try:
        response = httpx.get(target, params=params, timeout=15.0, follow_redirects=False)
        response.raise_for_status()
        return response.json() if as_json else response.text
    except httpx.HTTPStatusError as exc:
        raise CliError(f"{target} answered {exc.response.status_code}") from None
    except (httpx.HTTPError, ValueError) as exc:
        raise CliError(f"cannot fetch {target}: {type(exc).__name__}") from None
