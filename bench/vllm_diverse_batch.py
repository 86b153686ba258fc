"""The vLLM plugin under `diverse` keys, batched (issue 30, item C): why a few generations
score weakly while their batch siblings score 10^-87 and below.

    nice -n 10 .venv/bin/python -m bench.vllm_diverse_batch [--prompts 4 --per-prompt 8 --tokens 120 --rounds 2]

vLLM's CPU build in process with Hallmark's plugin and the bundled dense draft model (what
``hallmark generate --engine vllm`` runs on a CPU-only machine), T = 1, every request its own
seed; the keys as the gateway sends them (sealed, with ``hallmark_salt``): a `salt`-diverse
key with each generation's salt, and a `head`-diverse key. Per generation: its length and
finish reason, the positions the detector scores (distinct contexts), the routes replayed
from key, seed and tokens (watermarked / plain, i.e. repeated contexts drawn from the ordinary
stream), and log10 p under the generation's own key (salt known) and as detected without the
ledger. Writes bench/results/vllm-diverse-batch.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

RESULTS_NAME = "vllm-diverse-batch.json"
PROMPTS = ["The function returns", "This module provides", "If the argument is", "The default value is"]


def bench_keys() -> dict:
    """The bench's two keys (public constants, not secrets): a `salt`- and a `head`-diverse key."""
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    return {"salt": WatermarkKey(0x5A17_D1CE_0000_0030, WatermarkSpec(mode="diverse")),
            "head": WatermarkKey(0x4EAD_D1CE_0000_0030, WatermarkSpec(mode="diverse", diversity="head", dedup="all"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--per-prompt", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from pathlib import Path

    from vllm import LLM, SamplingParams

    from detector.detect import detect
    from detector.multikey import detect_many
    from detector.result import Candidate, salted_candidates
    from detector.scoring import scored_positions
    from service.engines.vllm import PLUGIN, sealing, watermark_args
    from service.engines.vllm.route_replay import replay_routes
    from service.model_paths import BUNDLED_DRAFT, resolve_model_path
    from watermark.salt import SaltRotation

    transport = sealing.ensure_transport_key()
    started = time.time()
    llm = LLM(model=str(resolve_model_path(BUNDLED_DRAFT)), logits_processors=[PLUGIN], dtype="float32",
              max_model_len=512, enforce_eager=True, seed=0)
    tokenizer = llm.get_tokenizer()
    keys = bench_keys()
    rows = []
    rotation = SaltRotation()
    for round_ in range(args.rounds):
        for scheme, key in keys.items():
            prompts, params, used = [], [], []
            for p in range(args.prompts):
                ids = tokenizer.encode(PROMPTS[p % len(PROMPTS)], add_special_tokens=False)
                for g in range(args.per_prompt):
                    seed = watermark_args.new_seed()
                    generating = key.with_salt(rotation.take("bench", ids)) if key.spec.salted else key
                    prompts.append({"prompt_token_ids": ids})
                    params.append(SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=seed % 2**63,
                                                 extra_args=watermark_args.sealed_args("k", generating, seed, transport)))
                    used.append((p, seed, generating))
            outs = llm.generate(prompts, params, use_tqdm=False)
            for (p, seed, generating), out in zip(used, outs):
                tokens = list(out.outputs[0].token_ids)
                routes = replay_routes(tokens, generating, seed, 1.0, prompt_ids=out.prompt_token_ids)
                scored = len(scored_positions(tokens, generating.spec.context_width,
                                              "all" if generating.spec.dedup == "all" else "text").positions)
                known = detect(tokens, [Candidate.inline(generating)]).log10_p_value if tokens else 0.0
                blind = salted_candidates([Candidate.inline(key)])
                searched = (detect_many(tokens, blind).log10_p_value if len(blind) > 1
                            else detect(tokens, blind).log10_p_value) if tokens else 0.0
                rows.append({"round": round_, "scheme": scheme, "prompt": p, "salt": generating.salt,
                             "tokens": len(tokens), "finish": out.outputs[0].finish_reason, "scored": scored,
                             "watermarked_routes": routes.key_a + routes.key_b, "plain_routes": routes.plain,
                             "log10_p_known": round(known, 2), "log10_p_without_ledger": round(searched, 2),
                             "text": tokenizer.decode(tokens)[:160], "token_ids": tokens, "seed": seed})
                print({k: v for k, v in rows[-1].items() if k not in ("text", "token_ids")}, flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    weak = [r for r in rows if r["log10_p_known"] > -10]
    payload = {"meta": {"command": "nice -n 10 .venv/bin/python -m bench.vllm_diverse_batch " + " ".join(sys.argv[1:]),
                        "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
                        "seconds": round(time.time() - started, 1)},
               "generations": len(rows), "weak_below_1e-10": weak, "rows": rows}
    path = Path(__file__).resolve().parent / "results" / RESULTS_NAME
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print("wrote", path, "weak:", [(r["tokens"], r["scored"], r["plain_routes"], r["log10_p_known"]) for r in weak])
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
