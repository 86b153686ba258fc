"""Batch-invariant attention over the static caches: a query's result depends only on its
own row's columns, never on the batch it runs in or on the column window of the step.

Why a kernel of our own: on CUDA in bf16, ``F.scaled_dot_product_attention`` and the GEMMs
around it choose their algorithm (tiles, splits, reduction trees) from the shapes, and the
shapes here change with the batch's longest row (the column window: 128 ... 1,024) and the
batch bucket. A 600-token request then differed from token 140 on beside a long prompt.
:func:`attention` fixes the order of every sum instead: one program per (row, query, key
group) walks its row's columns in fixed blocks of ``BLOCK_N`` from column 0 up to the
query's own bound (``bound`` [B, S], read on the device, so one CUDA graph serves every
length), with an online softmax in float32. Blocks past a query's bound are never visited,
and masked columns inside a visited block add exactly nothing (their weight is exp(-inf) =
0 and the running maximum is unchanged), so neither the window nor the batch can move a
bit. :func:`index_scores` does the same for the DeepSeek-V3.2 indexer's scores (one column
per output, a fixed sum over heads).

Two key parts (``q2``/``k2``) serve MLA with weight absorption (DeepSeek-V2, arXiv:2405.04434
section 2.1.3: queries multiplied into the latent space, keys and values are the cached latent
itself plus the shared rotary key): no per-column expansion of the latent at all.

The torch references (:func:`attention_reference`, :func:`index_scores_reference`) are the
CPU path and the kernels' parity baseline (``tests/service/engines/local/model/test_attention.py``).
"""

from __future__ import annotations

import os

import torch

try:  # the CPU path needs only the references
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

BLOCK_N = 64
"""Key columns per block (fixed: the order of the softmax sums never depends on a shape)."""
BLOCK_H = 16
"""Query heads per program, padded (tl.dot needs 16 rows)."""


def _kernel_for(t: torch.Tensor) -> bool:
    """The Triton kernel on CUDA (or anywhere under Triton's interpreter, for the CPU checks)."""
    return triton is not None and (t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                        bound: torch.Tensor, scale: float, q2: torch.Tensor | None = None,
                        k2: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, S, H, D], k [B, T, G, D], v [B, T, G, Dv] (G key groups, H a multiple of G),
    optional second key part q2 [B, S, H, D2] / k2 [B, T, G, D2] (scores add q2 . k2), mask
    [B, S, T] bool, bound [B, S] (a query sees columns < bound only) -> out [B, S, H, Dv]
    float32. A query with no column to attend to gets zeros."""
    heads, groups = q.shape[2], k.shape[2]
    rep = heads // groups

    def expand(t):  # [B, T, G, D] -> [B, H, T, D]
        return t.float().repeat_interleave(rep, dim=2).transpose(1, 2)

    scores = torch.matmul(q.float().transpose(1, 2), expand(k).transpose(-1, -2))  # [B, H, S, T]
    if q2 is not None:
        scores = scores + torch.matmul(q2.float().transpose(1, 2), expand(k2).transpose(-1, -2))
    cols = torch.arange(k.shape[1], device=k.device)
    keep = (mask & (cols < bound.unsqueeze(-1))).unsqueeze(1)  # [B, 1, S, T]
    scores = (scores * scale).masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1).masked_fill(~keep, 0.0)  # no key: NaN rows -> 0
    return torch.matmul(weights, expand(v)).transpose(1, 2)


def index_scores_reference(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, scale: float) -> torch.Tensor:
    """The lightning indexer's scores: q [B, S, Hi, D], keys k [B, T, D], per-head weights
    [B, S, Hi] -> [B, S, T] float32 = sum_h weights[h] * relu(scale * q[h] . k[t])
    (transformers' DeepseekV32Indexer)."""
    scores = torch.relu(torch.matmul(q.float(), k.float().transpose(-1, -2).unsqueeze(1)) * scale)  # [B, S, Hi, T]
    return torch.matmul(weights.float().unsqueeze(-2), scores).squeeze(-2)


def attention(q, k, v, mask, bound, scale: float, q2=None, k2=None) -> torch.Tensor:
    """:func:`attention_reference`, on CUDA by the Triton kernel (batch- and window-invariant)."""
    if not _kernel_for(q):
        return attention_reference(q, k, v, mask, bound, scale, q2, k2)
    batch, seq, heads, dim = q.shape
    groups, dim_v = k.shape[2], v.shape[3]
    if heads % groups or heads // groups > BLOCK_H:
        raise ValueError(f"attention: {heads} query heads over {groups} key groups is not supported")
    two = q2 is not None
    dim2 = q2.shape[3] if two else 16
    for t, d in ((q, dim), (k, dim), (v, dim_v)) + (((q2, dim2), (k2, dim2)) if two else ()):
        if t.stride(-1) != 1 or d < 16 or d & (d - 1):
            raise ValueError("attention: head dimensions must be contiguous powers of two >= 16")
    if not two:
        q2, k2 = q, k  # unread (TWO is False)
    out = torch.empty((batch, seq, heads, dim_v), dtype=torch.float32, device=q.device)
    mask = mask.to(torch.int8) if mask.dtype == torch.bool else mask
    bound = bound.to(torch.int32)
    _attention_kernel[(batch * seq * groups,)](
        q, q2, k, k2, v, mask, bound, out,
        seq, groups, heads // groups,
        q.stride(0), q.stride(1), q.stride(2), q2.stride(0), q2.stride(1), q2.stride(2),
        k.stride(0), k.stride(1), k.stride(2), k2.stride(0), k2.stride(1), k2.stride(2),
        v.stride(0), v.stride(1), v.stride(2), mask.stride(0), mask.stride(1), mask.stride(2),
        bound.stride(0), bound.stride(1), out.stride(0), out.stride(1), out.stride(2), scale,
        D=dim, D2=dim2, DV=dim_v, TWO=two, IEEE=k.dtype == torch.float32, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N,
        num_warps=4)
    return out


def index_scores(q, k, weights, scale: float) -> torch.Tensor:
    """:func:`index_scores_reference`, on CUDA by the Triton kernel (one program per query
    and block of columns: each column's score is one fixed sum)."""
    if not _kernel_for(q):
        return index_scores_reference(q, k, weights, scale)
    batch, seq, heads, dim = q.shape
    columns = k.shape[1]
    if heads > BLOCK_H or dim < 16 or dim & (dim - 1) or q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("index_scores: unsupported indexer shape")
    weights = weights.float()
    out = torch.empty((batch, seq, columns), dtype=torch.float32, device=q.device)
    _index_scores_kernel[(batch * seq, triton.cdiv(columns, BLOCK_N))](
        q, k, weights, out, seq, heads, columns,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
        weights.stride(0), weights.stride(1), weights.stride(2), out.stride(0), out.stride(1), scale,
        D=dim, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, num_warps=4)
    return out


if triton is not None:
    _ATTENTION_ARGS = [
        "q_ptr", "q2_ptr", "k_ptr", "k2_ptr", "v_ptr", "mask_ptr", "bound_ptr", "out_ptr",
        "seq", "groups", "per_group",
        "sq_b", "sq_s", "sq_h", "sq2_b", "sq2_s", "sq2_h", "sk_b", "sk_t", "sk_g", "sk2_b", "sk2_t", "sk2_g",
        "sv_b", "sv_t", "sv_g", "sm_b", "sm_s", "sm_t", "sb_b", "sb_s", "so_b", "so_s", "so_h", "scale"]

    @triton.jit
    def _dot(a, b, IEEE: tl.constexpr):
        """a @ b with float32 accumulation; float32 operands in full precision (never tf32)."""
        if IEEE:
            out = tl.dot(a, b, input_precision="ieee")
        else:
            out = tl.dot(a, b)
        return out

    @triton.jit(do_not_specialize=_ATTENTION_ARGS)
    def _attention_kernel(q_ptr, q2_ptr, k_ptr, k2_ptr, v_ptr, mask_ptr, bound_ptr, out_ptr,
                          seq, groups, per_group,
                          sq_b, sq_s, sq_h, sq2_b, sq2_s, sq2_h, sk_b, sk_t, sk_g, sk2_b, sk2_t, sk2_g,
                          sv_b, sv_t, sv_g, sm_b, sm_s, sm_t, sb_b, sb_s, so_b, so_s, so_h, scale,
                          D: tl.constexpr, D2: tl.constexpr, DV: tl.constexpr, TWO: tl.constexpr,
                          IEEE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
        pid = tl.program_id(0)
        g = pid % groups
        bs = pid // groups
        s = bs % seq
        b = bs // seq
        hs = tl.arange(0, BLOCK_H)
        live_h = hs < per_group
        heads = g * per_group + hs
        d = tl.arange(0, D)
        dv = tl.arange(0, DV)
        kdtype = k_ptr.dtype.element_ty
        q = tl.load(q_ptr + b * sq_b + s * sq_s + heads[:, None] * sq_h + d[None, :], mask=live_h[:, None],
                    other=0.0).to(kdtype)
        if TWO:
            d2 = tl.arange(0, D2)
            q2 = tl.load(q2_ptr + b * sq2_b + s * sq2_s + heads[:, None] * sq2_h + d2[None, :],
                         mask=live_h[:, None], other=0.0).to(kdtype)
        bound = tl.load(bound_ptr + b * sb_b + s * sb_s)
        m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_H,), tl.float32)
        acc = tl.zeros((BLOCK_H, DV), tl.float32)
        for start in range(0, bound, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            inside = cols < bound
            keep = tl.load(mask_ptr + b * sm_b + s * sm_s + cols * sm_t, mask=inside, other=0) != 0
            k = tl.load(k_ptr + b * sk_b + cols[:, None] * sk_t + g * sk_g + d[None, :], mask=inside[:, None],
                        other=0.0)
            qk = _dot(q, tl.trans(k), IEEE)
            if TWO:
                k2 = tl.load(k2_ptr + b * sk2_b + cols[:, None] * sk2_t + g * sk2_g + d2[None, :],
                             mask=inside[:, None], other=0.0)
                qk += _dot(q2, tl.trans(k2), IEEE)
            qk = tl.where(keep[None, :], qk * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, axis=1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: keep everything 0, not NaN
            alpha = tl.exp(m_i - m_ref)  # exactly 1 when this block leaves the maximum unchanged
            p = tl.exp(qk - m_ref[:, None])  # exactly 0 at masked columns
            v = tl.load(v_ptr + b * sv_b + cols[:, None] * sv_t + g * sv_g + dv[None, :], mask=inside[:, None],
                        other=0.0)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
            m_i = m_new
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + b * so_b + s * so_s + heads[:, None] * so_h + dv[None, :], out, mask=live_h[:, None])

    _INDEX_ARGS = ["q_ptr", "k_ptr", "w_ptr", "out_ptr", "seq", "heads", "columns", "sq_b", "sq_s", "sq_h",
                   "sk_b", "sk_t", "sw_b", "sw_s", "sw_h", "so_b", "so_s", "scale"]

    @triton.jit(do_not_specialize=_INDEX_ARGS)
    def _index_scores_kernel(q_ptr, k_ptr, w_ptr, out_ptr, seq, heads, columns, sq_b, sq_s, sq_h, sk_b, sk_t,
                             sw_b, sw_s, sw_h, so_b, so_s, scale,
                             D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
        bs = tl.program_id(0)
        s = bs % seq
        b = bs // seq
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        inside = cols < columns
        hs = tl.arange(0, BLOCK_H)
        live_h = hs < heads
        d = tl.arange(0, D)
        q = tl.load(q_ptr + b * sq_b + s * sq_s + hs[:, None] * sq_h + d[None, :], mask=live_h[:, None],
                    other=0.0).to(tl.float32)
        k = tl.load(k_ptr + b * sk_b + cols[:, None] * sk_t + d[None, :], mask=inside[:, None],
                    other=0.0).to(tl.float32)
        w = tl.load(w_ptr + b * sw_b + s * sw_s + hs * sw_h, mask=live_h, other=0.0)
        scores = tl.maximum(tl.dot(q, tl.trans(k), input_precision="ieee") * scale, 0.0)
        out = tl.sum(scores * w[:, None], axis=0)
        tl.store(out_ptr + b * so_b + s * so_s + cols, out, mask=inside)
