"""The 256-bit verification and corpus-scan kernels beside their Philox twins (issue 36): same
harness, same inputs, one run; every timed configuration is first checked against its reference.

* ``hmac_verify``: speculative verification at B = 64, k = 4 (fp32, V = 129,280): the Philox
  kernel (:func:`watermark.kernels.speculative.verify`) and the 256-bit one
  (:func:`watermark.kernels.hmac_verify.verify_hmac`: the HMAC of every block position, then the
  race), CUDA-graph medians, on the same probabilities; every row 256-bit in the second.
* ``hmac_keyscan``: the corpus scan (:mod:`watermark.kernels.keyscan`) against
  :mod:`watermark.kernels.keyscan_hmac` on T texts x K keys of ~1,000 scored positions, single
  and dual keys, CUDA-event medians; key.tokens/s (a dual key.token is two PRF streams).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from bench.sampler_kernels.harness import L2_BYTES, Run, S, free, graph_time_us


def section_hmac_verify(run: Run) -> None:
    from tests.watermark.kernels import parity
    from tests.watermark.kernels.hmac_parity import reference_verify_wide
    from watermark.hmac_rows import WideRows
    from watermark.kernels import speculative as kernels
    from watermark.kernels.hmac_verify import verify_hmac
    from watermark.prf import hmac_philox

    rows = run.results.setdefault("hmac_verify_b64_k4", [])
    batch, k, vocab, dev = S.spec_batch, S.spec_k, S.vocab, S.device
    gen = torch.Generator(device=dev).manual_seed(12)
    n_sets = max(2, min(8, math.ceil(3 * L2_BYTES / (batch * (2 * k + 1) * vocab * 4))))
    sets = []
    for _ in range(n_sets):
        target_logits = torch.randn(batch, k + 1, vocab, device=dev, generator=gen) * 2
        p = torch.softmax(target_logits, -1)
        q = torch.softmax(target_logits[:, :k] + 0.7 * torch.randn(batch, k, vocab, device=dev, generator=gen), -1)
        x = torch.stack([torch.multinomial(q[:, j], 1, generator=gen)[:, 0] for j in range(k)], -1)
        sets.append((p, q, x))
    cpu_gen = torch.Generator().manual_seed(4)
    args = dict(key_b=parity.random_keys(cpu_gen, batch), key_coin=parity.random_keys(cpu_gen, batch),
                keyed_coin=torch.rand(batch, generator=cpu_gen) < 0.5,
                contexts=torch.randint(0, 129_000, (batch, k + 1, 16), generator=cpu_gen),
                widths=torch.full((batch,), 4, dtype=torch.int32),
                watermark=torch.ones(batch, k + 1, dtype=torch.bool), greedy=torch.zeros(batch, dtype=torch.bool),
                stream_keys=parity.random_keys(cpu_gen, batch),
                positions=torch.randint(0, 4096, (batch,), generator=cpu_gen))
    args = {name: value.to(dev) for name, value in args.items()}
    keys = [2**255 + 104_729 * b for b in range(batch)]
    wide = WideRows(mids_a=torch.zeros(batch, 16, dtype=torch.int64, device=dev),
                    mids_b=torch.tensor([hmac_philox.midstates(key) for key in keys], dtype=torch.int64, device=dev),
                    wide=torch.ones(batch, dtype=torch.bool, device=dev),
                    mids_coin=torch.tensor([hmac_philox.midstates(key + 1) for key in keys], dtype=torch.int64,
                                           device=dev))
    wide_args = dict(args, wide=wide.wide, mids_b=wide.mids_b, mids_coin=wide.mids_coin)
    p, q, x = sets[0]
    got = verify_hmac(p, q, x, **wide_args)
    want = reference_verify_wide(p, q, x, args, wide)
    philox_got = kernels.verify(p, q, x, **args)
    philox_want = parity.reference_verify(p, q, x, args)

    def same(a, b):
        return bool(torch.equal(a.tokens.cpu(), b.tokens.cpu()) and torch.equal(a.routes.cpu(), b.routes.cpu())
                    and torch.equal(a.num_accepted.cpu(), b.num_accepted.cpu()))

    row = {"dtype": "float32", "batch": batch, "k": k, "vocab": vocab, "input_sets": n_sets,
           "hmac_bit_exact": same(got, want), "philox_bit_exact": same(philox_got, philox_want),
           "mean_accepted": float(want.num_accepted.float().mean())}
    row["philox_us"] = graph_time_us([(lambda s=s: kernels.verify(s[0], s[1], s[2], **args)) for s in sets])
    row["hmac_us"] = graph_time_us([(lambda s=s: verify_hmac(s[0], s[1], s[2], **wide_args)) for s in sets])
    row["hmac_over_philox"] = row["hmac_us"] / row["philox_us"]
    rows.append(row)
    print("hmac_verify", row, flush=True)
    del sets
    free()
    run.save()


def _time_ms(fn, repeats: int = 5) -> float:
    import time

    fn()
    if S.device.type != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return float(np.median(times))


def section_hmac_keyscan(run: Run) -> None:
    from detector import screen
    from watermark import keyscan
    from watermark.kernels import keyscan as philox_kernel
    from watermark.kernels.keyscan_hmac import midstates_tensor, scan_stats_hmac
    from watermark.keyscan_cpu import context_columns

    rows = run.results.setdefault("hmac_keyscan", [])
    texts, keys, n = (512, 256, 1000) if not S.smoke else (3, 2, 20)
    rng = np.random.default_rng(36)
    token_ids = rng.integers(0, 2**31, size=(texts, n + 4))
    contexts, tokens, offsets = keyscan.pack_positions(list(token_ids), 4, skip_padded=False)
    dev = S.device
    columns = torch.from_numpy(context_columns(contexts).view(np.int32)).to(dev)
    toks = torch.from_numpy((tokens & 0xFFFFFFFF).astype(np.uint32).view(np.int32)).to(dev)
    offs = torch.from_numpy(offsets).to(dev)
    wide_a = [2**255 + 7919 * i for i in range(keys)]
    wide_b = [2**254 + 104_729 * i for i in range(keys)]
    narrow_a = torch.from_numpy(rng.integers(-2**62, 2**62, keys)).to(dev)
    narrow_b = torch.from_numpy(rng.integers(-2**62, 2**62, keys)).to(dev)
    # Parity first, on a slice (the reference hashes with hashlib, one position at a time).
    check_texts = 2
    stop = int(offsets[check_texts])
    for dual in (False, True):
        tables = screen.scan_tables("sidak" if dual else "single", 0.1, n + 4)
        device_tables = philox_kernel.DeviceTables(tables, dev)
        mids = midstates_tensor(wide_a, wide_b if dual else None, dev)
        got = scan_stats_hmac(mids[:4], dual, columns[:, :stop].contiguous(), toks[:stop], offs[:check_texts + 1],
                              4, device_tables).cpu().numpy()
        want = keyscan.scan_stats_hmac_reference(wide_a[:4], wide_b[:4] if dual else None, contexts[:stop],
                                                 tokens[:stop], offsets[:check_texts + 1], tables)
        key_tokens = keys * int(len(tokens))
        row = {"dual": dual, "texts": texts, "keys": keys, "positions": int(len(tokens)),
               "hmac_bit_exact_on_slice": bool(np.array_equal(got, want))}
        row["philox_ms"] = _time_ms(lambda: philox_kernel.scan_stats(
            narrow_a, narrow_b if dual else None, columns, toks, offs, 4, device_tables, keys_per_program=16))
        for keys_per_program, block in ((4, 128),):  # the GPU scan's launch shape (one compile)
            ms = _time_ms(lambda: scan_stats_hmac(mids, dual, columns, toks, offs, 4, device_tables,
                                                  keys_per_program=keys_per_program, block=block))
            row[f"hmac_ms_k{keys_per_program}_b{block}"] = ms
        best = min(v for name, v in row.items() if name.startswith("hmac_ms"))
        row["philox_key_tokens_per_s"] = key_tokens / (row["philox_ms"] / 1e3)
        row["hmac_key_tokens_per_s"] = key_tokens / (best / 1e3)
        row["hmac_over_philox_time"] = best / row["philox_ms"]
        rows.append(row)
        print("hmac_keyscan", row, flush=True)
        run.save()
