"""The host's per-block costs at N rows, on the CPU, with no model: what the step loop,
the streamer thread and the event loop each spend on one speculative block's tokens.

    python bench/engine_host_costs.py [--rows 256] [--repeats 200] [--out FILE]

1. ``take``: OutputTable.take of a block (k = 4) for N rows, then the pending inputs, as
   SpeculativeBlocks._take does (the step loop's share);
2. ``streamer_pass``: one streamer pass over that block's tokens (``--blocks-per-pass B``:
   over B blocks' tokens, divided by B) (N requests, two new tokens
   each, outputs of ``--history`` tokens so far): batched decode, releasable text, N Deltas
   handed to an Outbox (the streamer thread's share); ``streamer_decode`` is the part spent
   in the Rust decode (without the GIL, plus converting the id lists, with it), and
   ``streamer_gil`` the rest, Python holding the GIL;
3. ``event_loop_delivery``: one hand-over of N events to N consumer coroutines, each awaiting
   its queue as LocalEngine.generate does (the event loop's share).

Median microseconds per block and per row; all three take the one GIL of the process.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.rows import emit  # noqa: E402
from service.engines.base import GenerationRequest  # noqa: E402
from service.engines.local.outbox import Outbox  # noqa: E402
from service.engines.local.outputs import OutputTable  # noqa: E402
from service.engines.local.request import RequestState  # noqa: E402
from service.engines.local import streamer as streamer_module  # noqa: E402
from service.engines.local.streamer import Streamer  # noqa: E402
from service.model_paths import resolve_model_path  # noqa: E402

K = 4


def _median_us(samples: list[float]) -> float:
    return round(1e6 * statistics.median(samples), 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--history", type=int, default=64, help="tokens each request has generated before")
    parser.add_argument("--blocks-per-pass", type=int, default=1,
                        help="blocks' tokens one streamer pass covers (a threaded streamer that rests between "
                             "passes covers several); per-block figures are the pass's over this")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path("bundled"))
    n, rng = args.rows, np.random.default_rng(0)
    table = OutputTable(n, 4096)
    rows = np.array([table.open(4000, {1}) for _ in range(n)])
    take = []
    for _ in range(args.repeats):
        out = rng.integers(3, 8000, (n, 3 * K + 3))
        out[:, K + 1:2 * K + 2] = 2
        out[:, -1] = rng.integers(0, K + 1, n)
        t = time.perf_counter()
        accepted = out[:, -1]
        tokens, routes = out[:, :K + 1], out[:, K + 1:2 * K + 2]
        taken, why = table.take(rows, tokens, routes, accepted + 1)
        full = accepted == K
        last = np.take_along_axis(tokens, accepted[:, None], axis=1)[:, 0]
        table.set_pending(rows, np.where(full, out[:, 3 * K + 1], last), np.where(full, tokens[:, K], 0),
                          np.where(full, 2, 1))
        take.append(time.perf_counter() - t)
        table.length[rows] = 0

    loop = asyncio.new_event_loop()
    outbox = Outbox()
    queues = [asyncio.Queue() for _ in range(n)]
    streamer = Streamer()  # inline: the pass runs on this thread, timed alone
    states = [RequestState(GenerationRequest(f"r{i}", (5, 6), 4000, seed=i), tok, frozenset(),
                           outbox.sink(loop, queues[i]), streamer=streamer) for i in range(n)]
    for state in states:
        state.tracker.token_ids.extend(rng.integers(3, 8000, args.history).tolist())
    passes, decoding = [], [0.0]
    decode_many = streamer_module.decode_many

    def timed_decode(*a, **k):  # the Rust decode, which runs without the GIL: timed apart
        t = time.perf_counter()
        try:
            return decode_many(*a, **k)
        finally:
            decoding[0] += time.perf_counter() - t

    streamer_module.decode_many = timed_decode
    decodes = []
    per = args.blocks_per_pass
    for _ in range(args.repeats // 4):
        messages = [(streamer_module._TOKENS, states, np.arange(n), rng.integers(3, 8000, (n, 2)),  # noqa: SLF001
                     np.full(n, 2), np.zeros((n, 4), dtype=np.int64)) for _ in range(per)]
        t = time.perf_counter()
        streamer._pass(messages)  # noqa: SLF001 - what a threaded pass runs over the blocks it took
        passes.append((time.perf_counter() - t) / per)
        decodes.append(decoding[0] / per)
        decoding[0] = 0.0
        outbox._pending.clear()  # noqa: SLF001 - the hand-over is timed below

    async def consumers(rounds: int) -> list[float]:
        async def consume(queue):
            for _ in range(rounds):
                await queue.get()

        tasks = [asyncio.ensure_future(consume(q)) for q in queues]
        await asyncio.sleep(0)
        times = []
        for _ in range(rounds):
            for state in states:
                state.sink(("event",))
            t = time.perf_counter()
            outbox._deliver(loop)  # noqa: SLF001 - what the flush schedules, run here
            await asyncio.sleep(0)  # every consumer wakes and takes its event
            await asyncio.sleep(0)
            times.append((time.perf_counter() - t) / per)  # one hand-over per pass
        await asyncio.gather(*tasks)
        return times

    delivery = loop.run_until_complete(consumers(args.repeats // 4))
    loop.close()
    row = {"bench": "engine_host_costs", "rows": n, "k": K, "history": args.history, "blocks_per_pass": per,
           "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "default"),
           "take_us_per_block": _median_us(take), "take_us_per_row": round(_median_us(take) / n, 3),
           "streamer_pass_us_per_block": _median_us(passes), "streamer_pass_us_per_row": round(_median_us(passes) / n, 2),
           "streamer_decode_us_per_block": _median_us(decodes),
           "streamer_gil_us_per_block": _median_us([a - b for a, b in zip(passes, decodes)]),
           "event_loop_delivery_us_per_block": _median_us(delivery),
           "event_loop_delivery_us_per_row": round(_median_us(delivery) / n, 2),
           "command": "python bench/engine_host_costs.py " + " ".join(sys.argv[1:])}
    emit(row, args.out)


if __name__ == "__main__":
    main()
