"""Write the golden vectors of the 256-bit PRFs into tests/data/.

* ``hmac-sha256-v1.json``: computed by **vLLM's own reference** (``HMACSHA256PRF`` in
  ``vllm/v1/watermarking/prfs/hmac_sha256.py``), imported from a folder given on the command
  line (a copy outside the project, never a dependency). vLLM 0.34.0's release has no such
  PRF; it is in vLLM's main branch after 0.34 (the copy used: commit 3da8712b).
* ``hmac-sha256-philox-v1.json``: Hallmark's construction, from the hashlib reference
  (:mod:`watermark.prf.hmac_philox`), with each context's digest so that another
  implementation can check its HMAC and its Philox stage apart.

    .venv/bin/python scripts/golden_hmac.py --vllm-root /tmp/vllm_hmac_ref
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

from watermark.prf import hmac_philox, philox

REPO = Path(__file__).resolve().parents[1]
KEYS = [0, 1, 2**64 - 1, 2**64, 2**255, 2**256 - 1]
CONTEXTS = [[-1], [7, 7, 7, 7], [-1, -1, 151935, 3], [5, 9, 13, 17, 21, 25, 29], [1, 2, 3, 4, 5, 6, 7, 8],
            [199999 - i for i in range(16)]]
TOKENS = [0, 1, 2, 3, 552, 7431, 69816, 129279, 151935, 199827]


def cases(rng: random.Random) -> list[tuple[int, list[int]]]:
    keys = KEYS + [rng.getrandbits(256) for _ in range(4)]
    return [(key, CONTEXTS[i % len(CONTEXTS)]) for i, key in enumerate(keys)] + \
        [(keys[-1], ctx) for ctx in CONTEXTS]


def vllm_vectors(root: Path, rng: random.Random) -> dict:
    import torch

    sys.path.insert(0, str(root))
    from vllm.v1.watermarking.prfs.hmac_sha256 import HMACSHA256PRF  # noqa: PLC0415 - the copy given

    out = []
    for key, context in cases(rng):
        prf = HMACSHA256PRF(key)
        uniforms = prf.uniform(torch.tensor([context]), torch.tensor([TOKENS]))[0]
        out.append({"key": str(key), "context": context, "tokens": TOKENS,
                    "uniforms": [float(u) for u in uniforms.tolist()]})
    return {"prf": "hmac-sha256-v1", "source": "vLLM HMACSHA256PRF (vllm/v1/watermarking/prfs/hmac_sha256.py, "
            "main after 0.34, commit 3da8712b), run by scripts/golden_hmac.py",
            "note": "key: 256-bit int, HMAC key = 32 bytes little-endian; uniform = ((word >> 8) + 1) / (2**24 + 1)",
            "cases": out}


def philox_vectors(rng: random.Random) -> dict:
    out = []
    for key, context in cases(rng):
        philox_key, state = hmac_philox.context_key_state(key, context)
        words = [philox.word_py(philox_key, state, t) for t in TOKENS]
        out.append({"key": str(key), "context": context, "digest_words": list(state) + [philox_key & 0xFFFFFFFF,
                                                                                       philox_key >> 32],
                    "tokens": TOKENS, "words": words,
                    "uniforms": [float(u) for u in philox.uniforms_from_words_numpy(np.array(words, np.uint64))]})
    return {"prf": hmac_philox.VERSION, "source": "watermark.prf.hmac_philox (hashlib HMAC), scripts/golden_hmac.py",
            "note": "digest_words: d0..d5 of HMAC-SHA-256(key as 32 bytes big-endian, context message), big-endian "
                    "words; state (d0..d3), Philox key d4 + 2**32 d5", "cases": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-root", type=Path, required=True, help="folder holding a copy of vllm's prfs package")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data")
    args = parser.parse_args()
    (args.out / "hmac-sha256-v1.json").write_text(json.dumps(vllm_vectors(args.vllm_root, random.Random(36)),
                                                             indent=1) + "\n")
    (args.out / "hmac-sha256-philox-v1.json").write_text(json.dumps(philox_vectors(random.Random(36)),
                                                                    indent=1) + "\n")


if __name__ == "__main__":
    main()
