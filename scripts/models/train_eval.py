"""Saving, reloading and evaluating the checkpoints: size, perplexity, acceptance, indexer recall, samples."""

from __future__ import annotations

import json
import math
import os
import shutil

import torch
from transformers import GenerationConfig

from train_common import BOS_ID, EOS_ID, PAD_ID, PROMPTS, TOKENIZER_FILES, TRAIN_ATTN
from train_dsa import DSATap, set_index_topk
from train_loop import quick_val_loss


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
