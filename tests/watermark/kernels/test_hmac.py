"""The 256-bit kernels (watermark.kernels.hmac): the rows' HMAC setup and the fused sampler
with HMAC-derived rows, bit-exact against their references. On the GPU (``gpu``) at real
sizes; on the CPU through Triton's interpreter (hmac_parity.main, in a subprocess because
TRITON_INTERPRET must be set before the kernels are decorated)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.watermark.kernels import hmac_parity

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_hmac_kernels_match_references_in_the_interpreter(seed):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "-m", "tests.watermark.kernels.hmac_parity", str(seed)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


@pytest.mark.gpu
def test_hmac_rows_gpu(seed, cuda):
    hmac_parity.check_hmac_rows(seed, 300, cuda)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch, vocab, dist", [(256, 129_280, "normal"), (64, 151_936, "zipf"), (3, 1000, "normal")])
def test_gumbel_sample_hmac_gpu(seed, cuda, dtype, batch, vocab, dist):
    hmac_parity.check_gumbel_sample_hmac(seed, batch, vocab, dtype, cuda, dist=dist)


@pytest.mark.gpu
def test_dispatch_picks_the_hmac_kernel_for_wide_rows(cuda):
    from watermark import dispatch, sampler
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    keys = [WatermarkKey(2**255 + 9, WatermarkSpec(prf="hmac-sha256-philox-v1")).row_keys(),
            WatermarkKey(9, WatermarkSpec()).row_keys()]
    rows = sampler.sampler_rows(keys, contexts=[(1, 2, 3), (4,)], watermark=[True, True], greedy=[False, False],
                                stream_keys=[1, 2], positions=[0, 0], device=cuda)
    logits = torch.randn(2, 50_000, device=cuda)
    got = dispatch.sample(logits, rows)
    want = sampler.sample_reference(logits.cpu(), sampler.sampler_rows(
        keys, contexts=[(1, 2, 3), (4,)], watermark=[True, True], greedy=[False, False], stream_keys=[1, 2],
        positions=[0, 0]))
    assert torch.equal(got.tokens.cpu(), want.tokens) and torch.equal(got.routes.cpu(), want.routes)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch, k, vocab", [(64, 4, 129_280), (7, 1, 4099), (33, 3, 50_257)])
def test_verify_hmac_gpu(seed, cuda, dtype, batch, k, vocab):
    hmac_parity.check_verify_hmac(seed, batch, k, vocab, dtype, cuda)


@pytest.mark.gpu
def test_verify_hmac_covers_keyed_coins_and_key_b_corrections(seed, cuda):
    totals = {}
    for i in range(3):
        for name, count in hmac_parity.check_verify_hmac(seed + i, 50, 4, 3001, torch.float32, cuda,
                                                         blocks_per_row=3).items():
            totals[name] = totals.get(name, 0) + count
    assert all(count > 0 for count in totals.values()), totals


@pytest.mark.gpu
def test_keyscan_hmac_gpu(seed, cuda):
    # 4 keys a program, tiles of 128: the variant the GPU scan (service.scan.gpu) launches; 21 keys,
    # no multiple of 4.
    checked = hmac_parity.check_keyscan_hmac(seed, "cuda", widths=(1, 4, 6, 7, 9, 16), tile=128,
                                             keys_per_program=(4,), count=21)
    assert checked == 6 * 3


@pytest.mark.gpu
def test_dispatch_verifies_wide_rows_with_the_hmac_kernel(seed, cuda):
    """dispatch.verify on CUDA with 256-bit rows (midstates from real keys, keyed and stream
    coins) gives the CPU reference's tokens, counts and routes."""
    import dataclasses

    from watermark import dispatch, hmac_rows, speculative
    from watermark.key import WatermarkKey
    from watermark.prf import philox_torch
    from watermark.spec import WatermarkSpec

    specs = [WatermarkSpec(prf="hmac-sha256-philox-v1", algorithm="dual_key_gumbel", coin="keyed"),
             WatermarkSpec(prf="hmac-sha256-philox-v1", algorithm="dual_key_gumbel"),
             WatermarkSpec(algorithm="dual_key_gumbel", coin="keyed")]
    keys = [WatermarkKey((2**255 if spec.key_bits == 256 else 2**63) + seed + i, spec).row_keys()
            for i, spec in enumerate(specs)]
    batch, k, vocab = len(keys), 3, 50_000
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen) * 3, -1)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen) * 3, -1)
    drafts = torch.stack([torch.multinomial(q[:, j], 1, generator=gen).squeeze(-1) for j in range(k)], -1)
    contexts = [speculative.block_contexts((7, 8, 9, 10), d) for d in drafts.tolist()]
    rows = speculative.VerifyRows(
        key_b=philox_torch.keys_tensor([hmac_rows.narrow_key(r, "key_b") for r in keys], "cpu"),
        key_coin=philox_torch.keys_tensor([hmac_rows.narrow_key(r, "key_coin") for r in keys], "cpu"),
        keyed_coin=torch.tensor([True, False, True]), contexts=contexts,
        watermark=torch.ones(batch, k + 1, dtype=torch.bool), greedy=torch.zeros(batch, dtype=torch.bool),
        stream_keys=torch.tensor([3, 4, 5]), positions=torch.tensor([0, 10, 20]), wide=hmac_rows.wide_rows(keys))
    want = speculative.verify_reference(p, q, drafts, rows)
    on_device = dataclasses.replace(
        rows, key_b=rows.key_b.to(cuda), key_coin=rows.key_coin.to(cuda), keyed_coin=rows.keyed_coin.to(cuda),
        watermark=rows.watermark.to(cuda), greedy=rows.greedy.to(cuda), stream_keys=rows.stream_keys.to(cuda),
        positions=rows.positions.to(cuda), wide=hmac_rows.wide_rows(keys, cuda))
    got = dispatch.verify(p.to(cuda), q.to(cuda), drafts.to(cuda), on_device)
    for name in ("tokens", "num_accepted", "routes"):
        assert torch.equal(getattr(got, name).cpu(), getattr(want, name)), name
