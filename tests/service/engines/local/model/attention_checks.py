"""Checks of the batch-invariant attention kernels (service/engines/local/model/attention.py):
parity with the torch references, and the property they exist for: a query's result is
bit-for-bit the same whatever else is in the batch, however many key columns the step's
window holds, and however many queries its row has.

Run on CUDA by test_attention.py, and on the CPU through Triton's interpreter as
``TRITON_INTERPRET=1 python -m tests.service.engines.local.model.attention_checks SEED``.
"""

from __future__ import annotations

import sys

import torch

from service.engines.local.model import attention as attn


def _relative(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp(min=1e-30))


def _inputs(gen, batch, seq, heads, groups, dim, dim2, dim_v, columns, dtype, device):
    def r(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    q, k, v = r(batch, seq, heads, dim), r(batch, columns, groups, dim), r(batch, columns, groups, dim_v)
    q2 = r(batch, seq, heads, dim2) if dim2 else None
    k2 = r(batch, columns, groups, dim2) if dim2 else None
    mask = (torch.rand(batch, seq, columns, generator=gen) < 0.7).to(device)
    bound = torch.randint(0, columns + 1, (batch, seq), generator=gen).to(device)
    bound[0, 0] = 0  # a padding query: no column at all
    bound[-1, -1] = columns
    return q, k, v, q2, k2, mask, bound


def check_attention(seed: int, device, dtype=torch.float32, *, heads=4, groups=1, dim=64, dim2=16, dim_v=64,
                    columns=150) -> None:
    """Kernel vs reference (relative error, float64 reference), zeros where a query has no key."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, q2, k2, mask, bound = _inputs(gen, 3, 5, heads, groups, dim, dim2, dim_v, columns, dtype, device)
    scale = dim ** -0.5
    out = attn.attention(q, k, v, mask, bound, scale, q2, k2)
    ref = attn.attention_reference(q.double(), k.double(), v.double(), mask, bound, scale,
                                   None if q2 is None else q2.double(), None if k2 is None else k2.double())
    assert out.dtype == torch.float32 and not out.isnan().any(), f"seed {seed}: NaN or wrong dtype"
    limit = 1e-5 if dtype == torch.float32 else 2e-2
    error = _relative(out, ref)
    assert error <= limit, f"seed {seed}: attention relative error {error:.2e} > {limit:.0e}"
    assert torch.equal(out[0, 0], torch.zeros_like(out[0, 0])), f"seed {seed}: a query without keys is not 0"


def check_attention_invariance(seed: int, device, dtype=torch.float32, *, heads=4, groups=1, dim=64, dim2=16,
                               dim_v=64) -> None:
    """One row's queries: alone with a 130-column window, in a batch of 6 with 1,024 columns,
    and one query of it alone in its row: bit-identical outputs."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, q2, k2, mask, bound = _inputs(gen, 6, 5, heads, groups, dim, dim2, dim_v, 1024, dtype, device)
    bound[2] = torch.tensor([70, 71, 72, 73, 129])  # row 2 reaches column 128 at most
    scale = dim ** -0.5
    wide = attn.attention(q, k, v, mask, bound, scale, q2, k2)[2]
    window = 130
    alone = attn.attention(q[2:3], k[2:3, :window], v[2:3, :window], mask[2:3, :, :window], bound[2:3], scale,
                           None if q2 is None else q2[2:3], None if k2 is None else k2[2:3, :window])[0]
    assert torch.equal(wide, alone), f"seed {seed}: a row's attention depends on its batch or window"
    one = attn.attention(q[2:3, 3:4], k[2:3], v[2:3], mask[2:3, 3:4], bound[2:3, 3:4], scale,
                         None if q2 is None else q2[2:3, 3:4], None if k2 is None else k2[2:3])[0, 0]
    assert torch.equal(wide[3], one), f"seed {seed}: a query's attention depends on its row's other queries"


def check_index_scores(seed: int, device, dtype=torch.float32) -> None:
    """Indexer scores: kernel vs reference, and a row's scores the same in a batch of 4 over
    300 columns as alone over 150."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(4, 5, 4, 32, generator=gen).to(dtype).to(device)
    k = torch.randn(4, 300, 32, generator=gen).to(dtype).to(device)
    w = torch.randn(4, 5, 4, generator=gen).to(device)
    out = attn.index_scores(q, k, w, 32 ** -0.5)
    ref = attn.index_scores_reference(q.double(), k.double(), w.double(), 32 ** -0.5)
    error = _relative(out, ref)
    assert error <= 1e-5, f"seed {seed}: index scores relative error {error:.2e}"
    alone = attn.index_scores(q[1:2], k[1:2, :150], w[1:2], 32 ** -0.5)[0]
    assert torch.equal(out[1, :, :150], alone), f"seed {seed}: a row's index scores depend on its batch or window"


def check_batched_linear(seed: int, device, dtype=torch.float32, start: int = 37) -> None:
    """The MoE's products: kernel vs reference, and rows ``start`` .. + 2 of 100 the same as
    those 3 alone (at the first rows of a tile: on the device every row of a tile is
    computed alike; the interpreter's numpy products are not, so it checks start = 32),
    for a shared and a per-expert weight."""
    from service.engines.local.model import matmul

    gen = torch.Generator().manual_seed(seed)
    for experts, rows, depth, outs in ((1, 100, 256, 72), (3, 100, 128, 40)):
        x = torch.randn(experts, rows, depth, generator=gen).to(dtype).to(device)
        w = torch.randn(experts, outs, depth, generator=gen).to(dtype).to(device)
        out = matmul.batched_linear(x, w)
        ref = matmul.batched_linear_reference(x.double(), w.double())
        error = _relative(out, ref)
        limit = 1e-5 if dtype == torch.float32 else 1e-2
        assert error <= limit, f"seed {seed}: batched_linear relative error {error:.2e}"
        few = matmul.batched_linear(x[:, start:start + 3].contiguous(), w)
        assert torch.equal(few, out[:, start:start + 3]), f"seed {seed}: a row's product depends on the other rows"


def main(seed: int) -> int:
    cpu = torch.device("cpu")
    check_attention(seed, cpu)
    check_attention(seed + 1, cpu, heads=3, groups=1, dim=64, dim2=0, dim_v=64, columns=70)  # Llama draft
    check_attention(seed + 2, cpu, heads=4, groups=2, dim=16, dim2=0, dim_v=32, columns=64)
    check_attention_invariance(seed + 3, cpu)
    check_index_scores(seed + 4, cpu)
    check_batched_linear(seed + 5, cpu, start=32)
    print("attention checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
