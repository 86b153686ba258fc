"""How much of a Zipf(2) / N(0, 1) row an exact row bound leaves to race, at the granularity
a GPU can skip work (CPU only; issue 13's pruning question).

    python -m bench.sampler_kernels.pruning_model [--rows 64] [--out FILE]

For each row: the exact row bound (the row's first argmax and its exact score,
:func:`watermark.pruning.chunk_bounds` with one chunk), the float32 floor
(:func:`watermark.pruning.prune_floor`), and the share of work still live when a token,
a Philox call (4 consecutive tokens share one counter), a warp's call (32 threads x 4 =
128 consecutive tokens: SIMT lanes skip Philox only if the whole warp can) or a
2,048-token tile is the unit that can be skipped. Also the same shares under the bound the
dense kernel has *during* its pass (the best exact score of the tokens raced so far in the
program's chunk, 2 programs per row at B = 256), tile by tile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.watermark.kernels.parity import zipf_logits  # noqa: E402
from bench.sampler_kernels import report  # noqa: E402
from watermark.pruning import chunk_bounds, prune_floor  # noqa: E402


def live_shares(live: torch.Tensor) -> dict:
    batch, vocab = live.shape
    out = {"token": float(live.float().mean())}
    for name, width in (("philox_call_4", 4), ("warp_128", 128), ("tile_2048", 2048)):
        pad = (-vocab) % width
        padded = torch.nn.functional.pad(live, (0, pad), value=False)
        out[name] = float(padded.reshape(batch, -1, width).any(-1).float().mean())
    return out


def running_floor_share(values: torch.Tensor, keys, states, programs: int = 2, block: int = 2048) -> float:
    """Live share under the running bound (best exact score so far in the program's chunk;
    lower bound on what the dense kernel's floor can prune, since its floor comes from raced
    tokens, here the tile's own argmax is counted as raced before the tile's test)."""
    batch, vocab = values.shape
    tiles = -(-vocab // block)
    per = -(-tiles // programs)
    live = 0
    for p in range(programs):
        best = torch.full((batch,), float("-inf"))
        for t in range(p * per, min(tiles, (p + 1) * per)):
            lo, hi = t * block, min(vocab, (t + 1) * block)
            tile = values[:, lo:hi]
            live += int((tile > prune_floor(best).unsqueeze(1)).sum())
            scores, _ = chunk_bounds(tile.contiguous(), keys, states, 1)
            best = torch.maximum(best, scores[:, 0])
    return live / values.numel()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=129_280)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(13)
    keys = torch.randint(-2**62, 2**62, (args.rows,), generator=gen)
    states = torch.randint(0, 2**32, (args.rows, 4), generator=gen)
    result = {"rows": args.rows, "vocab": args.vocab}
    for dist in ("zipf2", "normal"):
        values = (zipf_logits(gen, args.rows, args.vocab) if dist == "zipf2"
                  else torch.randn(args.rows, args.vocab, generator=gen))
        bound, _ = chunk_bounds(values, keys, states, 1)
        live = values > prune_floor(bound[:, 0]).unsqueeze(1)
        result[dist] = {"row_bound_live_share": live_shares(live),
                        "running_bound_live_token_share_2_programs": running_floor_share(values, keys, states)}
    return report.emit(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
