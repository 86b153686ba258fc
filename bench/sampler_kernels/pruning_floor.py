"""What a two-pass exact-pruning design must spend at B = 256 before it races anything
(issue 13's Zipf goal, <= 50 µs single key), measured beside the dispatched dense sampler
in one CUDA-graph harness on the same logits (rotated beyond L2):

    python -m bench.sampler_kernels.pruning_floor [--out FILE]

* ``dense_us``: ``gumbel_sample`` as dispatched (single key), Zipf(2) and N(0, 1);
* ``row_argmax_us``: ``gumbel_sample`` with every row greedy (T = 0): the same kernel's
  row argmax pass, i.e. the cheapest exact row bound (the bound token is the row's argmax);
* ``torch_amax_us``: ``torch.amax(logits, 1)`` for comparison;
* ``read_floor_us``: the logits' bytes over the device-to-device copy bandwidth measured
  in the same run.

A design that first reads the row for its bound and then races the candidates reads the
logits twice from HBM unless the second read hits L2 (132 MB at B = 256 does not fit), so
it costs at least ``row_argmax_us + read_floor_us`` whatever its race costs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.sampler_kernels import report  # noqa: E402
from bench.sampler_kernels import harness  # noqa: E402
from bench.sampler_kernels.harness import S, graph_time_us, make_logits, row_args, sets_for  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from watermark.kernels.gumbel import gumbel_sample

    bandwidth = harness.copy_bandwidth()
    batch = args.batch
    bytes_per_set = batch * S.vocab * 4
    result = {"device": torch.cuda.get_device_name(), "batch": batch, "vocab": S.vocab, "dtype": "float32",
              "copy_GBps": bandwidth["GBps"], "read_floor_us": bytes_per_set / (bandwidth["GBps"] * 1e9) * 1e6,
              "timing": "CUDA-graph replay medians, input sets rotated beyond L2"}
    gen = torch.Generator(device=S.device).manual_seed(0)
    for dist in ("zipf", "normal"):
        sets = [make_logits(batch, dist, torch.float32, gen) for _ in range(sets_for(bytes_per_set))]
        rows = row_args(batch, "single", gen)
        greedy = dict(rows, temperature=torch.zeros(batch, device=S.device))
        want = torch.argmax(sets[0], 1)
        got = gumbel_sample(sets[0], **greedy).tokens
        result[f"{dist}_row_argmax_matches_torch"] = bool(torch.equal(got, want))
        result[f"{dist}_dense_us"] = graph_time_us([lambda x=x: gumbel_sample(x, **rows) for x in sets])
        result[f"{dist}_row_argmax_us"] = graph_time_us([lambda x=x: gumbel_sample(x, **greedy) for x in sets])
        result[f"{dist}_torch_amax_us"] = graph_time_us([lambda x=x: torch.amax(x, 1) for x in sets])
        result[f"{dist}_two_pass_floor_us"] = result[f"{dist}_row_argmax_us"] + result["read_floor_us"]
        # The seeded two-launch design (watermark.kernels.bounded.seeded_sample): the row
        # argmax pass above, then the race with the exact floor from the first tile.
        from watermark.kernels.bounded import seeded_sample

        for mode in ("single", "dual"):
            margs = row_args(batch, mode, gen)
            want = gumbel_sample(sets[0], **margs)
            for compact in (True, False):
                name = f"{dist}_{mode}_seeded{'' if compact else '_dense_tiles'}"
                got = seeded_sample(sets[0], **margs, compact=compact)
                result[f"{name}_same_tokens_as_dense"] = bool(torch.equal(got.tokens, want.tokens)
                                                              and torch.equal(got.routes, want.routes))
                result[f"{name}_us"] = graph_time_us([lambda x=x, c=compact: seeded_sample(x, **margs, compact=c)
                                                      for x in sets])
            if mode == "dual":
                result[f"{dist}_dual_dense_us"] = graph_time_us([lambda x=x: gumbel_sample(x, **margs) for x in sets])
        del sets
        harness.free()
    return report.emit(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
