"""The training loop: parameter groups, learning-rate schedule, autocast, one model's training run."""

from __future__ import annotations

import copy
import math
import time

import torch
import torch.nn.functional as F

from train_common import TRAIN_ATTN, log
from train_dsa import DSATap, MoEBalancer, indexer_kl_loss, set_index_topk
from train_data import WindowSampler


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
