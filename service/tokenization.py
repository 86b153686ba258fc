"""Tokenizers for text input: the key's model tokenizer turns text into the token ids
that generation produced (detection works on token ids)."""

from __future__ import annotations

from functools import lru_cache

from service.model_paths import resolve_model_path


@lru_cache(maxsize=8)
def load_tokenizer(name: str):
    """A transformers tokenizer from a directory or a bundled model name (cached)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(name))
