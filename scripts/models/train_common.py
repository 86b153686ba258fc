"""Constants and logging shared by the training scripts (names, special token ids, limits)."""

from __future__ import annotations

TARGET_NAME = "hallmark-tiny-dsv32"
DRAFT_NAME = "hallmark-tiny-draft"
TRAIN_ATTN = "hallmark_dsa_train"
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
PROMPTS = ("The function returns", "Return a new list", "This module provides")
SIZE_LIMIT_BYTES = 40_000_000  # 40 MB (decimal, the stricter reading)


def log(msg: str) -> None:
    print(msg, flush=True)
