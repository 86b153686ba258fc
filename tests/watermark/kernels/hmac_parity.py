"""Parity checks of the 256-bit kernels (watermark.kernels.hmac) against their references, on
any device: the GPU tests call them on CUDA, ``hmac_interpreter`` through Triton's interpreter.
Run as ``TRITON_INTERPRET=1 python -m tests.watermark.kernels.hmac_parity [seed]``."""

from __future__ import annotations

import sys
import time

import torch

from tests.watermark.kernels.parity import assert_same, sampler_case, verify_case
from watermark import gumbel, sampler, speculative, stream
from watermark.hmac_rows import WideRows
from watermark.prf import hmac_philox
from watermark.processing import ProcessingParams, process_logits


def _wide_keys(gen: torch.Generator, batch: int) -> list[int]:
    edges = [0, 1, 2**64 - 1, 2**64, 2**255, 2**256 - 1]
    out = []
    for b in range(batch):
        out.append(edges[b] if b < len(edges) else int.from_bytes(torch.randint(0, 256, (32,), generator=gen,
                                                                               dtype=torch.uint8).numpy(), "big"))
    return out


def _mids(keys: list[int], device) -> torch.Tensor:
    return torch.tensor([hmac_philox.midstates(k) for k in keys], dtype=torch.int64, device=device)


def check_hmac_rows(seed: int, batch: int, device) -> None:
    """The rows' HMAC setup against hashlib's HMAC, every width 1..16."""
    from watermark.kernels.hmac import hmac_rows

    gen = torch.Generator().manual_seed(seed)
    keys_a, keys_b = _wide_keys(gen, batch), _wide_keys(gen, batch)[::-1]
    widths = (torch.arange(batch) % 16 + 1).to(torch.int32)
    contexts = torch.randint(-1, 2**31 - 1, (batch, 16), generator=gen, dtype=torch.int64)
    keys, states = hmac_rows(_mids(keys_a, device), _mids(keys_b, device), contexts.to(device), widths.to(device))
    keys, states = keys.cpu(), states.cpu()
    for b in range(batch):
        for slot, key in enumerate((keys_a[b], keys_b[b])):
            philox_key, state = hmac_philox.context_key_state(key, contexts[b, :int(widths[b])].tolist())
            assert int(keys[b, slot]) % 2**64 == philox_key, (b, slot)
            assert [int(s) % 2**32 for s in states[b, slot]] == list(state), (b, slot)


def hmac_case(seed: int, batch: int, vocab: int, dtype: torch.dtype, device, *, dist: str = "normal"):
    """gumbel_sample's random case with about two thirds of the rows on 256-bit keys."""
    logits, kernel_logits, args = sampler_case(seed, batch, vocab, dtype, device, dist=dist)
    gen = torch.Generator().manual_seed(seed + 1000)
    wide = torch.rand(batch, generator=gen) < 0.67
    keys_a, keys_b = _wide_keys(gen, batch), _wide_keys(gen, batch)
    zero = [0] * 16
    mids_a = torch.tensor([hmac_philox.midstates(k) if w else zero for k, w in zip(keys_a, wide.tolist())],
                          dtype=torch.int64)
    mids_b = torch.tensor([hmac_philox.midstates(k) if w else zero for k, w in zip(keys_b, wide.tolist())],
                          dtype=torch.int64)
    rows = WideRows(mids_a=mids_a.to(device), mids_b=mids_b.to(device), wide=wide.to(device))
    for name in ("key_a", "key_b"):  # a 256-bit row's 64-bit key is never read: make it 0 as the samplers do
        args[name] = torch.where(rows.wide, torch.zeros_like(args[name]), args[name])
    return logits, kernel_logits, args, rows


def check_gumbel_sample_hmac(seed: int, batch: int, vocab: int, dtype: torch.dtype, device, *,
                             dist: str = "normal", blocks_per_row: int | None = None,
                             lane: int = stream.LANE_SAMPLE) -> None:
    """The fused sampler with 256-bit rows against sampler.sample_reference (mixed batches:
    64-bit, 256-bit single and dual-key, skip and greedy rows, every context width)."""
    from watermark.kernels.hmac import gumbel_sample_hmac

    logits, kernel_logits, args, wide = hmac_case(seed, batch, vocab, dtype, device, dist=dist)
    got = gumbel_sample_hmac(kernel_logits, **args, mids_a=wide.mids_a, mids_b=wide.mids_b, wide=wide.wide,
                             blocks_per_row=blocks_per_row, lane=lane)
    want = reference_sample_wide(logits, args, wide, lane=lane)
    assert_same(f"gumbel_sample_hmac tokens (seed {seed})", got.tokens, want.tokens)
    assert_same(f"gumbel_sample_hmac routes (seed {seed})", got.routes, want.routes)


def reference_sample_wide(logits, args, wide: WideRows, lane: int = stream.LANE_SAMPLE):
    """parity.reference_sample's rows with the midstates: watermark.sampler.sample_reference."""
    batch = logits.shape[0]
    widths, ctx = args["widths"].tolist(), args["contexts"].tolist()
    rows = sampler.SamplerRows(
        key_a=args["key_a"], key_b=args["key_b"], alpha=args["alpha"],
        contexts=[ctx[b][: widths[b]] for b in range(batch)], watermark=args["watermark"],
        greedy=args["temperature"] == 0, stream_keys=args["stream_keys"], positions=args["positions"], wide=wide)
    params = ProcessingParams(temperature=args["temperature"], top_k=torch.zeros(batch, dtype=torch.int64),
                              top_p=torch.ones(batch))
    return sampler.sample_reference(process_logits(logits, params), rows, argmax=gumbel.gumbel_argmax_reference,
                                    lane=lane)


def verify_hmac_case(seed: int, batch: int, k: int, vocab: int, dtype: torch.dtype, device):
    """parity.verify_case with about two thirds of the rows on 256-bit keys (their key_b and
    key_coin 0, as the engine's rows hold them) and the rest on 64-bit keys."""
    p, q, x, args = verify_case(seed, batch, k, vocab, dtype, device)
    gen = torch.Generator().manual_seed(seed + 2000)
    wide = torch.rand(batch, generator=gen) < 0.67
    keys_b, keys_coin = _wide_keys(gen, batch), _wide_keys(gen, batch)[::-1]
    zero = [0] * 16
    mids_b = torch.tensor([hmac_philox.midstates(k) if w else zero for k, w in zip(keys_b, wide.tolist())],
                          dtype=torch.int64)
    mids_coin = torch.tensor([hmac_philox.midstates(k) if w else zero for k, w in zip(keys_coin, wide.tolist())],
                             dtype=torch.int64)
    rows = WideRows(mids_a=torch.zeros_like(mids_b).to(device), mids_b=mids_b.to(device), wide=wide.to(device),
                    mids_coin=mids_coin.to(device))
    for name in ("key_b", "key_coin"):
        args[name] = torch.where(rows.wide, torch.zeros_like(args[name]), args[name])
    return p, q, x, args, rows


def reference_verify_wide(p, q, x, args, wide: WideRows):
    batch, k = x.shape
    widths, ctx = args["widths"].tolist(), args["contexts"].tolist()
    rows = speculative.VerifyRows(
        key_b=args["key_b"], key_coin=args["key_coin"], keyed_coin=args["keyed_coin"],
        contexts=[[ctx[b][j][: widths[b]] for j in range(k + 1)] for b in range(batch)],
        watermark=args["watermark"], greedy=args["greedy"], stream_keys=args["stream_keys"],
        positions=args["positions"], wide=wide)
    return speculative.verify_reference(p, q, x, rows, race=gumbel.exponential_race_reference)


def check_verify_hmac(seed: int, batch: int, k: int, vocab: int, dtype: torch.dtype, device, *,
                      blocks_per_row: int | None = None) -> dict:
    """The fused verification with 256-bit rows against speculative.verify_reference (mixed
    batches: 64-bit and 256-bit rows, keyed and stream coins, greedy rows, skipped positions,
    every context width); returns how many wide rows took a keyed coin and a key-B correction."""
    from watermark.kernels.hmac_verify import verify_hmac

    p, q, x, args, wide = verify_hmac_case(seed, batch, k, vocab, dtype, device)
    got = verify_hmac(p, q, x, **args, wide=wide.wide, mids_b=wide.mids_b, mids_coin=wide.mids_coin,
                      blocks_per_row=blocks_per_row)
    want = reference_verify_wide(p, q, x, args, wide)
    assert_same(f"verify_hmac tokens (seed {seed})", got.tokens, want.tokens)
    assert_same(f"verify_hmac num_accepted (seed {seed})", got.num_accepted, want.num_accepted)
    assert_same(f"verify_hmac routes (seed {seed})", got.routes, want.routes)
    w = wide.wide.cpu()
    routes = want.routes.cpu()
    return {"wide_keyed_coin": int((w & args["keyed_coin"].cpu() & ~args["greedy"].cpu()).sum()),
            "wide_key_b_correction": int((w.unsqueeze(1) & (routes == 3)).sum())}


FORMS = (("single", False), ("max", True), ("sidak", True))


def check_keyscan_hmac(seed: int, device, widths=(1, 6, 7, 16), tile: int = 32, keys_per_program=(1, 3),
                       count: int = 5, forms=FORMS, short: bool = False) -> int:
    """The 256-bit corpus-scan kernel against watermark.keyscan.scan_stats_hmac_reference (hashlib's
    HMAC) and the CPU pass (compiled HMAC words into scan_stats_from_words): widths across the
    one/two inner-block edge, single and dual keys, texts of 0, 1 and tile +- 1 positions,
    repeated contexts skipped. Returns the number of launches checked."""
    import numpy as np

    from detector import screen
    from watermark import keyscan
    from watermark.kernels import keyscan as philox_kernel
    from watermark.kernels.keyscan_hmac import midstates_tensor, scan_stats_hmac
    from watermark.keyscan_cpu import context_columns

    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    checked = 0
    for width in widths:
        for form, dual in forms:
            texts = [np.array([], dtype=np.int64), np.array([5]), rng.integers(0, 3, tile + 1),
                     rng.integers(0, 2**32, tile - 1), rng.integers(-1, 2**31, tile), rng.integers(0, 40, 2 * tile + 3)]
            if short:  # the interpreter: the empty, one-position and repetitive texts only
                texts = texts[:3] + texts[5:]
            contexts, tokens, offsets = keyscan.pack_positions(texts, width, skip_padded=width % 2 == 0)
            keys_a = _wide_keys(gen, count)
            keys_b = _wide_keys(gen, count)[::-1] if dual else None
            tables = screen.scan_tables(form, float(rng.choice([0.0, 0.1, 0.5, 1.0])), int(np.diff(offsets).max()))
            expected = keyscan.scan_stats_hmac_reference(keys_a, keys_b, contexts, tokens, offsets, tables)
            impl = hmac_philox.HMAC_PHILOX
            cpu = keyscan.scan_stats_from_words(impl.words_many(keys_a, contexts, tokens),
                                                None if keys_b is None else impl.words_many(keys_b, contexts, tokens),
                                                offsets, tables)
            assert np.array_equal(cpu, expected), (seed, width, form)
            columns = torch.from_numpy(context_columns(contexts).view(np.int32)).to(device)
            toks = torch.from_numpy((tokens & 0xFFFFFFFF).astype(np.uint32).view(np.int32)).to(device)
            offs = torch.from_numpy(offsets).to(device)
            dev = philox_kernel.DeviceTables(tables, torch.device(device))
            mids = midstates_tensor(keys_a, keys_b, device)
            for keys in keys_per_program:
                got = scan_stats_hmac(mids, dual, columns, toks, offs, width, dev, keys_per_program=keys,
                                      block=tile).cpu().numpy()
                if not np.array_equal(got, expected):
                    t, k, stat = np.argwhere(got != expected)[0]
                    raise AssertionError(f"seed {seed}: width {width}, {form}, {keys} keys a program: text {t} key {k} "
                                         f"{keyscan.STATS[stat]} {got[t, k, stat]} != {expected[t, k, stat]}")
                checked += 1
    return checked


def main(seed: int) -> int:
    started = time.perf_counter()
    cpu = torch.device("cpu")
    checks = [
        ("hmac_rows every width", lambda: check_hmac_rows(seed, 20, cpu)),
        ("gumbel_sample_hmac fp32 mixed batch", lambda: check_gumbel_sample_hmac(seed, 12, 2100, torch.float32, cpu)),
        ("gumbel_sample_hmac bf16 zipf, 2 programs per row", lambda: check_gumbel_sample_hmac(
            seed + 1, 8, 5000, torch.bfloat16, cpu, dist="zipf", blocks_per_row=2)),
        ("gumbel_sample_hmac draft lane", lambda: check_gumbel_sample_hmac(seed + 2, 6, 700, torch.float32, cpu,
                                                                           lane=stream.LANE_DRAFT)),
        ("verify_hmac fp32 mixed batch k=3", lambda: check_verify_hmac(seed + 3, 10, 3, 1500, torch.float32, cpu)),
        ("verify_hmac bf16 k=1, 3 programs per row", lambda: check_verify_hmac(
            seed + 4, 6, 1, 4099, torch.bfloat16, cpu, blocks_per_row=3)),
        # The interpreter runs each SHA-256 round as numpy calls: few keys, short tiles.
        ("keyscan_hmac width 7 (two inner blocks) single", lambda: check_keyscan_hmac(
            seed + 5, "cpu", widths=(7,), tile=8, count=1, keys_per_program=(1,), forms=FORMS[:1], short=True)),
        # (Key counts that are no multiple of a program's keys: the GPU test, 21 keys 4 a program.)
        ("keyscan_hmac width 2 dual", lambda: check_keyscan_hmac(
            seed + 6, "cpu", widths=(2,), tile=8, count=1, keys_per_program=(1,), forms=FORMS[1:2], short=True)),
    ]
    for name, check in checks:
        t0 = time.perf_counter()
        check()
        print(f"ok  {name} ({time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"all {len(checks)} checks passed in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
