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
import json
import os
import platform
import random
import sys
import time

import torch
import transformers
from transformers import AutoTokenizer, DeepseekV32ForCausalLM, LlamaForCausalLM

from train_common import BOS_ID, DRAFT_NAME, EOS_ID, PAD_ID, SIZE_LIMIT_BYTES, TARGET_NAME, log
from train_configs import draft_config, target_config
from train_data import WindowSampler, load_stream, val_windows
from train_loop import train_one
from train_eval import eval_pair, indexer_diagnostics, samples, save_model


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
