"""The warm-up registry declares every variant the dispatchers can reach, and after
warm_up a mixed workload compiles nothing (no first-request stall).

The CPU test sweeps the dispatch paths (the functions the sampler, the CUDA dispatch of
watermark.gumbel / watermark.speculative and the engines call, with the arguments they
pass) over dtypes, layouts, batch and vocabulary sizes with the launches recorded but not
run (launch.recording(dry_run=True)), and fails on any variant the registry does not
declare. The GPU test runs in a fresh process or under ``-n 8`` alike: it warms up itself
and uses fixed seeds (SEEDS), not the random per-test seed of the parity tests.
"""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch

from tests.watermark.kernels import parity

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

SEEDS = (20261202, 7, 123_456_789)
LAYOUTS = ("contiguous", "pad", "offset", "columns")
VALUE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _rows(batch: int, device, width: int = 16):
    from watermark.prf import philox_torch as prf
    from watermark.sampler import SamplerRows

    keys = prf.keys_tensor([2**64 - 1 - b for b in range(batch)], device)
    return SamplerRows(key_a=keys, key_b=keys, alpha=torch.full((batch,), 0.5, device=device),
                       contexts=[[b] * (1 + b % width) for b in range(batch)],
                       watermark=torch.arange(batch, device=device) % 3 != 0,
                       greedy=torch.arange(batch, device=device) % 5 == 0, stream_keys=keys,
                       positions=torch.arange(batch, device=device))


def sweep_dispatchers(device) -> None:
    """Every dispatch path over dtypes x layouts x sizes (outputs unused)."""
    from watermark.kernels import dedup, gumbel as kernels, speculative as spec_kernels
    from watermark.dispatch import sample_cuda, verify_cuda as _verify_cuda
    from watermark.speculative import VerifyRows

    gen = torch.Generator().manual_seed(0)
    for dtype, layout, (batch, vocab) in itertools.product(
            VALUE_DTYPES, LAYOUTS, [(1, 64), (1, 65), (3, 4099), (256, 2048), (5, 32_000), (2, 7)]):
        logits = parity.non_contiguous(torch.randn(batch, vocab, generator=gen).to(dtype).to(device), gen, layout)
        rows = _rows(batch, device)
        sample_cuda(logits, rows)  # watermark.sampler's CUDA path (engines, the vLLM plugin)
        states = torch.zeros(batch, 4, dtype=torch.int64, device=device)
        kernels.gumbel_argmax(logits, rows.key_a, states)  # watermark.gumbel.gumbel_argmax on CUDA
        kernels.exponential_race(logits.abs(), rows.key_a, states)  # watermark.gumbel.exponential_race
        for lane in (1, 3):  # speculative drafts use their own stream lane
            sample_cuda(logits, rows, lane=lane)
    for dtype, other, (batch, k, vocab) in itertools.product(
            VALUE_DTYPES, (None, torch.float32), [(1, 1, 64), (3, 4, 12_928), (9, 7, 4099), (2, 2, 65)]):
        p = torch.rand(batch, k + 1, vocab, generator=gen).to(dtype).to(device)
        q = torch.rand(batch, k, vocab, generator=gen).to(other or dtype).to(device)
        rows = VerifyRows(key_b=torch.zeros(batch, dtype=torch.int64), key_coin=torch.zeros(batch, dtype=torch.int64),
                          keyed_coin=torch.zeros(batch, dtype=torch.bool),
                          contexts=[[[1] * (1 + j) for j in range(k + 1)] for _ in range(batch)],
                          watermark=torch.ones(batch, k + 1, dtype=torch.bool),
                          greedy=torch.zeros(batch, dtype=torch.bool), stream_keys=torch.zeros(batch, dtype=torch.int64),
                          positions=torch.zeros(batch, dtype=torch.int64))
        _verify_cuda(p, q, torch.zeros(batch, k, dtype=torch.int64, device=device), rows)
        spec_kernels.verify(p[:, :, 1:], q[:, :, 1:], torch.zeros(batch, k, dtype=torch.int64, device=device),
                            key_b=rows.key_b, key_coin=rows.key_coin, keyed_coin=rows.keyed_coin,
                            contexts=torch.zeros(batch, k + 1, 16, dtype=torch.int64), widths=torch.ones(batch),
                            watermark=rows.watermark, greedy=rows.greedy, stream_keys=rows.stream_keys,
                            positions=rows.positions)
    dd = dedup.GpuDeduper(4, 64, device)
    for slot, scope in enumerate(dedup.SCOPES):
        dd.open(slot, width=1 + slot, scope=scope, max_history=None if slot else 5, prompt=[1, 2, 3])
    slots = torch.arange(3, device=device)
    for k in (0, 3):
        dd.repeated(slots, torch.zeros(3, k, dtype=torch.int64, device=device) if k else None)
        dd.append(slots, torch.ones(3, 1 + k, dtype=torch.int64, device=device))
    # The vLLM plugin's decode step (service.engines.vllm.plugin_state).
    dd.step(slots, torch.ones(3, dtype=torch.int8, device=device), torch.ones(4, dtype=torch.int64, device=device))


def test_dispatchers_reach_only_declared_variants():
    from watermark.kernels import launch, registry

    with launch.recording(dry_run=True) as seen:
        sweep_dispatchers(torch.device("cpu"))
    declared = registry.declared_variants()
    undeclared = seen.variants - declared
    assert not undeclared, f"dispatchers reach variants the registry does not declare: {sorted(map(str, undeclared))}"
    # The sweep reaches every declared variant too (no declaration is dead weight).
    assert seen.variants == declared, sorted(map(str, declared - seen.variants))


def test_the_registry_check_catches_an_undeclared_variant():
    """A launch with a configuration outside DISPATCH_CONFIGS is seen as undeclared."""
    import dataclasses

    from watermark.kernels import gumbel as kernels, launch, registry

    other = dataclasses.replace(kernels.DEFAULT_CONFIG, compact=not kernels.DEFAULT_CONFIG.compact)
    with launch.recording(dry_run=True) as seen:
        kernels.gumbel_argmax(torch.zeros(2, 64), torch.zeros(2, dtype=torch.int64),
                              torch.zeros(2, 4, dtype=torch.int64), config=other)
    assert seen.variants and not seen.variants & registry.declared_variants()


@pytest.mark.gpu
def test_no_kernel_compiles_at_request_time(cuda):
    from watermark.kernels import registry
    from watermark.kernels.dedup import GpuDeduper

    report = registry.warm_up(cuda)
    before = registry.compiled_variants()
    assert all(count is not None for count in before.values()), before
    declared = {}
    for spec in report.specialisations:
        declared[spec.kernel] = declared.get(spec.kernel, 0) + 1
    assert all(before[name] >= declared[name] for name in declared), (before, declared)

    with registry.CompileWatch() as watch:
        # The dispatch paths on shapes, strides, temperatures, keys, widths, positions, routes,
        # draft counts and dedup scopes never seen by the warm-up.
        sweep_dispatchers(cuda)
        for seed in SEEDS:
            for i, (batch, vocab) in enumerate([(1, 129_280), (3, 50_257), (77, 32_000), (256, 4099)]):
                dtype = registry.DTYPES[(i + seed) % 3]
                for layout in LAYOUTS:
                    parity.check_gumbel_sample(seed + i, batch, vocab, dtype, cuda, layout=layout)
                parity.check_gumbel_argmax(seed + i, batch, vocab, dtype, cuda)
                parity.check_exponential_race(seed + i, batch, vocab, dtype, cuda)
            for i, (batch, k, vocab) in enumerate([(64, 4, 129_280), (3, 1, 50_257), (9, 7, 4096)]):
                parity.check_verify(seed + i, batch, k, vocab, registry.DTYPES[(i + seed) % 3], cuda)
        dd = GpuDeduper(8, 600, cuda)
        for slot, scope in enumerate(["single_turn", "all", "none", "all"]):
            dd.open(slot, width=1 + 5 * slot, scope=scope, max_history=None if slot % 2 else 50, prompt=[1, 2, 3])
        slots = torch.arange(4, device=cuda)
        gen = torch.Generator(device=cuda).manual_seed(SEEDS[0])
        for step in range(20):
            dd.repeated(slots, torch.randint(0, 5, (4, step % 5), device=cuda, generator=gen))
            dd.append(slots, torch.randint(0, 5, (4, 1 + step % 3), device=cuda, generator=gen))
        torch.cuda.synchronize()
    after = registry.compiled_variants()
    assert after == before, {"before": before, "after": after, "hook": watch.compiled}
    assert not watch.compiled, watch.compiled
