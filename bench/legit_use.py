"""Issue 31's legitimate-use goal, against a running gateway with the default limits: a tenant
checks each of its 100 recorded generations twice in a day, and 50 addresses (in 5 /24s)
each check 3 distinct texts; every one must be answered (no 429).

    .venv/bin/python -m bench.legit_use [--generations 100] [--max-tokens 120] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.gateway import cpu_gateway, provision_store
from keys.lifecycle import create_key
from keys.tenants import create_tenant
from keys.tokens import issue_token
from watermark.spec import WatermarkSpec

MODEL = os.environ.get("HALLMARK_TEST_MODEL", "bundled")


def _provision(tmp: Path):
    def populate(session, keyring) -> dict[str, str]:
        create_tenant(session, name="acme", actor="bench")
        create_key(session, keyring, tenant="acme", actor="bench", spec=WatermarkSpec(algorithm="dual_key_gumbel"))
        return {"tenant": issue_token(session, tenant="acme", actor="bench").raw_token}

    return provision_store(tmp, populate)


def _distinct_texts(tokenizer, n: int) -> list[str]:
    """Paragraphs of the licence texts, one version of each licence (GPL is GPL-3 through a
    symlink, and GPL-2, LGPL-2 and GFDL-1.2 repeat most of their successors' passages: those
    would be one text checked twice, not distinct texts)."""
    words, seen = [], set()
    for path in sorted(Path("/usr/share/common-licenses").iterdir()):
        real = path.resolve()
        family = real.name.split("-")[0]
        if not real.is_file() or real in seen or family in {p.name.split("-")[0] for p in seen}:
            continue
        seen.add(real)
        words += real.read_text(errors="ignore").split()
    texts = [" ".join(words[i:i + 170]) for i in range(0, len(words) - 170, 170)]
    texts = [t for t in texts if len(tokenizer(t, add_special_tokens=False)["input_ids"]) >= 205]
    if len(texts) < n:  # not enough licence text: pydoc pages (the demo model's corpus) fill in
        import pydoc
        import json as _json
        for module in (_json, argparse, random, tempfile, time, os):
            page = pydoc.render_doc(module, renderer=pydoc.plaintext).split()
            texts += [" ".join(page[i:i + 170]) for i in range(0, len(page) - 170, 170)]
    return texts[:n]


def _check(client: httpx.Client, path: str, body: dict, counts: dict) -> None:
    """One check, as a client that honours the per-request rate limit's Retry-After (the
    rate is not what this measures: a day's checks are spread over the day); the status, or
    the refusal's code, counted."""
    while True:
        r = client.post(path, json=body)
        if r.status_code == 429 and r.json()["error"]["code"] == "rate_limited":
            time.sleep(float(r.headers.get("Retry-After", "1")))
            continue
        key = str(r.status_code) if r.status_code < 400 else f"{r.status_code} {r.json()['error']['code']}"
        counts[key] = counts.get(key, 0) + 1
        return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--generations", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument("--out", type=Path, default=Path("bench/results/legit-use.json"))
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from service.model_paths import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MODEL))
    started = time.time()
    with cpu_gateway(_provision, MODEL) as (server, tokens):
        # The bench's client sends from 127.x.y.2 addresses; 127.0.0.1 is the only peer here.
        auth = {"Authorization": f"Bearer {tokens['tenant']}"}
        with httpx.Client(base_url=server.url, timeout=300, headers=auth) as client:
            prompts = ["The history of the town", "This module provides", "A short note on rivers",
                       "The function returns", "In the morning the market"]
            texts = []
            for i in range(args.generations):
                out = client.post("/v1/generate", json={"prompt": prompts[i % len(prompts)], "seed": i + 1,
                                                        "max_tokens": args.max_tokens}).json()
                texts.append(out["text"])
            tenant = {}
            for _ in range(2):  # each generation checked twice
                for text in texts:
                    _check(client, "/v1/detect", {"text": text}, tenant)
        humans = _distinct_texts(tokenizer, 150)
        rng = random.Random(31)
        rng.shuffle(humans)
        public = {}
        for a in range(50):
            address = f"127.0.{a // 10 + 1}.{a % 10 + 2}"  # 5 networks of 10 addresses
            transport = httpx.HTTPTransport(local_address=address)
            with httpx.Client(base_url=server.url, timeout=300, transport=transport) as client:
                for j in range(3):
                    _check(client, "/v1/public/detect", {"text": humans[3 * a + j]}, public)
    result = {"tenant_checks": tenant, "public_checks": public,
              "all_answered": set(tenant) == {"200"} and set(public) == {"200"},
              "generations": args.generations, "max_tokens": args.max_tokens,
              "command": " ".join([".venv/bin/python -m bench.legit_use", *sys.argv[1:]]),
              "seconds": round(time.time() - started, 1), "load_average_at_end": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
