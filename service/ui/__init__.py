"""The browser page at ``/ui``: static files shipped in the package, no build step, no CDN.

Served with a strict Content-Security-Policy (scripts and styles from this origin only, no
inline code, no framing), so the page works offline and an injected string cannot run.
The page talks to the same JSON API as any client, with the token the user enters once
per tab (kept in ``sessionStorage``).

``/docs`` (Swagger UI), the API reference, is served from here too, not from FastAPI's
default CDN, so it works offline: its files come from the ``fastapi-offline`` package (a
dependency that ships them for exactly this), not from this repository. It is served with
the page's headers (the same CSP, no framing), so it is started by ``docs.js``, not inline. ``/redoc`` stays off:
ReDoc's bundle loads its logo from a CDN whatever the options.
"""

from __future__ import annotations

import html
from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

STATIC = Path(__file__).parent / "static"
REFERENCE = Path(str(resources.files("fastapi_offline") / "static"))
# img-src allows data: images: Swagger UI's stylesheet draws its select arrows with them (no
# script can run from an image); everything else only from this origin.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}
ASSETS = {"app.js": "text/javascript; charset=utf-8", "check.js": "text/javascript; charset=utf-8", "heat.js": "text/javascript; charset=utf-8", "verify.js": "text/javascript; charset=utf-8", "quorum.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8",
          "favicon.svg": "image/svg+xml", "docs.js": "text/javascript; charset=utf-8"}
DOCS_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="/ui/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/ui/swagger-ui.css">
<script src="/ui/swagger-ui-bundle.js" defer></script>
<script src="/ui/docs.js" defer></script>
</head>
<body>
<div id="swagger-ui" data-openapi="/openapi.json"></div>
</body>
</html>
"""
REFERENCE_ASSETS = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8", "swagger-ui.css": "text/css; charset=utf-8"}


def mount_ui(app: FastAPI) -> None:
    """Add ``GET /ui`` (the page) and ``GET /ui/<asset>`` to ``app``."""

    @app.get("/ui", include_in_schema=False)
    def ui_page():
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS)

    @app.get("/ui/{asset}", include_in_schema=False)
    def ui_asset(asset: str):
        if asset in REFERENCE_ASSETS:
            return FileResponse(REFERENCE / asset, media_type=REFERENCE_ASSETS[asset], headers=HEADERS)
        if asset not in ASSETS:
            from service.errors import NotFound

            raise NotFound(f"no such file under /ui: {asset!r}")
        return FileResponse(STATIC / asset, media_type=ASSETS[asset], headers=HEADERS)

    @app.get("/", include_in_schema=False)
    def root():
        return RedirectResponse("/ui")

    # The API reference, with Swagger UI's files served locally (create_app sets docs_url=None),
    # under the page's headers: FastAPI's own page starts Swagger UI with an inline script, which
    # this CSP refuses, so docs.js starts it. No OAuth2 redirect page: the API's scheme is a
    # bearer token.
    docs_page = DOCS_HTML.format(title=html.escape(f"{app.title} - API reference"))

    @app.get("/docs", include_in_schema=False)
    def docs():
        return HTMLResponse(docs_page, headers=HEADERS)
