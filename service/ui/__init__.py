"""The browser page at ``/ui``: static files shipped in the package, no build step, no CDN.

Served with a strict Content-Security-Policy (scripts and styles from this origin only, no
inline code, no framing), so the page works offline and an injected string cannot run.
The page talks to the same JSON API as any client, with the token the user enters once
per tab (kept in ``sessionStorage``).

``/docs`` (Swagger UI), the API reference, is served from here too, not from FastAPI's
default CDN, so it works offline: its files come from the ``fastapi-offline`` package (a
dependency that ships them for exactly this), not from this repository. ``/redoc`` stays off:
ReDoc's bundle loads its logo from a CDN whatever the options.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse

STATIC = Path(__file__).parent / "static"
REFERENCE = Path(str(resources.files("fastapi_offline") / "static"))
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "font-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}
ASSETS = {"app.js": "text/javascript; charset=utf-8", "verify.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8",
          "favicon.svg": "image/svg+xml"}
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

    # The API reference, with Swagger UI's files served locally (create_app sets docs_url=None).
    from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html

    @app.get("/docs", include_in_schema=False)
    def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - API reference",
                                   swagger_js_url="/ui/swagger-ui-bundle.js", swagger_css_url="/ui/swagger-ui.css",
                                   swagger_favicon_url="/ui/favicon.svg",
                                   oauth2_redirect_url="/docs/oauth2-redirect")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    def docs_oauth2_redirect():
        return get_swagger_ui_oauth2_redirect_html()
