#!/usr/bin/env python3
"""Numerical probe: batched KV-cache decoding vs single-sequence decoding (DeepseekV32, Llama).

For a step-level continuous-batching engine built on transformers' ``DynamicCache``, checks:

1. left-padded batched prefill + decode, with a 2-D ``attention_mask`` and explicit
   ``position_ids``, against each sequence decoded alone (no padding) -- max |logit diff|;
   the same without ``position_ids`` (transformers then uses cache columns as positions);
2. whether the DeepSeek-V3.2 indexer ever lets a padded key through (it selects top-k over
   all cache columns; padded columns must get no attention weight);
3. joining: per-request caches prefilled separately, merged (left-pad along time + concat
   along batch), decoded together; leaving: ``batch_select_indices`` + dropping all-pad
   leading columns; multi-token (speculative verify) steps; rollback by cropping and by
   masking rejected positions ("holes" in the attention mask).

Runs on CPU in fp32. Prints one line per check with the max abs logit difference and the
max abs logit itself (for scale).

Usage:
  python scripts/models/probe_batching.py                       # random tiny models
  python scripts/models/probe_batching.py --target DIR --draft DIR   # trained checkpoints
"""

from __future__ import annotations

import argparse

import torch
from transformers import (
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
)

PAD = 2


# ---------------------------------------------------------------------------------------------
# cache surgery helpers (the ones NOTES.md documents)
# ---------------------------------------------------------------------------------------------


def left_pad_time(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def merge_caches(model, caches: list[DynamicCache], masks: list[torch.Tensor]):
    """Concatenate per-request caches (each batch >= 1) into one batch, left-padding in time.

    Works for DynamicLayer (Llama: keys/values [B, H_kv, T, D]) and DynamicIndexedLayer
    (DeepseekV32: keys = compressed kv latent [B, 1, T, kv_lora_rank], values = rotated shared
    key [B, 1, T, qk_rope_head_dim], indexer_keys [B, T, index_head_dim]).
    """
    t_max = max(m.shape[1] for m in masks)
    merged = DynamicCache(config=model.config)
    for li in range(len(caches[0].layers)):
        src = [c.layers[li] for c in caches]
        pads = [t_max - m.shape[1] for m in masks]
        keys = torch.cat([left_pad_time(s.keys, p, -2) for s, p in zip(src, pads)], dim=0)
        values = torch.cat([left_pad_time(s.values, p, -2) for s, p in zip(src, pads)], dim=0)
        dst = merged.layers[li]
        dst.lazy_initialization(keys, values)
        dst.keys, dst.values = keys, values
        if getattr(src[0], "indexer_keys", None) is not None:
            ik = torch.cat([left_pad_time(s.indexer_keys, p, 1) for s, p in zip(src, pads)], dim=0)
            dst.lazy_initialization_indexer(ik)
            dst.indexer_keys = ik
    mask = torch.cat([left_pad_time(m, t_max - m.shape[1], 1) for m in masks], dim=0)
    return merged, mask


def drop_leading_columns(cache: DynamicCache, mask: torch.Tensor):
    """Remove cache columns that are padding for every row (after the longest request left)."""
    keep_from = int((mask.sum(0) > 0).nonzero()[0]) if mask.any() else mask.shape[1]
    if keep_from == 0:
        return mask
    for layer in cache.layers:
        layer.keys = layer.keys[..., keep_from:, :]
        layer.values = layer.values[..., keep_from:, :]
        if getattr(layer, "indexer_keys", None) is not None:
            layer.indexer_keys = layer.indexer_keys[:, keep_from:, :]
    return mask[:, keep_from:]


def patch_stable_topk() -> None:
    """Give DeepseekV32Indexer the engine's deterministic top-k (service/engines/local/stable_topk.py):
    ``torch.topk`` breaks ties (ReLU makes exact ties at 0 common) differently for different
    tensor shapes; a stable descending sort breaks them by key column for every shape."""
    import sys
    from pathlib import Path

    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
    from service.engines.local.stable_topk import _stable_forward

    m.DeepseekV32Indexer.forward = torch.no_grad()(_stable_forward)


# ---------------------------------------------------------------------------------------------
# reference and batched runs
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def run_single(model, prompt: list[int], forced: list[int]) -> torch.Tensor:
    """Unpadded single sequence: prefill, then one token per step. Returns [1+len(forced), V]."""
    cache = DynamicCache(config=model.config)
    out = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
    logits = [out.logits[0, -1]]
    for t in forced:
        out = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
        logits.append(out.logits[0, -1])
    return torch.stack(logits)


def left_pad_batch(prompts: list[list[int]]):
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), PAD)
    mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p) :] = torch.tensor(p)
        mask[i, L - len(p) :] = 1
    return ids, mask


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp_min(0)


@torch.no_grad()
def run_batched(model, prompts, forced, explicit_positions=True) -> list[torch.Tensor]:
    ids, mask = left_pad_batch(prompts)
    pos = positions_from_mask(mask)
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos if explicit_positions else None,
        past_key_values=cache,
        use_cache=True,
    )
    logits = [out.logits[:, -1]]
    next_pos = pos[:, -1:] + 1
    for step in range(len(forced[0])):
        tok = torch.tensor([[f[step]] for f in forced])
        mask = torch.cat([mask, torch.ones_like(tok)], dim=1)
        out = model(
            input_ids=tok,
            attention_mask=mask,
            position_ids=next_pos if explicit_positions else None,
            past_key_values=cache,
            use_cache=True,
        )
        next_pos = next_pos + 1
        logits.append(out.logits[:, -1])
    logits = torch.stack(logits, dim=1)  # [B, steps, V]
    return [logits[i] for i in range(len(prompts))]


def report(name: str, got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    diff = max((g - r).abs().max().item() for g, r in zip(got, ref))
    scale = max(r.abs().max().item() for r in ref)
    agree = all(torch.equal(g.argmax(-1), r.argmax(-1)) for g, r in zip(got, ref))
    nan = any(torch.isnan(g).any().item() for g in got)
    print(f"  {name:<58} max|diff| {diff:.2e}  (max|logit| {scale:.1f}) argmax equal {agree}{'  NaN!' if nan else ''}")
    return diff


@torch.no_grad()
def indexer_padding_check(model, prompts) -> None:
    """Do selected indices of valid queries ever carry attention to padded key columns?"""
    if not hasattr(model.model.layers[0].self_attn, "indexer"):
        return
    ids, mask = left_pad_batch(prompts)
    pos = positions_from_mask(mask)
    captured = {}
    hooks = [
        layer.self_attn.indexer.register_forward_hook(
            lambda m, a, o, li=li: captured.__setitem__(li, o.long())
        )
        for li, layer in enumerate(model.model.layers)
    ]
    model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
    for h in hooks:
        h.remove()
    pad_cols = mask == 0  # [B, T]
    n_sel_pad, n_sel_pad_when_enough_valid = 0, 0
    for li, idx in captured.items():  # [B, S, k]
        for b in range(ids.shape[0]):
            valid_q = mask[b].bool()
            sel_pad = pad_cols[b][idx[b]]  # [S, k]
            n_valid_keys = torch.cumsum(mask[b], 0)  # causal valid keys per query
            n_sel_pad += int(sel_pad[valid_q].sum())
            enough = valid_q & (n_valid_keys >= idx.shape[-1])
            n_sel_pad_when_enough_valid += int(sel_pad[enough].sum())
    k = model.config.index_topk
    print(
        f"  indexer top-{k}: padded columns among selected indices of real queries: {n_sel_pad} "
        f"(only where a query has < {k} real keys: {n_sel_pad - n_sel_pad_when_enough_valid}; "
        f"with >= {k} real keys: {n_sel_pad_when_enough_valid})"
    )


@torch.no_grad()
def join_leave_check(model, prompts, forced) -> None:
    """A and B prefilled alone, A decodes 3 steps alone, then they merge; then A leaves."""
    ref = [run_single(model, p, f) for p, f in zip(prompts[:2], forced[:2])]
    a, b = prompts[0], prompts[1]
    fa, fb = forced[0], forced[1]
    ca, cb = DynamicCache(config=model.config), DynamicCache(config=model.config)
    out_a = [model(input_ids=torch.tensor([a]), past_key_values=ca, use_cache=True).logits[0, -1]]
    for t in fa[:3]:
        out_a.append(model(input_ids=torch.tensor([[t]]), past_key_values=ca, use_cache=True).logits[0, -1])
    out_b = [model(input_ids=torch.tensor([b]), past_key_values=cb, use_cache=True).logits[0, -1]]
    ma = torch.ones((1, len(a) + 3), dtype=torch.long)
    mb = torch.ones((1, len(b)), dtype=torch.long)
    cache, mask = merge_caches(model, [ca, cb], [ma, mb])
    pos = torch.tensor([[len(a) + 3], [len(b)]])
    ia, ib = 3, 0
    for _ in range(4):  # joint steps
        tok = torch.tensor([[fa[ia]], [fb[ib]]])
        mask = torch.cat([mask, torch.ones_like(tok)], 1)
        lo = model(input_ids=tok, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True).logits
        out_a.append(lo[0, -1])
        out_b.append(lo[1, -1])
        pos, ia, ib = pos + 1, ia + 1, ib + 1
    # A leaves; B continues alone in the (now batch-1) cache, with dead leading columns dropped.
    cache.batch_select_indices(torch.tensor([1]))
    mask, pos = mask[1:], pos[1:]
    mask = drop_leading_columns(cache, mask)
    for _ in range(3):
        tok = torch.tensor([[fb[ib]]])
        mask = torch.cat([mask, torch.ones_like(tok)], 1)
        lo = model(input_ids=tok, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True).logits
        out_b.append(lo[0, -1])
        pos, ib = pos + 1, ib + 1
    got_a = torch.stack(out_a)
    got_b = torch.stack(out_b)
    report("join (merge 2 caches) + leave (select + trim)", [got_a, got_b], [ref[0][: len(got_a)], ref[1][: len(got_b)]])


@torch.no_grad()
def multi_token_and_rollback_check(model, prompts, forced) -> None:
    """Batch of 2 (left-padded) feeds 4 tokens in one forward (a speculative verify step).

    Row 0 accepts all 4; row 1 accepts 1 and rejects 3. Rollback variant (a): mask the
    rejected columns out (attention_mask 0, "holes"); variant (b): crop all rows to the
    shortest accepted length and re-feed the accepted tokens of the longer row.
    """
    p0, p1 = prompts[0], prompts[1]
    f0, f1 = forced[0], forced[1]
    ref0, ref1 = run_single(model, p0, f0[:6]), run_single(model, p1, f1[:6])
    ids, mask = left_pad_batch([p0, p1])
    pos = positions_from_mask(mask)
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
    nxt = pos[:, -1:] + 1
    # verify chunk: row 0 gets its true next 4 tokens; row 1 its true first token + 3 wrong ones
    wrong = [(t + 17) % model.config.vocab_size for t in f1[1:4]]
    chunk = torch.tensor([f0[:4], [f1[0], *wrong]])
    mask_c = torch.cat([mask, torch.ones_like(chunk)], 1)
    pos_c = nxt + torch.arange(4)[None]
    lo = model(input_ids=chunk, attention_mask=mask_c, position_ids=pos_c, past_key_values=cache, use_cache=True).logits
    # chunk logits at position j predict token j+1: compare to the single-step reference
    report("multi-token verify chunk (4 tokens), accepted prefix", [lo[0], lo[1, :1]], [ref0[1:5], ref1[1:2]])
    # (a) holes: row 1 rejected the last 3 chunk columns
    mask_h = mask_c.clone()
    mask_h[1, -3:] = 0
    tok = torch.tensor([[f0[4]], [f1[1]]])
    mask_h = torch.cat([mask_h, torch.ones_like(tok)], 1)
    pos_h = torch.tensor([[int(pos_c[0, -1]) + 1], [int(pos_c[1, 0]) + 1]])
    lo_h = model(input_ids=tok, attention_mask=mask_h, position_ids=pos_h, past_key_values=cache, use_cache=True).logits
    report("rollback by masking rejected columns (holes)", [lo_h[0, -1:], lo_h[1, -1:]], [ref0[5:6], ref1[2:3]])
    # (b) crop: remove the last 4 + 1 columns for everyone, re-feed row 0's accepted tokens
    cache.crop(-5)
    mask_b = mask.clone()
    chunk_b = torch.tensor([[f0[0], f0[1], f0[2], f0[3], f0[4]], [f1[0], f1[1], PAD, PAD, PAD]])
    # row 1 only has 2 real tokens: its padding goes to the right -> mask them and keep order
    mask_b = torch.cat([mask_b, torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])], 1)
    pos_b = nxt + torch.arange(5)[None]
    lo_b = model(input_ids=chunk_b, attention_mask=mask_b, position_ids=pos_b, past_key_values=cache, use_cache=True).logits
    report("rollback by crop + re-feed (right-padded chunk)", [lo_b[0, -1:], lo_b[1, 1:2]], [ref0[5:6], ref1[2:3]])


def random_models(topk: int):
    torch.manual_seed(0)
    dsv = DeepseekV32ForCausalLM(
        DeepseekV32Config(
            vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
            first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
            num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=16,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, index_topk=topk, index_n_heads=2,
            index_head_dim=16, max_position_embeddings=512, initializer_range=0.2, pad_token_id=PAD,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
    ).eval()
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=512, initializer_range=0.2, pad_token_id=PAD,
        )
    ).eval()
    return dsv, llama


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="DeepseekV32 checkpoint dir (default: random tiny model)")
    ap.add_argument("--draft", help="Llama checkpoint dir (default: random tiny model)")
    ap.add_argument("--topk", type=int, default=8, help="index_topk of the random DeepseekV32 model")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--lengths", default="5,23,40", help="prompt lengths (the batch)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--stable-topk", action="store_true", help="patch the indexer with a stable-sort top-k")
    ap.add_argument("--text", help="take prompts and forced tokens from this jsonl corpus (needs --target's tokenizer)")
    args = ap.parse_args()
    if args.stable_topk:
        patch_stable_topk()
    torch.manual_seed(0)
    dsv, llama = random_models(args.topk)
    if args.target:
        dsv = DeepseekV32ForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    if args.draft:
        llama = LlamaForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    lengths = [int(x) for x in args.lengths.split(",")]
    for name, model in (("DeepseekV32ForCausalLM", dsv), ("LlamaForCausalLM", llama)):
        model.set_attn_implementation(args.attn)
        v = model.config.vocab_size
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(3, v, (n,), generator=g).tolist() for n in lengths]
        forced = [torch.randint(3, v, (args.steps,), generator=g).tolist() for _ in lengths]
        if args.text:
            import json

            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(args.target)
            with open(args.text) as f:
                docs = [tok(json.loads(line)["text"], verbose=False)["input_ids"] for line in f]
            seqs = [docs[i % len(docs)][200 * i : 200 * i + n + args.steps] for i, n in enumerate(lengths)]
            prompts = [s_[:n] for s_, n in zip(seqs, lengths)]
            forced = [s_[n:] for s_, n in zip(seqs, lengths)]
        extra = f", index_topk {model.config.index_topk}" if hasattr(model.config, "index_topk") else ""
        extra += ", stable top-k patch" if args.stable_topk and extra else ""
        print(f"{name} ({args.attn}{extra}); prompt lengths {lengths}, {args.steps} decode steps")
        ref = [run_single(model, p, f) for p, f in zip(prompts, forced)]
        report("left-padded batch, attention_mask + explicit position_ids", run_batched(model, prompts, forced), ref)
        report("left-padded batch, attention_mask, NO position_ids", run_batched(model, prompts, forced, False), ref)
        indexer_padding_check(model, prompts)
        join_leave_check(model, prompts, forced)
        multi_token_and_rollback_check(model, prompts, forced)


if __name__ == "__main__":
    main()
