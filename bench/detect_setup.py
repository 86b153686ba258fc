"""The detection benches' common set-up: a store with one tenant's imported dual key and its
tenant and expert tokens, and generated 200-token texts to detect (bench.detect_profile,
bench.detect_asgi, bench.detect_floor: the same texts and key, so their figures compare)."""

from __future__ import annotations

BENCH_SECRET = 0x5EED_1234_ABCD_0042
"""The bench key's secret: fixed, so every run generates (and detects) the same texts."""


def populate(spec=None):
    """A ``provision_store`` populate function: tenant ``bench`` with the bench key under
    ``spec`` (default: a dual key), returning its tenant token and an expert token."""
    from keys.lifecycle import import_key
    from keys.tenants import create_tenant
    from keys.tokens import issue_token
    from watermark.spec import WatermarkSpec

    def run(session, keyring) -> dict[str, str]:
        create_tenant(session, name="bench", actor="bench")
        import_key(session, keyring, tenant="bench", secret=BENCH_SECRET, actor="bench",
                   spec=spec or WatermarkSpec(algorithm="dual_key_gumbel"))
        return {"tenant": issue_token(session, tenant="bench", actor="bench").raw_token,
                "expert": issue_token(session, tenant=None, actor="bench", expert=True).raw_token}

    return run


def generated_texts(client, tenant_token: str, count: int, *, min_tokens: int = 190) -> list[str]:
    """Up to ``count`` texts of at least ``min_tokens`` tokens generated through ``client`` (seeds
    0-63, prompt "This module provides", 200 tokens)."""
    texts = []
    for seed in range(64):
        answer = client.post("/v1/generate", headers={"Authorization": f"Bearer {tenant_token}"},
                             json={"prompt": "This module provides", "max_tokens": 200, "seed": seed}).json()
        if len(answer["token_ids"]) >= min_tokens:
            texts.append(answer["text"])
        if len(texts) == count:
            break
    return texts


def unthrottled_settings():
    """The gateway's settings with budgets and the probe guard out of the way: the detection
    benches measure a request's CPU, not its refusal."""
    from service.settings import ServiceSettings

    return ServiceSettings(detect_rate_per_minute=1e9, detect_burst=1_000_000_000,
                           probe_family_per_day=1_000_000_000, public_tokens_per_day=1e15,
                           public_wide_tokens_per_day=1e15, public_global_tokens_per_day=1e15,
                           tenant_detect_tokens_per_day=1e15, public_min_tokens=100)
