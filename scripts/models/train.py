#!/usr/bin/env python3
"""Train Hallmark's bundled tiny models: a DeepSeek-V3.2-architecture target and a dense draft.

Models (one shared byte-level BPE tokenizer, vocab 8192, from train_tokenizer.py):

* target ``hallmark-tiny-dsv32``: transformers' ``DeepseekV32ForCausalLM`` -- MLA (q/kv LoRA),
  the lightning indexer with top-k sparse attention (``index_topk`` 64, so sparsity is active
  from the 65th token on), 1 dense + 3 MoE layers (8 routed experts, top-2, + 1 shared).
* draft ``hallmark-tiny-draft``: a dense ``LlamaForCausalLM`` (runs on vLLM's CPU build).

The indexer and its training. In transformers the indexer's ``forward`` is decorated with
``@torch.no_grad()`` and returns integer top-k indices, so the LM loss gives it NO gradient: a
checkpoint trained with the LM loss alone keeps a randomly initialised indexer, which selects
keys at random. We therefore train it the way DeepSeek-V3.2 does (paper, sec. 2.1, "lightning
indexer warm-up" and "sparse training"): a KL loss between the main attention distribution
(summed over heads, L1-normalised) and the softmax of the indexer scores, with the indexer's
inputs detached so the KL only trains the indexer while the LM loss trains everything else.

* dense warm-up (first ``--dense-warmup-frac`` of the steps): every indexer selects all keys
  (dense attention); the KL target is the dense attention distribution.
* sparse stage: the indexer's top-k selection is applied (``index_topk``); the KL target is,
  by default (``--indexer-kl causal``), the attention distribution the same queries/keys would
  have over all causal keys (computed without gradient -- affordable at these sizes), which
  also teaches the indexer about keys it failed to select; ``--indexer-kl selected`` restricts
  the KL to the selected set, exactly as the paper's sparse stage.

To see the main attention's queries/keys and the indexer's selection, training runs the
target with a registered attention function (``AttentionInterface``, name ``hallmark_dsa_train``)
that gets the causal mask and the indexer's indices, applies the sparse mask, runs SDPA, and
(no grad) records the head-averaged dense probabilities. The saved checkpoint uses the stock
``sdpa`` path, and all reported metrics are computed on the reloaded checkpoints.

MoE balance: the DeepSeek-V3 auxiliary-loss-free scheme -- after every step each router's
``e_score_correction_bias`` moves by ``--moe-bias-rate`` towards under-loaded experts.

Outputs in ``--out`` (default service/engines/assets):
  hallmark-tiny-dsv32/   model.safetensors, config.json, generation_config.json, tokenizer files
  hallmark-tiny-draft/   same
  training_report.json   command, config, loss curves, validation perplexity, entropy at T=1,
                         draft/target acceptance sum_v min(p, q), indexer recall, samples

Runs on CPU (fp32) and on CUDA (``--dtype bf16`` autocast). Needs only torch, transformers
(5.17 and 5.19 tested on CPU), tokenizers, safetensors. See scripts/models/NOTES.md for commands.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import platform
import random
import shutil
import sys
import time

import torch
import torch.nn.functional as F
import transformers
from transformers import (
    AttentionInterface,
    AutoTokenizer,
    DeepseekV32Config,
    DeepseekV32ForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

TARGET_NAME = "hallmark-tiny-dsv32"
DRAFT_NAME = "hallmark-tiny-draft"
TRAIN_ATTN = "hallmark_dsa_train"
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
PROMPTS = ("The function returns", "Return a new list", "This module provides")
SIZE_LIMIT_BYTES = 40_000_000  # 40 MB (decimal, the stricter reading)


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------
# Model configurations
# --------------------------------------------------------------------------------------------


def target_config(args, vocab_size: int) -> DeepseekV32Config:
    return DeepseekV32Config(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=768,  # the dense MLP of layer 0
        moe_intermediate_size=128,
        num_hidden_layers=4,
        first_k_dense_replace=1,  # layer 0 dense, layers 1-3 MoE
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        q_lora_rank=128,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        index_topk=args.index_topk,
        index_n_heads=4,
        index_head_dim=32,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        initializer_range=0.02,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )


def draft_config(args, vocab_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=192,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=3,  # head_dim 64 (a size vLLM's CPU attention supports)
        num_key_value_heads=1,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )


# --------------------------------------------------------------------------------------------
# Sparse-attention training hooks (target only)
# --------------------------------------------------------------------------------------------


def _bool_keep_mask(attention_mask: torch.Tensor, shape: tuple[int, int, int, int]) -> torch.Tensor:
    """[B|1, 1, S, T] keep-mask (True = may attend) from a bool or additive float mask."""
    if attention_mask.dtype != torch.bool:
        attention_mask = attention_mask == 0
    return attention_mask.expand(shape[0], 1, shape[2], shape[3])


def dsa_train_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, indices=None, **kwargs):
    """SDPA with the indexer's top-k selection applied, recording dense probabilities for the KL.

    ``attention_mask`` is the causal (+padding) mask only: for non-eager/sdpa implementations the
    DeepseekV32 attention passes the indexer's ``indices`` [B, S, k] instead of folding them in.
    """
    b, _, s, _ = query.shape
    t = key.shape[2]
    keep = _bool_keep_mask(attention_mask, (b, 1, s, t))
    if indices is not None:
        selected = torch.zeros((b, s, t), dtype=torch.bool, device=query.device)
        selected.scatter_(-1, indices.long(), True)
        attend = keep & selected.unsqueeze(1)
    else:
        selected = None
        attend = keep
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attend, dropout_p=dropout if module.training else 0.0, scale=scaling
    )
    tap = getattr(module, "_hallmark_tap", None)
    if tap is not None and tap.active:
        with torch.no_grad():
            logits = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling
            probs = torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1).mean(dim=1)  # [B, S, T]
            tap.attn[module.layer_idx] = (probs, keep[:, 0], selected)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(TRAIN_ATTN, dsa_train_attention)
AttentionMaskInterface.register(TRAIN_ATTN, sdpa_mask)


def indexer_scores(ix, hidden_states, q_resid, cos, sin) -> torch.Tensor:
    """The DeepseekV32Indexer's scores, with gradient (its forward is @torch.no_grad()).

    Mirrors transformers' DeepseekV32Indexer.forward up to the top-k: [B, S, T] float32.
    """
    b, s, _ = hidden_states.shape
    q = ix.wq_b(q_resid).view(b, s, ix.n_heads, ix.head_dim)
    q_rot, q_pass = torch.split(q, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    k = ix.k_norm(ix.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * ix.softmax_scale)
    weights = ix.weights_proj(hidden_states.to(ix.weights_proj.weight.dtype)).float() * (ix.n_heads**-0.5)
    return torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)


class DSATap:
    """Captures each layer's indexer inputs and dense attention probabilities during a forward."""

    _ARG_NAMES = ("hidden_states", "q_resid", "position_embeddings", "attention_mask", "position_ids")

    def __init__(self, model: DeepseekV32ForCausalLM):
        self.active = False
        self.inputs: dict[int, tuple] = {}
        self.attn: dict[int, tuple] = {}
        self.handles = []
        for layer in model.model.layers:
            attn = layer.self_attn
            attn._hallmark_tap = self
            self.handles.append(
                attn.indexer.register_forward_hook(functools.partial(self._hook, attn.layer_idx), with_kwargs=True)
            )

    def _hook(self, layer_idx, module, args, kwargs, output):
        if not self.active:
            return
        a = dict(zip(self._ARG_NAMES, args))
        a.update(kwargs)
        cos, sin = a["position_embeddings"]
        self.inputs[layer_idx] = (a["hidden_states"].detach(), a["q_resid"].detach(), cos.detach(), sin.detach())

    def clear(self):
        self.inputs.clear()
        self.attn.clear()

    def remove(self, model):
        for h in self.handles:
            h.remove()
        for layer in model.model.layers:
            layer.self_attn._hallmark_tap = None


def indexer_kl_loss(model, tap: DSATap, support_mode: str) -> tuple[torch.Tensor, float]:
    """Mean over layers and query positions of CE(p_attn, softmax(I)); returns (loss, mean KL)."""
    losses, kls = [], []
    for li, (h, qr, cos, sin) in sorted(tap.inputs.items()):
        p, keep, selected = tap.attn[li]
        ix = model.model.layers[li].self_attn.indexer
        scores = indexer_scores(ix, h, qr, cos, sin)
        support = keep if (support_mode == "causal" or selected is None) else keep & selected
        if support is not keep:
            p = p * support
            p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
        logq = torch.log_softmax(scores.masked_fill(~support, float("-inf")), dim=-1).masked_fill(~support, 0.0)
        ce = -(p * logq).sum(-1)
        ent = -(torch.special.xlogy(p, p)).sum(-1)
        losses.append(ce.mean())
        kls.append((ce - ent).mean().item())
    return torch.stack(losses).mean(), sum(kls) / max(len(kls), 1)


def set_index_topk(model, topk: int | None) -> None:
    """Override every indexer's top-k (None = the config's value; a huge value = dense)."""
    for layer in model.model.layers:
        layer.self_attn.indexer.index_topk = model.config.index_topk if topk is None else topk


class MoEBalancer:
    """DeepSeek-V3 auxiliary-loss-free balancing: nudge each router's e_score_correction_bias."""

    def __init__(self, model, rate: float):
        self.rate = rate
        self.routers = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
        self.counts = {id(r): torch.zeros(r.num_experts, device=r.weight.device) for r in self.routers}
        self.total = {id(r): torch.zeros(r.num_experts, device=r.weight.device) for r in self.routers}
        self.handles = [r.register_forward_hook(self._hook) for r in self.routers]

    def _hook(self, module, args, output):
        if module.training:
            idx = output[2].reshape(-1)
            self.counts[id(module)] += torch.bincount(idx, minlength=module.num_experts).to(self.counts[id(module)])

    @torch.no_grad()
    def step(self):
        for r in self.routers:
            c = self.counts[id(r)]
            if self.rate > 0 and c.sum() > 0:
                r.e_score_correction_bias += self.rate * torch.sign(c.mean() - c)
            self.total[id(r)] += c
            c.zero_()

    def load_summary(self) -> list[list[float]]:
        out = []
        for r in self.routers:
            t = self.total[id(r)]
            out.append([round(float(x), 4) for x in (t / t.sum().clamp_min(1)).tolist()])
        return out

    def remove(self):
        for h in self.handles:
            h.remove()


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def load_stream(path: str, tok) -> torch.Tensor:
    ids: list[int] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            ids.append(BOS_ID)
            ids.extend(tok(text, add_special_tokens=False, verbose=False)["input_ids"])
            ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)


class WindowSampler:
    """Epochs of non-overlapping (seq_len + 1)-token windows, random phase and order per epoch."""

    def __init__(self, stream: torch.Tensor, seq_len: int, batch_size: int, seed: int):
        self.stream, self.seq_len, self.batch_size, self.seed = stream, seq_len, batch_size, seed
        self.windows_per_epoch = (len(stream) - 1 - seq_len) // seq_len
        self.steps_per_epoch = max(self.windows_per_epoch // batch_size, 1)

    def batches(self):
        epoch = 0
        while True:
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            offset = int(torch.randint(0, self.seq_len, (1,), generator=g))
            starts = torch.arange(offset, len(self.stream) - self.seq_len - 1, self.seq_len)
            starts = starts[torch.randperm(len(starts), generator=g)]
            idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]
            for i in range(0, len(starts) - self.batch_size + 1, self.batch_size):
                yield epoch, self.stream[idx[i : i + self.batch_size]]
            epoch += 1


def val_windows(stream: torch.Tensor, seq_len: int, max_windows: int | None) -> torch.Tensor:
    n = (len(stream) - 1) // seq_len
    if max_windows:
        n = min(n, max_windows)
    idx = torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    return stream[idx]


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def param_groups(model, weight_decay: float, lr: float, indexer_lr: float | None):
    decay, no_decay, ix_decay, ix_no_decay = [], [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if ".indexer." in name:
            (ix_decay if p.ndim >= 2 else ix_no_decay).append(p)
        else:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "lr": lr, "name": "main"},
        {"params": no_decay, "weight_decay": 0.0, "lr": lr, "name": "main"},
    ]
    if ix_decay or ix_no_decay:
        ilr = indexer_lr or lr
        groups += [
            {"params": ix_decay, "weight_decay": weight_decay, "lr": ilr, "name": "indexer"},
            {"params": ix_no_decay, "weight_decay": 0.0, "lr": ilr, "name": "indexer"},
        ]
    for g in groups:
        g["base_lr"] = g["lr"]
    return [g for g in groups if g["params"]]


def lr_factor(step: int, total: int, warmup: int, min_frac: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def autocast_ctx(device: torch.device, dtype: str):
    if dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return torch.autocast(device_type=device.type, enabled=False)


@torch.no_grad()
def quick_val_loss(model, windows: torch.Tensor, bs: int, device, dtype: str) -> float:
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(windows), bs):
        w = windows[i : i + bs].to(device)
        with autocast_ctx(device, dtype):
            logits = model(input_ids=w[:, :-1], use_cache=False).logits
        tot += F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        n += w[:, 1:].numel()
    model.train()
    return tot / n


def train_one(kind: str, model, sampler: WindowSampler, vwin: torch.Tensor, args, device) -> dict:
    is_target = kind == "target"
    lr = args.lr_target if is_target else args.lr_draft
    steps = args.steps or max(int(round(args.epochs * sampler.steps_per_epoch)), 1)
    warmup = min(args.warmup_steps, max(steps // 10, 1))
    dense_steps = int(round(args.dense_warmup_frac * steps)) if is_target else 0
    eval_every = args.eval_every or max(sampler.steps_per_epoch // 2, 1)

    groups = param_groups(model, args.weight_decay, lr, args.indexer_lr if is_target else None)
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(groups, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    main_params = [p for g in groups if g["name"] == "main" for p in g["params"]]
    ix_params = [p for g in groups if g["name"] == "indexer" for p in g["params"]]

    tap = balancer = None
    if is_target:
        model.config._attn_implementation = TRAIN_ATTN  # the indexer's indices reach our attention fn
        # transformers defaults to `grouped_mm`, which is not autocast-aware (it casts activations to
        # the fp32 master weights); the per-expert loop is autocast-safe on every device.
        model.config._experts_implementation = args.experts_impl
        tap = DSATap(model)
        balancer = MoEBalancer(model, args.moe_bias_rate)
    fwd = torch.compile(model) if args.compile else model

    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"[{kind}] {type(model).__name__}: {n_params / 1e6:.2f}M params; {steps} steps "
        f"({steps / sampler.steps_per_epoch:.2f} epochs of {sampler.steps_per_epoch} steps), batch "
        f"{args.batch_size}x{args.seq_len}, lr {lr:g}, warmup {warmup}"
        + (f", dense warm-up {dense_steps} steps, index_topk {model.config.index_topk}" if is_target else "")
    )

    history, evals = [], []
    best = {"val_loss": float("inf"), "step": -1, "state": None}
    model.train()
    it = sampler.batches()
    tokens = 0
    t0 = time.time()
    t_train = 0.0
    window = {"loss": 0.0, "ikl": 0.0, "n": 0}
    for step in range(steps):
        ts = time.time()
        if is_target:
            set_index_topk(model, 1 << 30 if step < dense_steps else None)
        f = lr_factor(step, steps, warmup, args.min_lr_frac)
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * f
        epoch, batch = next(it)
        batch = batch.to(device, non_blocking=True)
        x, y = batch[:, :-1], batch[:, 1:]
        if tap is not None:
            tap.clear()
            tap.active = True
        with autocast_ctx(device, args.dtype):
            logits = fwd(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            total = loss
            ikl = 0.0
            if tap is not None:
                tap.active = False
                iloss, ikl = indexer_kl_loss(model, tap, args.indexer_kl)
                total = loss + args.indexer_loss_weight * iloss
        total.backward()
        if tap is not None:
            tap.clear()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(main_params, args.grad_clip)
            if ix_params:
                torch.nn.utils.clip_grad_norm_(ix_params, args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if balancer is not None:
            balancer.step()
        tokens += x.numel()
        window["loss"] += loss.item()
        window["ikl"] += ikl
        window["n"] += 1
        t_train += time.time() - ts

        last = step == steps - 1
        if (step + 1) % args.log_every == 0 or last:
            n = window["n"]
            rec = {
                "step": step + 1,
                "epoch": epoch,
                "loss": window["loss"] / n,
                "lr": opt.param_groups[0]["lr"],
                "tok_per_s": tokens / max(t_train, 1e-9),
            }
            if is_target:
                rec["indexer_kl"] = window["ikl"] / n
                rec["dense"] = step < dense_steps
            history.append(rec)
            log(
                f"[{kind}] step {step + 1}/{steps} ep {epoch} loss {rec['loss']:.4f}"
                + (f" idxKL {rec['indexer_kl']:.4f}{' (dense)' if rec['dense'] else ''}" if is_target else "")
                + f" lr {rec['lr']:.2e} {rec['tok_per_s'] / 1e3:.1f}k tok/s"
            )
            window = {"loss": 0.0, "ikl": 0.0, "n": 0}
        if (step + 1) % eval_every == 0 or last:
            if is_target:
                set_index_topk(model, None)  # always evaluate the sparse model
            vl = quick_val_loss(model, vwin, args.eval_batch_size, device, args.dtype)
            evals.append({"step": step + 1, "val_loss": vl, "val_ppl": math.exp(vl)})
            log(f"[{kind}] eval step {step + 1}: val loss {vl:.4f} ppl {math.exp(vl):.2f}")
            eligible = (not is_target) or step >= dense_steps
            if args.keep_best and eligible and vl < best["val_loss"]:
                best = {"val_loss": vl, "step": step + 1, "state": copy.deepcopy(model.state_dict())}

    wall = time.time() - t0
    if args.keep_best and best["state"] is not None:
        model.load_state_dict(best["state"])
        log(f"[{kind}] restored best checkpoint: step {best['step']} (val loss {best['val_loss']:.4f})")
    if is_target:
        set_index_topk(model, None)
        moe_load = balancer.load_summary()
        balancer.remove()
        tap.remove(model)
        model.config._attn_implementation = "sdpa"
        model.config._experts_implementation = "eager"
    model.eval()
    return {
        "params": n_params,
        "steps": steps,
        "epochs": steps / sampler.steps_per_epoch,
        "steps_per_epoch": sampler.steps_per_epoch,
        "lr": lr,
        "warmup_steps": warmup,
        "dense_warmup_steps": dense_steps,
        "tokens_seen": tokens,
        "train_seconds": wall,
        "train_tok_per_s": tokens / max(t_train, 1e-9),
        "best_step": best["step"] if args.keep_best else steps,
        "history": history,
        "evals": evals,
        **({"moe_expert_load_per_layer": moe_load} if is_target else {}),
    }


# --------------------------------------------------------------------------------------------
# Saving, reloading, evaluation
# --------------------------------------------------------------------------------------------


def save_model(model, out_dir: str, tok_dir: str, save_dtype: str) -> int:
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    model = model.to(torch.float32 if save_dtype == "float32" else torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=256,
    )
    model.save_pretrained(out_dir)
    model.to(torch.float32)
    # `layer_types` is written by the config class itself, under names that differ between
    # transformers versions ("deepseek_sparse_attention" in 5.17, "indexed_attention" in 5.19);
    # without it every version derives its own default, so the checkpoint loads in both.
    cfg_path = os.path.join(out_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if cfg.get("model_type") == "deepseek_v32":
        cfg.pop("layer_types", None)
    for key in ("_attn_implementation", "attn_implementation", "_experts_implementation", "experts_implementation"):
        cfg.pop(key, None)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(tok_dir, name), os.path.join(out_dir, name))
    return sum(os.path.getsize(os.path.join(out_dir, n)) for n in os.listdir(out_dir))


@torch.no_grad()
def eval_pair(target, draft, windows: torch.Tensor, bs: int, device) -> dict:
    """fp32 metrics over all validation positions: NLL, entropy at T=1, draft/target overlap."""
    acc = {k: 0.0 for k in ("t_nll", "t_ent", "d_nll", "d_ent", "ov1", "ov07", "greedy")}
    n = 0
    for i in range(0, len(windows), bs):
        w = windows[i : i + bs].to(device)
        x, y = w[:, :-1], w[:, 1:]
        row = {}
        for key, model in (("t", target), ("d", draft)):
            if model is None:
                continue
            logits = model(input_ids=x, use_cache=False).logits.float()
            logp = torch.log_softmax(logits, -1)
            acc[f"{key}_nll"] += -logp.gather(-1, y[..., None]).sum().item()
            acc[f"{key}_ent"] += -(logp.exp() * logp).sum().item()
            row[key] = logits
        if "t" in row and "d" in row:
            for name, temp in (("ov1", 1.0), ("ov07", 0.7)):
                p = torch.softmax(row["t"] / temp, -1)
                q = torch.softmax(row["d"] / temp, -1)
                acc[name] += torch.minimum(p, q).sum().item()
            acc["greedy"] += (row["t"].argmax(-1) == row["d"].argmax(-1)).sum().item()
        n += y.numel()
    res = {"positions": n}
    for key, name in (("t", "target"), ("d", "draft")):
        if acc[f"{key}_nll"] or acc[f"{key}_ent"]:
            nll, ent = acc[f"{key}_nll"] / n, acc[f"{key}_ent"] / n
            res[name] = {
                "val_loss": nll,
                "val_ppl": math.exp(nll),
                "entropy_T1_nats": ent,
                "entropy_T1_bits": ent / math.log(2),
            }
    if target is not None and draft is not None:
        res["pair"] = {
            "expected_acceptance_T1": acc["ov1"] / n,  # E_positions sum_v min(p_target, q_draft)
            "expected_acceptance_T0.7": acc["ov07"] / n,
            "greedy_agreement": acc["greedy"] / n,
        }
    return res


@torch.no_grad()
def indexer_diagnostics(target, windows: torch.Tensor, bs: int, device) -> dict:
    """Sparse vs dense perplexity and the share of dense attention mass the indexer selects."""
    topk = target.config.index_topk
    out = {"index_topk": topk}
    set_index_topk(target, 1 << 30)
    out["val_ppl_dense_attention"] = math.exp(quick_val_loss(target, windows, bs, device, "fp32"))
    set_index_topk(target, None)
    out["val_ppl_sparse_attention"] = math.exp(quick_val_loss(target, windows, bs, device, "fp32"))
    target.eval()

    target.config._attn_implementation = TRAIN_ATTN
    tap = DSATap(target)
    n_layers = target.config.num_hidden_layers
    mass = [0.0] * n_layers
    rand = 0.0
    count = 0
    for i in range(0, len(windows), bs):
        w = windows[i : i + bs].to(device)
        tap.clear()
        tap.active = True
        target(input_ids=w[:, :-1], use_cache=False)
        tap.active = False
        s = w.shape[1] - 1
        q_pos = torch.arange(s, device=device)
        rows = q_pos >= topk  # queries that actually have more than top-k causal keys
        if not rows.any():
            continue
        for li in range(n_layers):
            p, keep, selected = tap.attn[li]
            mass[li] += (p * selected).sum(-1)[:, rows].sum().item()
        rand += (topk / (q_pos[rows] + 1).float()).sum().item() * w.shape[0]
        count += int(rows.sum()) * w.shape[0]
    tap.remove(target)
    target.config._attn_implementation = "sdpa"
    if count:
        out["attention_mass_recall_per_layer"] = [m / count for m in mass]
        out["attention_mass_recall_mean"] = sum(mass) / count / n_layers
        out["attention_mass_recall_random_selection"] = rand / count
        out["recall_positions"] = count
    return out


@torch.no_grad()
def samples(model, tok, device, seed: int, max_new_tokens: int) -> list[dict]:
    res = []
    for i, prompt in enumerate(PROMPTS):
        ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]], device=device)
        for temp in (1.0, 0.7):
            torch.manual_seed(seed + i)
            gen = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=temp,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                pad_token_id=PAD_ID,
                eos_token_id=EOS_ID,
            )
            new = gen[0, ids.shape[1] :].tolist()
            res.append({"prompt": prompt, "temperature": temp, "completion": tok.decode(new), "n_tokens": len(new)})
    return res


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="Train the bundled tiny DeepSeek-V3.2 target and Llama draft.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--corpus", default="var/corpus", help="folder with train.jsonl, val.jsonl (build_corpus.py)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: <corpus>/tokenizer)")
    ap.add_argument("--out", default="service/engines/assets", help="output folder for both checkpoints + report")
    ap.add_argument("--models", default="target,draft", help="which models to train: target, draft or both")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"], help="autocast dtype (auto: bf16 on CUDA)")
    ap.add_argument("--save-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    ap.add_argument("--steps", type=int, default=0, help="optimizer steps per model (0: derive from --epochs)")
    ap.add_argument("--epochs", type=float, default=6.0, help="passes over the training split (if --steps 0)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr-target", type=float, default=2e-3)
    ap.add_argument("--lr-draft", type=float, default=3e-3)
    ap.add_argument("--indexer-lr", type=float, default=None, help="default: --lr-target")
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--min-lr-frac", type=float, default=0.1, help="cosine floor as a fraction of the peak LR")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--index-topk", type=int, default=64)
    ap.add_argument("--dense-warmup-frac", type=float, default=0.05, help="share of steps with dense attention")
    ap.add_argument("--indexer-kl", default="causal", choices=["causal", "selected"])
    ap.add_argument("--indexer-loss-weight", type=float, default=1.0)
    ap.add_argument("--moe-bias-rate", type=float, default=3e-3)
    ap.add_argument("--experts-impl", default="eager", choices=["eager", "grouped_mm", "batched_mm"],
                    help="transformers experts implementation used while training the target")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=0, help="0: twice per epoch")
    ap.add_argument("--eval-batch-size", type=int, default=16)
    ap.add_argument("--eval-max-windows", type=int, default=0, help="cap validation windows (0: all)")
    ap.add_argument("--keep-best", type=int, default=1, help="restore the best-validation checkpoint at the end")
    ap.add_argument("--sample-tokens", type=int, default=60)
    ap.add_argument("--compile", action="store_true", help="torch.compile the training forward")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    t_start = time.time()
    transformers.utils.logging.disable_progress_bar()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if args.dtype == "auto":
        args.dtype = "bf16" if device.type == "cuda" else "fp32"
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    tok_dir = args.tokenizer or os.path.join(args.corpus, "tokenizer")
    os.makedirs(args.out, exist_ok=True)

    log(
        f"torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}, "
        f"device {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
        + f", autocast {args.dtype}, threads {torch.get_num_threads()}"
    )
    tok = AutoTokenizer.from_pretrained(tok_dir)
    if (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) != (BOS_ID, EOS_ID, PAD_ID):
        raise SystemExit(
            f"tokenizer {tok_dir}: bos/eos/pad ids are {tok.bos_token_id}/{tok.eos_token_id}/{tok.pad_token_id}, "
            f"expected {BOS_ID}/{EOS_ID}/{PAD_ID}; build it with scripts/models/train_tokenizer.py"
        )
    vocab = len(tok)
    t = time.time()
    train_stream = load_stream(os.path.join(args.corpus, "train.jsonl"), tok)
    val_stream = load_stream(os.path.join(args.corpus, "val.jsonl"), tok)
    log(f"corpus: train {len(train_stream)} tokens, val {len(val_stream)} tokens ({time.time() - t:.1f}s to tokenize)")
    vwin = val_windows(val_stream, args.seq_len, args.eval_max_windows or None)
    sampler = WindowSampler(train_stream, args.seq_len, args.batch_size, args.seed)

    report = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "args": vars(args),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        },
        "corpus": {"train_tokens": len(train_stream), "val_tokens": len(val_stream), "eval_windows": len(vwin)},
        "models": {},
    }
    manifest = os.path.join(args.corpus, "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            m = json.load(f)
        report["corpus"].update({k: m[k] for k in ("python", "n_documents", "bytes_total", "sha256") if k in m})

    dirs = {"target": os.path.join(args.out, TARGET_NAME), "draft": os.path.join(args.out, DRAFT_NAME)}
    for kind in models:
        random.seed(args.seed)
        torch.manual_seed(args.seed)
        if kind == "target":
            model = DeepseekV32ForCausalLM(target_config(args, vocab))
        elif kind == "draft":
            model = LlamaForCausalLM(draft_config(args, vocab))
        else:
            raise SystemExit(f"unknown model {kind!r}")
        model.to(device)
        info = train_one(kind, model, sampler, vwin, args, device)
        if kind == "target":
            t = time.time()
            info["indexer"] = indexer_diagnostics(model, vwin, args.eval_batch_size, device)
            info["indexer"]["seconds"] = time.time() - t
        info["dir"] = dirs[kind]
        info["size_bytes"] = save_model(model, dirs[kind], tok_dir, args.save_dtype)
        report["models"][kind] = info
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # A model not trained in this run but present in --out keeps its training record.
    previous = os.path.join(args.out, "training_report.json")
    if os.path.exists(previous):
        with open(previous) as f:
            prev = json.load(f)
        for kind, info in prev.get("models", {}).items():
            if kind not in report["models"] and os.path.exists(os.path.join(dirs[kind], "config.json")):
                report["models"][kind] = {**info, "from_previous_run": prev.get("command")}

    # Everything below runs on the checkpoints as saved and reloaded.
    loaded = {}
    for kind, cls in (("target", DeepseekV32ForCausalLM), ("draft", LlamaForCausalLM)):
        if os.path.exists(os.path.join(dirs[kind], "config.json")):
            loaded[kind] = cls.from_pretrained(dirs[kind], dtype=torch.float32).to(device).eval()
    t = time.time()
    ev = eval_pair(loaded.get("target"), loaded.get("draft"), vwin, args.eval_batch_size, device)
    ev["seconds"] = time.time() - t
    report["eval"] = ev
    report["samples"] = {k: samples(m, tok, device, args.seed, args.sample_tokens) for k, m in loaded.items()}
    sizes = {k: sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)) for k, d in dirs.items() if os.path.isdir(d)}
    report["sizes_bytes"] = {**sizes, "total": sum(sizes.values())}
    report["total_seconds"] = time.time() - t_start
    with open(os.path.join(args.out, "training_report.json"), "w") as f:
        json.dump(report, f, indent=1)

    # ---- summary ----
    log("\n==== samples (T=1.0 and T=0.7) ====")
    for kind, ss in report["samples"].items():
        for s in ss:
            log(f"[{kind} T={s['temperature']}] {s['prompt']!r} -> {s['completion'][:200]!r}")
    log("\n==== summary ====")
    log(f"{'model':<8} {'params':>8} {'MB':>6} {'steps':>6} {'epochs':>6} {'tok/s':>9} {'train s':>8} "
        f"{'val ppl':>8} {'H(T=1) nats':>11} {'bits':>5}")
    for kind in ("target", "draft"):
        info, e = report["models"].get(kind), ev.get(kind)
        if not info or not e:
            continue
        log(
            f"{kind:<8} {info['params'] / 1e6:>7.2f}M {info['size_bytes'] / 1e6:>6.1f} {info['steps']:>6} "
            f"{info['epochs']:>6.2f} {info['train_tok_per_s']:>9.0f} {info['train_seconds']:>8.1f} "
            f"{e['val_ppl']:>8.2f} {e['entropy_T1_nats']:>11.3f} {e['entropy_T1_bits']:>5.2f}"
        )
    if "pair" in ev:
        p = ev["pair"]
        log(
            f"draft vs target: expected acceptance sum_v min(p,q) = {p['expected_acceptance_T1']:.3f} (T=1), "
            f"{p['expected_acceptance_T0.7']:.3f} (T=0.7); greedy agreement {p['greedy_agreement']:.3f}"
        )
    if "target" in report["models"] and "indexer" in report["models"]["target"]:
        ix = report["models"]["target"]["indexer"]
        log(
            f"indexer (top-{ix['index_topk']}): val ppl sparse {ix['val_ppl_sparse_attention']:.2f} vs dense "
            f"{ix['val_ppl_dense_attention']:.2f}; dense-attention mass captured "
            f"{ix.get('attention_mass_recall_mean', float('nan')):.3f} (random selection "
            f"{ix.get('attention_mass_recall_random_selection', float('nan')):.3f})"
        )
    total = report["sizes_bytes"]["total"]
    log(f"checkpoints: {total / 1e6:.1f} MB in all ({'OK' if total <= SIZE_LIMIT_BYTES else 'OVER'} the 40 MB limit)"
        f"; report {os.path.join(args.out, 'training_report.json')}; total {report['total_seconds']:.0f}s")


if __name__ == "__main__":
    main()
