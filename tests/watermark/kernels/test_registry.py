"""After warm_up, a mixed workload compiles nothing: no first-request stall."""

from __future__ import annotations

import pytest
import torch

from tests.watermark.kernels import parity


@pytest.mark.gpu
def test_no_kernel_compiles_at_request_time(seed, cuda):
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
        # Batch and vocabulary sizes, strides, temperatures, keys, widths, positions,
        # routes, draft counts and dedup scopes never seen by the warm-up.
        for i, (batch, vocab) in enumerate([(1, 129_280), (3, 50_257), (77, 32_000), (256, 4099)]):
            dtype = registry.DTYPES[i % 3]
            parity.check_gumbel_sample(seed + i, batch, vocab, dtype, cuda)
            parity.check_gumbel_argmax(seed + i, batch, vocab, dtype, cuda)
            parity.check_exponential_race(seed + i, batch, vocab, dtype, cuda)
            parity.check_gumbel_sample(seed + i, batch, vocab, dtype, cuda, layout="pad")
        for i, (batch, k, vocab) in enumerate([(64, 4, 129_280), (3, 1, 50_257), (9, 7, 4096)]):
            parity.check_verify(seed + i, batch, k, vocab, registry.DTYPES[i % 3], cuda)
        dd = GpuDeduper(8, 600, cuda)
        for slot, scope in enumerate(["single_turn", "all", "none", "all"]):
            dd.open(slot, width=1 + 5 * slot, scope=scope, max_history=None if slot % 2 else 50, prompt=[1, 2, 3])
        slots = torch.arange(4, device=cuda)
        for step in range(20):
            dd.repeated(slots, torch.randint(0, 5, (4, step % 5), device=cuda))
            dd.append(slots, torch.randint(0, 5, (4, 1 + step % 3), device=cuda))
        torch.cuda.synchronize()
    after = registry.compiled_variants()
    assert after == before, {"before": before, "after": after, "hook": watch.compiled}
    assert not watch.compiled, watch.compiled
