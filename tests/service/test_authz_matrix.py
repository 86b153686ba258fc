"""The authorization matrix: every route × every credential × own/other tenant.

Credentials: a tenant token, a tenant-scoped admin token, a global admin token, a revoked
token, an unknown token, none. "own" targets tenant acme (the tenant of the tenant and
scoped-admin tokens), "other" targets tenant globex. Each cell asserts the exact status
and that nothing of the other tenant leaks: a refusal names no id of globex, and is the
same answer (status and text, the caller's own input aside) as for a tenant, generation
or key that does not exist at all.

``test_every_route_is_in_the_matrix`` fails when a route is added without a row here.
"""

from __future__ import annotations

import itertools

import httpx
import pytest

from keys.db import open_store
from ledger.entries import record_generation
from keys.lifecycle import create_key, list_keys
from keys.tenants import get_tenant
from keys.tokens import issue_token, revoke_token
from service.app import create_app
from service.settings import ServiceSettings
from tests.service import gateway as gw
from tests.service.test_stream_provenance import ScriptedEngine

_PUBLIC_TEXTS = itertools.count()


def _public_text() -> str:
    """A text unlike the others: the probe guard compares token windows (issue 31), and the
    scripted engine's tokens are characters, so "a public check 1" and "... 2" are one text."""
    import secrets

    return f"a public check {next(_PUBLIC_TEXTS)} {secrets.token_hex(16)} {secrets.token_hex(16)}"
CREDENTIALS = ("tenant", "scoped_admin", "global_admin", "revoked", "unknown", "none")
TARGETS = ("own", "other")
GLOBAL = "global_admin"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    store_settings, tokens = gw.provision(tmp_path_factory.mktemp("authz"))
    store = open_store(store_settings, require_kek=True)
    ids = {}
    with store.transaction() as session:
        tokens["scoped_admin"] = issue_token(session, tenant="acme", admin=True, actor="test").raw_token
        revoked = issue_token(session, tenant="acme", actor="test")
        tokens["revoked"] = revoked.raw_token
        revoke_token(session, token_id=revoked.info.token_id, actor="test")
        for name in ("acme", "globex"):
            tenant = get_tenant(session, name=name)
            ids[name] = tenant.id
            ids[f"{name}_generation"] = record_generation(
                session, tenant_id=tenant.id, key_id=None, key_version=None, engine="scripted", model="m",
                spec=None, prompt_tokens=1, watermarked_tokens=0, unwatermarked_reason="opt_out",
                output_text=f"{name} text", token_ids=[1]).id
    tokens["unknown"] = "hm_" + "x" * 43
    tokens["tenant"] = tokens["acme"]
    tokens["global_admin"] = tokens["admin"]
    engine = ScriptedEngine()
    app = create_app(ServiceSettings(detect_rate_per_minute=100_000, detect_burst=100_000), engine=engine,
                     store_settings=store_settings)
    url, server, thread = gw.serve(app)
    yield {"url": url, "tokens": tokens, "ids": ids, "store": store, "app": app}
    store.close()
    server.should_exit = True
    thread.join(30)


def _spare_key(world, tenant: str) -> str:
    """A fresh verify-only key of ``tenant`` (to revoke without disturbing other cells)."""
    store = world["store"]
    with store.transaction() as session:
        return create_key(session, store.keyring, tenant=tenant, actor="test").key_id


def _call(world, credential: str, method: str, path: str, body=None) -> httpx.Response:
    headers = {} if credential == "none" else {"Authorization": f"Bearer {world['tokens'][credential]}"}
    return httpx.request(method, world["url"] + path, json=body, headers=headers, timeout=60)


def _tenant(target):
    return "acme" if target == "own" else "globex"


# Each row: (method, path template, body template, expected(credential, target) -> status).
UNAUTHENTICATED = ("revoked", "unknown", "none")


def _expect(*, ok=200, other=403, tenant_token=None, global_admin=None):
    """The status a cell expects: 401 without a valid token; then ``tenant_token`` for a
    tenant token and ``global_admin`` for a global admin where given; otherwise ``ok`` for
    a global admin or the credential's own tenant and ``other`` for another tenant."""
    def expected(credential, target):
        if credential in UNAUTHENTICATED:
            return 401
        if credential == "tenant" and tenant_token is not None:
            return tenant_token
        if credential == GLOBAL:
            return ok if global_admin is None else global_admin
        return ok if target == "own" else other
    return expected


def _scoped(ok_status=200):
    """Tenant-scoped routes: tenant tokens and scoped admins act for their own tenant only."""
    return _expect(ok=ok_status)


# Admin routes: never a tenant token's.
_admin_scoped = _expect(tenant_token=403)
# Reads by id: another tenant's record reads as absent (404), exactly as a missing one.
_lookup = _expect(other=404)
_authenticated = _expect(other=200)
# No tenant field in OpenAI's schemas: one sent is refused (400 unsupported_parameter, issue 35
# item 6), whoever sends it; without it a tenant token acts for its tenant, and a global admin
# must use /v1/generate to name a tenant (403).
def _openai(credential, target):
    if credential in UNAUTHENTICATED:
        return 401
    if target == "other":  # the body names a tenant
        return 400
    return 403 if credential == GLOBAL else 200
_revoke = _expect(other=404, tenant_token=403)


def _public(credential, target):
    return 200


ROUTES = [
    ("POST", "/v1/generate", lambda t: {"prompt": "hi", "max_tokens": 2, "tenant": t}, _scoped()),
    ("POST", "/v1/generate", lambda t: {"prompt": "hi", "max_tokens": 2, "tenant": t, "stream": True}, _scoped()),
    ("POST", "/v1/generate", lambda t: {"prompt": "hi", "max_tokens": 2, "tenant": t, "watermark": False},
     lambda c, t: 403 if c == "tenant" and t == "own" else _scoped()(c, t)),
    ("POST", "/v1/completions", lambda t: {"prompt": "hi", "max_tokens": 2, **({} if t == "acme" else {"tenant": t})},
     _openai),
    ("POST", "/v1/chat/completions", lambda t: {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                 **({} if t == "acme" else {"tenant": t})}, _openai),
    ("POST", "/v1/detect", lambda t: {"token_ids": [1, 2, 3, 4], "tenant": t}, _scoped()),
    ("GET", "/v1/generations/{generation}", None, _lookup),
    ("GET", "/v1/generations/{generation}/receipt", None, _lookup),
    ("GET", "/v1/generations?tenant={tenant}", None, _scoped()),
    ("GET", "/v1/models", None, _authenticated),
    ("GET", "/v1/me", None, _authenticated),
    ("GET", "/v1/admin/tenants", None, lambda c, t: 403 if c == "tenant" else _authenticated(c, t)),
    ("GET", "/v1/admin/keys?tenant={tenant}", None, _admin_scoped),
    ("GET", "/v1/admin/audit?tenant={tenant}", None, _admin_scoped),
    ("POST", "/v1/admin/keys/rotate", lambda t: {"tenant": t}, _admin_scoped),
    ("POST", "/v1/admin/keys/{spare_key}/revoke", lambda t: {"reason": "matrix test"}, _revoke),
    # The public check answers every caller alike (a token, valid or not, is not read); each call a
    # new text, so that the probe guard (one client address for the whole matrix) never counts them.
    ("POST", "/v1/public/detect", lambda t: {"text": _public_text()}, _public),
    ("GET", "/.well-known/hallmark-keys.json", None, _public),
    ("GET", "/v1/ledger/checkpoint", None, _public),
    ("GET", "/v1/ledger/proof/inclusion?leaf_index=0", None, _public),
    ("GET", "/v1/ledger/proof/inclusion-by-hash?leaf_hash=" + "0" * 64, None, lambda c, t: 404),
    ("GET", "/v1/ledger/proof/consistency?from=0", None, _public),
    ("GET", "/v1/ledger/log/checkpoint", None, _public),
    ("GET", "/v1/ledger/log/tile/0/000.p/1", None, _public),
    ("GET", "/healthz", None, _public),
    ("GET", "/readyz", None, _public),
    # Aggregate traffic: a global admin's, or a token's with the `metrics` scope (issue 35 item 5).
    ("GET", "/metrics", None, lambda c, t: 401 if c in UNAUTHENTICATED else 200 if c == GLOBAL else 403),
    ("GET", "/", None, lambda c, t: 307),  # the /ui page's redirect (static, public)
]


def test_every_route_is_in_the_matrix(world):
    served = {(method, route.path) for route in world["app"].routes for method in getattr(route, "methods", ())
              if method not in ("HEAD", "OPTIONS") and not route.path.startswith(("/docs", "/redoc", "/openapi"))
              and not route.path.startswith("/ui")}
    covered = {(method, path.split("?")[0].replace("{generation}", "{generation_id}").replace("{spare_key}", "{key_id}")
                .replace("/tile/0/000.p/1", "/tile/{path:path}"))
               for method, path, _, _ in ROUTES}
    assert served <= covered, f"routes without authorization cells: {sorted(served - covered)}"


@pytest.mark.parametrize("credential", CREDENTIALS)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("row", range(len(ROUTES)), ids=[f"{m} {p.split('?')[0]}" for m, p, _, _ in ROUTES])
def test_cell(world, row, credential, target):
    method, template, body, expected = ROUTES[row]
    tenant = _tenant(target)
    path = template.format(tenant=tenant, generation=world["ids"].get(f"{tenant}_generation"),
                           spare_key=_spare_key(world, tenant) if "{spare_key}" in template else "")
    response = _call(world, credential, method, path, body(tenant) if body else None)
    want = expected(credential, target)
    assert response.status_code == want, (method, path, credential, target, response.text[:300])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) >= {"message", "type", "code"}
    if credential != GLOBAL and target == "other":
        # Nothing of the other tenant: not its id, not its records' or keys' ids.
        text = response.text
        for leaked in (world["ids"]["globex"], world["ids"]["globex_generation"]):
            assert leaked not in text or leaked in path, (path, credential, text[:300])
        if response.status_code < 400 and credential in ("tenant", "scoped_admin"):
            assert "globex" not in text, (path, credential, text[:300])
    if response.status_code == 200 and path.startswith("/v1/") and "completions" in path and credential != GLOBAL:
        generation_id = response.json()["hallmark"]["generation_id"]
        record = _call(world, GLOBAL, "GET", f"/v1/generations/{generation_id}").json()
        assert record["tenant"] == "acme"  # never attributed to the tenant the body named


def _without(text: str, *parts: str) -> str:
    for part in parts:
        text = text.replace(part, "<X>")
    return text


@pytest.mark.parametrize("credential", ["tenant", "scoped_admin"])
def test_refusals_do_not_tell_an_existing_tenant_from_a_missing_one(world, credential):
    store = world["store"]
    with store.transaction(write=False) as session:
        globex_key = list_keys(session, tenant="globex")[0].key_id
    pairs = [
        (("POST", "/v1/generate", {"prompt": "hi", "max_tokens": 2, "tenant": "globex"}),
         ("POST", "/v1/generate", {"prompt": "hi", "max_tokens": 2, "tenant": "nosuchtenant"}), ("globex", "nosuchtenant")),
        (("POST", "/v1/detect", {"token_ids": [1, 2], "tenant": "globex"}),
         ("POST", "/v1/detect", {"token_ids": [1, 2], "tenant": "nosuchtenant"}), ("globex", "nosuchtenant")),
        (("GET", f"/v1/generations/{world['ids']['globex_generation']}", None),
         ("GET", "/v1/generations/" + "0" * 32, None), (world["ids"]["globex_generation"], "0" * 32)),
    ]
    if credential == "scoped_admin":
        pairs += [
            (("GET", "/v1/admin/keys?tenant=globex", None), ("GET", "/v1/admin/keys?tenant=nosuchtenant", None),
             ("globex", "nosuchtenant")),
            (("POST", f"/v1/admin/keys/{globex_key}/revoke", {"reason": "x"}),
             ("POST", "/v1/admin/keys/key_0000000000000000/revoke", {"reason": "x"}),
             (globex_key, "key_0000000000000000")),
        ]
    for existing, missing, names in pairs:
        a = _call(world, credential, existing[0], existing[1], existing[2])
        b = _call(world, credential, missing[0], missing[1], missing[2])
        assert a.status_code == b.status_code and a.status_code in (403, 404), (existing, a.text, b.text)
        assert _without(a.text, *names) == _without(b.text, *names), (a.text, b.text)
    with store.transaction(write=False) as session:
        assert next(k for k in list_keys(session, tenant="globex") if k.key_id == globex_key).state != "revoked"


@pytest.mark.parametrize("credential", ["tenant", "scoped_admin", "global_admin"])
def test_a_token_may_name_its_own_tenant_in_any_case(world, credential):
    # Tenant names are unique without regard to case (keys.tenants), so "ACME" is acme: a
    # token scoped to acme that names it so acts for acme instead of being refused.
    for method, path, body in (("POST", "/v1/detect", {"token_ids": [1, 2, 3], "tenant": "ACME"}),
                               ("GET", "/v1/generations?tenant=Acme", None)):
        response = _call(world, credential, method, path, body)
        assert response.status_code == 200, (credential, path, response.text[:300])
    if credential != "tenant":
        audit = _call(world, credential, "GET", "/v1/admin/audit?tenant=ACME")
        assert audit.status_code == 200 and audit.json(), audit.text[:300]
        keys = _call(world, credential, "GET", "/v1/admin/keys?tenant=aCmE").json()
        assert keys and all("globex" not in str(k) for k in keys)
    # A look-alike that only lower() folds onto the name is not the tenant.
    response = _call(world, credential, "POST", "/v1/detect", {"token_ids": [1, 2, 3], "tenant": "\u212acme"})
    assert response.status_code in (403, 404, 422)
