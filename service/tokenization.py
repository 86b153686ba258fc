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


class TextEncoder:
    """What detection needs of a tokenizer: a text's token ids and their character offsets
    (no special tokens), through the fast backend (``tokenizers``) where there is one."""

    def __init__(self, backend=None, tokenizer=None) -> None:
        self._backend = backend
        self._tokenizer = tokenizer

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
        if self._backend is not None:
            encoding = self._backend.encode(text, add_special_tokens=False)
            return encoding.ids, encoding.offsets
        return self._tokenizer.encode(text, add_special_tokens=False), None


@lru_cache(maxsize=8)
def load_text_encoder(name: str) -> TextEncoder:
    """The :class:`TextEncoder` of a model directory or bundled model name (cached): its
    ``tokenizer.json`` through the ``tokenizers`` library when it has one, which is what
    the transformers tokenizer runs for it (tested on the bundled models) without importing
    transformers and torch (about 0.1 s instead of several seconds in a fresh process);
    otherwise the transformers tokenizer."""
    from pathlib import Path

    path = Path(resolve_model_path(name)) / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        return TextEncoder(backend=Tokenizer.from_file(str(path)))
    tokenizer = load_tokenizer(name)
    return TextEncoder(backend=getattr(tokenizer, "_tokenizer", None), tokenizer=tokenizer)
