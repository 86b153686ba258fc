"""Row-invariant matrix products for the MoE: a row's result never depends on how many rows
the call has or where the row sits among them.

cuBLAS chooses its kernel (tiles, K splits) from the shapes, so a token's router scores and
expert outputs could change with the batch bucket: on the H200 the bundled model's MoE gave
a row different bits once the call held 40 rows or more
(``tests/service/engines/local/model/test_batch_invariance.py``), which is 8 rows of a
verify step. :func:`batched_linear` fixes every tile shape and the order of the sum over K
instead (one program per BLOCK_M rows x BLOCK_J outputs, K walked in BLOCK_K steps). The
plain linear layers of the models passed the same test with cuBLAS and keep it.

:func:`batched_linear_reference` is the CPU path and the parity baseline
(``tests/service/engines/local/model/test_attention.py``).
"""

from __future__ import annotations

import torch

from service.engines.local.model.attention import _kernel_for, triton

if triton is not None:
    import triton.language as tl

BLOCK_M, BLOCK_J, BLOCK_K = 16, 64, 32


def batched_linear_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [E, N, K] and weights w [E, J, K] (E = 1 broadcasts either) -> [E, N, J] in x's
    dtype: ``F.linear`` per E (float32 accumulation, as cuBLAS)."""
    return torch.matmul(x, w.transpose(-1, -2))


def batched_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """:func:`batched_linear_reference`, on CUDA by the row-invariant Triton kernel."""
    if not _kernel_for(x):
        return batched_linear_reference(x, w)
    if x.dim() != 3 or w.dim() != 3 or x.shape[-1] != w.shape[-1]:
        raise ValueError("batched_linear: x [E, N, K] and w [E, J, K]")
    batches = max(x.shape[0], w.shape[0])
    _, rows, depth = x.shape
    outs = w.shape[1]
    if x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError("batched_linear: the K dimension must be contiguous")
    out = torch.empty((batches, rows, outs), dtype=x.dtype, device=x.device)
    sx = x.stride(0) if x.shape[0] > 1 else 0
    sw = w.stride(0) if w.shape[0] > 1 else 0
    _batched_linear_kernel[(triton.cdiv(rows, BLOCK_M), triton.cdiv(outs, BLOCK_J), batches)](
        x, w, out, rows, outs, depth, sx, x.stride(1), sw, w.stride(1), out.stride(0), out.stride(1),
        IEEE=x.dtype == torch.float32, BLOCK_M=BLOCK_M, BLOCK_J=BLOCK_J, BLOCK_K=BLOCK_K, num_warps=4)
    return out


if triton is not None:
    from service.engines.local.model.attention import _dot

    _ARGS = ["x_ptr", "w_ptr", "out_ptr", "rows", "outs", "depth", "sx_e", "sx_n", "sw_e", "sw_j", "so_e", "so_n"]

    @triton.jit(do_not_specialize=_ARGS)
    def _batched_linear_kernel(x_ptr, w_ptr, out_ptr, rows, outs, depth, sx_e, sx_n, sw_e, sw_j, so_e, so_n,
                               IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr,
                               BLOCK_K: tl.constexpr):
        n = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
        e = tl.program_id(2).to(tl.int64)
        kk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_J), tl.float32)
        for start in range(0, depth, BLOCK_K):
            k = start + kk
            a = tl.load(x_ptr + e * sx_e + n[:, None] * sx_n + k[None, :],
                        mask=(n[:, None] < rows) & (k[None, :] < depth), other=0.0)
            b = tl.load(w_ptr + e * sw_e + j[None, :] * sw_j + k[:, None],
                        mask=(j[None, :] < outs) & (k[:, None] < depth), other=0.0)
            acc += _dot(a, b, IEEE)
        tl.store(out_ptr + e * so_e + n[:, None] * so_n + j[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=(n[:, None] < rows) & (j[None, :] < outs))
