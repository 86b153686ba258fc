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

from bench.gateway import Gateway, provision_store
from bench.oracle_attack import human_texts
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
    with tempfile.TemporaryDirectory() as tmp:
        env, tokens = _provision(Path(tmp))
        # The bench's client sends from 127.x.y.2 addresses; 127.0.0.1 is the only peer here.
        env = {**os.environ, **env, "HALLMARK_MODEL": MODEL, "HALLMARK_DEVICE": "cpu", "HALLMARK_DRAFT_MODEL": ""}
        server = Gateway(env, Path(tmp) / "gateway.log")
        try:
            server.wait_ready()
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
                        code = client.post("/v1/detect", json={"text": text}).status_code
                        tenant[code] = tenant.get(code, 0) + 1
            humans = human_texts(tokenizer, 150)
            rng = random.Random(31)
            rng.shuffle(humans)
            public = {}
            for a in range(50):
                address = f"127.0.{a // 10 + 1}.{a % 10 + 2}"  # 5 networks of 10 addresses
                transport = httpx.HTTPTransport(local_address=address)
                with httpx.Client(base_url=server.url, timeout=300, transport=transport) as client:
                    for j in range(3):
                        code = client.post("/v1/public/detect", json={"text": humans[3 * a + j]}).status_code
                        public[code] = public.get(code, 0) + 1
        finally:
            server.stop()
    result = {"tenant_checks": tenant, "public_checks": public,
              "all_answered": set(tenant) == {200} and set(public) == {200},
              "generations": args.generations, "max_tokens": args.max_tokens,
              "command": " ".join([".venv/bin/python -m bench.legit_use", *sys.argv[1:]]),
              "seconds": round(time.time() - started, 1), "load_average_at_end": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
