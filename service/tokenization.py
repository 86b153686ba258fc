"""Tokenizers for text input: the key's model tokenizer turns text into the token ids
that generation produced (detection works on token ids)."""

from __future__ import annotations

from functools import lru_cache

from service.model_paths import resolve_model_path


@lru_cache(maxsize=8)
def load_tokenizer(name: str, local_only: bool = False):
    """A transformers tokenizer from a directory or a bundled model name (cached).
    ``local_only``: never ask the Hugging Face hub (an unknown name fails at once instead of
    after the hub client's retries)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path(name), local_files_only=local_only)


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

    def with_runs_merged(self, variants: list, tokenised: list) -> tuple[list, list]:
        """``detector.forms.with_runs_merged`` through this tokenizer (the API's forms: the
        text as sent also with its whitespace runs as a model writes them, where that differs)."""
        from types import SimpleNamespace

        from detector.forms import with_runs_merged
        from service.generation_ids import segmentation_table

        backend = self._backend if self._backend is not None else getattr(self._tokenizer, "_tokenizer", None)
        table = segmentation_table(SimpleNamespace(_tokenizer=backend)) if backend is not None else None
        return with_runs_merged(variants, tokenised, table, lambda part: self.encode(part)[0])


@lru_cache(maxsize=8)
def load_text_encoder(name: str) -> TextEncoder:
    """The :class:`TextEncoder` of a model directory or bundled model name (cached): its
    ``tokenizer.json`` through the ``tokenizers`` library when it has one, which is what
    the transformers tokenizer runs for it (tested on the bundled models) without importing
    transformers and torch (about 0.1 s instead of several seconds in a fresh process);
    otherwise the transformers tokenizer, from a directory or the local Hugging Face cache
    (never downloaded)."""
    from pathlib import Path

    path = Path(resolve_model_path(name)) / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer

        return TextEncoder(backend=Tokenizer.from_file(str(path)))
    if not Path(resolve_model_path(name)).is_dir() and not _in_hub_cache(name):
        # Before importing transformers (seconds): a name that is nothing here fails at once.
        raise OSError(f"{name}: no such directory, bundled model or Hugging Face model in the local cache")
    tokenizer = load_tokenizer(name, local_only=True)
    return TextEncoder(backend=getattr(tokenizer, "_tokenizer", None), tokenizer=tokenizer)


def _in_hub_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return any(isinstance(try_to_load_from_cache(name, f), str) for f in ("tokenizer_config.json", "config.json"))
    except ValueError:  # not a valid repository id either
        return False


def model_vocab_size(name: str) -> int | None:
    """The vocabulary size of a model directory or bundled model name (its ``config.json``'s
    ``vocab_size``), None where it does not say."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(resolve_model_path(name)) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") if isinstance(config, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
