"""The kernels' parity checks on small shapes through Triton's interpreter (CPU).

Run as ``TRITON_INTERPRET=1 python -m tests.watermark.kernels.interpreter_checks [seed]``
(test_interpreter.py does); the variable must be set before the kernels are imported.
Shapes are small but cover the logic: several tiles and programs per row (partial last
tile, cross-block reduction), every context width, dual-key/skip/greedy rows, NaN/-inf,
non-contiguous rows, keys at the 2^32/2^64 edges, speculative blocks and dedup.
"""

from __future__ import annotations

import sys
import time

import torch

from tests.watermark.kernels import parity


def main(seed: int) -> int:
    started = time.perf_counter()
    cpu = torch.device("cpu")
    checks = [
        ("gumbel_sample fp32", lambda: parity.check_gumbel_sample(seed, 17, 2100, torch.float32, cpu)),
        ("gumbel_sample bf16 3 blocks", lambda: parity.check_gumbel_sample(seed + 1, 9, 5000, torch.bfloat16, cpu,
                                                                          blocks_per_row=3)),
        ("gumbel_sample fp16 offset rows", lambda: parity.check_gumbel_sample(seed + 2, 8, 999, torch.float16, cpu,
                                                                             layout="offset")),
        ("gumbel_sample draft lane", lambda: parity.check_gumbel_sample(seed + 12, 9, 700, torch.float32, cpu, lane=3)),
        ("gumbel_sample column stride", lambda: parity.check_gumbel_sample(seed + 3, 6, 300, torch.float32, cpu,
                                                                          layout="columns")),
        ("gumbel_sample zipf (sparse tiles)", lambda: parity.check_gumbel_sample(seed + 9, 5, 16_500, torch.float32,
                                                                                cpu, dist="zipf", compact=True)),
        ("gumbel_sample zipf, 512-token tiles", lambda: parity.check_gumbel_sample(seed + 11, 4, 6000, torch.float32,
                                                                                  cpu, dist="zipf", block=512,
                                                                                  compact=True)),
        ("gumbel_sample zipf dense only", lambda: parity.check_gumbel_sample(seed + 10, 5, 9000, torch.float32, cpu,
                                                                            dist="zipf", compact=False)),
        ("queue order (ties across the queue), 512", lambda: parity.check_queue_order(seed + 13, cpu, block=512)),
        ("queue order (ties across the queue), 2048", lambda: parity.check_queue_order(seed + 14, cpu)),
        ("pruning edge (compact)", lambda: parity.check_pruning_edge(cpu, compact=True)),
        ("pruning edge (dense)", lambda: parity.check_pruning_edge(cpu, compact=False)),
        ("bounded_sample zipf, shared row bounds", lambda: parity.check_bounded_sample(
            seed + 15, 9, 5000, torch.float32, cpu, dist="zipf", block=512, rows_in_flight=3)),
        ("bounded_sample bf16 offset rows", lambda: parity.check_bounded_sample(
            seed + 16, 8, 999, torch.bfloat16, cpu, dist="zipf", layout="offset", block=512, rows_in_flight=3)),
        ("bounded_sample normal, draft lane", lambda: parity.check_bounded_sample(
            seed + 17, 6, 2100, torch.float32, cpu, block=512, rows_in_flight=2, lane=3)),
        ("bounded edge", lambda: parity.check_bounded_edge(cpu, block=512, rows_in_flight=1)),
        ("seeded_sample zipf, 2 programs per row", lambda: parity.check_seeded_sample(
            seed + 21, 9, 5000, torch.float32, cpu, dist="zipf", block=512, blocks_per_row=2)),
        ("seeded edge", lambda: parity.check_bounded_edge(cpu, block=512, seeded=True)),
        ("gumbel_argmax 2 blocks", lambda: parity.check_gumbel_argmax(seed + 4, 7, 4300, torch.float32, cpu,
                                                                      blocks_per_row=2)),
        ("exponential_race", lambda: parity.check_exponential_race(seed + 5, 12, 2500, torch.float32, cpu,
                                                                   blocks_per_row=2)),
        ("verify", lambda: parity.check_verify(seed + 6, 10, 3, 2100, torch.float32, cpu, blocks_per_row=2)),
        ("verify bf16", lambda: parity.check_verify(seed + 7, 10, 2, 700, torch.bfloat16, cpu)),
        ("dedup", lambda: parity.check_dedup(seed + 8, cpu, requests=10, steps=40, k=3)),
        ("dedup open_many", lambda: parity.check_dedup_open_many(seed + 22, cpu)),
        ("dedup step (commit, decide, context)", lambda: parity.check_dedup_step(seed + 18, cpu, steps=30)),
        ("prepared sample (fallback launch)", lambda: parity.check_prepared_sample(seed + 19, 7, 2100,
                                                                                   torch.float32, cpu, calls=2)),
        ("prepared dedup step (fallback launch)", lambda: parity.check_prepared_dedup_step(seed + 20, cpu, steps=12)),
    ]
    failures = 0
    for name, check in checks:
        t = time.perf_counter()
        try:
            result = check()
        except AssertionError as error:
            failures += 1
            print(f"FAIL {name}: {error}")
            continue
        print(f"ok   {name} ({time.perf_counter() - t:.1f} s){'' if result is None else ' ' + str(result)}")
    print(f"{len(checks) - failures}/{len(checks)} interpreter parity checks passed in "
          f"{time.perf_counter() - started:.1f} s (seed {seed})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
