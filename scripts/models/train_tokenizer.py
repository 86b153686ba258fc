#!/usr/bin/env python3
"""Train the byte-level BPE tokenizer shared by Hallmark's bundled tiny models.

* HF ``tokenizers`` BPE, GPT-2 style: ByteLevel pre-tokenizer (``add_prefix_space=False``,
  GPT-2 split regex), ByteLevel decoder, all 256 byte symbols in the initial alphabet, so
  any UTF-8 text encodes and ``decode(encode(x)) == x`` holds exactly.
* vocabulary 8192 including the special tokens ``<|bos|>`` = 0, ``<|eos|>`` = 1,
  ``<|pad|>`` = 2 (ids 0/1 match DeepSeek-V3's default ``bos_token_id``/``eos_token_id``).
* no post-processor: encoding a string adds NO special tokens (so the round trip is exact).
  The training script puts ``<|bos|>`` at the start and ``<|eos|>`` at the end of each
  document; a serving engine may prepend ``<|bos|>`` or not (the models see both during
  training, as training windows are cut at arbitrary offsets of the document stream).
* trained on the training split only (``train.jsonl`` from build_corpus.py).

Saved in transformers format (tokenizer.json, tokenizer_config.json, special_tokens_map.json)
so that ``AutoTokenizer.from_pretrained(dir)`` works.

Usage:  python scripts/models/train_tokenizer.py [--corpus var/corpus] [--out var/corpus/tokenizer]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD]


def read_docs(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def build(train_docs: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())  # no unk token: byte-level covers every input
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(train_docs, trainer=trainer, length=len(train_docs))
    return tok


def save_transformers(tok: Tokenizer, out: str, model_max_length: int) -> None:
    from transformers import PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        add_bos_token=False,
        add_eos_token=False,
    )
    fast.save_pretrained(out)
    # transformers 5 no longer writes special_tokens_map.json; older loaders and other tools read it.
    smap = os.path.join(out, "special_tokens_map.json")
    if not os.path.exists(smap):
        with open(smap, "w") as f:
            json.dump({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, f, indent=2)


def check(out: str, val_docs: list[str]) -> dict:
    from transformers import AutoTokenizer

    at = AutoTokenizer.from_pretrained(out)
    ids = [at.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    if ids != [0, 1, 2] or (at.bos_token_id, at.eos_token_id, at.pad_token_id) != (0, 1, 2):
        raise RuntimeError(f"special token ids are {ids}, expected [0, 1, 2]")
    samples = [
        "The function returns a new list.",
        "  indented\n\tand tabbed\r\n text  ",
        "Unicode: naïve café, 東京, emoji 🙂, math ∑ and ≤",
        "def f(x=frozenset({1, 2})):\n    return x ** 2  # comment",
        "",
    ] + [d[:2000] for d in val_docs]
    for s in samples:
        ids = at(s, add_special_tokens=True)["input_ids"]
        if BOS in at.convert_ids_to_tokens(ids):
            raise RuntimeError("encoding added special tokens; it must not")
        if at.decode(ids) != s:
            raise RuntimeError(f"round trip failed for {s[:60]!r}")
    n_bytes = sum(len(d.encode()) for d in val_docs)
    n_tok = sum(len(at(d, verbose=False)["input_ids"]) for d in val_docs)
    return {"val_bytes": n_bytes, "val_tokens": n_tok, "bytes_per_token": n_bytes / max(n_tok, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="var/corpus", help="folder with train.jsonl/val.jsonl (build_corpus.py)")
    ap.add_argument("--out", default=None, help="output folder (default: <corpus>/tokenizer)")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--model-max-length", type=int, default=2048)
    args = ap.parse_args()
    out = args.out or os.path.join(args.corpus, "tokenizer")

    train_docs = read_docs(os.path.join(args.corpus, "train.jsonl"))
    val_docs = read_docs(os.path.join(args.corpus, "val.jsonl"))
    tok = build(train_docs, args.vocab_size)
    if tok.get_vocab_size() != args.vocab_size:
        raise RuntimeError(f"trained vocabulary has {tok.get_vocab_size()} entries, asked for {args.vocab_size}")
    save_transformers(tok, out, args.model_max_length)
    stats = check(out, val_docs)
    with open(os.path.join(out, "tokenizer.json"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    print(
        f"tokenizer: vocab {tok.get_vocab_size()}, specials {SPECIAL_TOKENS} = ids 0,1,2; "
        f"val {stats['val_tokens']} tokens, {stats['bytes_per_token']:.2f} bytes/token; round trip ok -> {out}"
    )
    print(f"sha256 tokenizer.json {sha}")


if __name__ == "__main__":
    main()
