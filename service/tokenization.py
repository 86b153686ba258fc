"""Tokenizers for text input: the key's model tokenizer turns text into the token ids
that generation produced (detection works on token ids)."""

from __future__ import annotations

import json
import re
import threading
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
            return encode_with_offsets(self._backend, text)
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


def encode_with_offsets(backend, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """A fast tokenizer's (``tokenizers.Tokenizer``'s) token ids and character offsets of
    ``text``, no special tokens: exactly ``backend.encode(text, add_special_tokens=False)``'s
    ``ids`` and ``offsets``, through :class:`BytePieces` where it applies (several times
    cheaper)."""
    pieces = _pieces_of(backend)
    if pieces is not None:
        found = pieces.encode(text)
        if found is not None:
            return found
    encoding = backend.encode(text, add_special_tokens=False)
    return encoding.ids, encoding.offsets


class BytePieces:
    """A byte-level BPE tokenizer's encoding of ASCII text, piece by piece, each piece's
    tokens remembered (issue 30 item 5: tokenising a 200-token text cost ~0.3 ms, three
    quarters of it the tokenizer's pre-tokenizer bookkeeping, and a request tokenises two or
    three forms of one text, which share most pieces).

    The GPT-2 byte-level pre-tokenizer (``ByteLevel(use_regex=True)``, the tokenizers
    library's) splits the text with :data:`PIECE` and BPE-encodes each piece alone; nothing
    merges across pieces. On text of printable ASCII, tab, line feed and carriage return,
    :data:`PIECE`'s ASCII classes are the pattern's Unicode ones (letters, digits, white
    space) exactly, so the pieces are the pre-tokenizer's, and a piece encoded alone is one
    piece again (each alternative matches its whole piece: a white-space run's look-ahead
    only looks past its end), so its ids and offsets are those it has in the text, shifted by
    its start. Any other character, or an added token's text (matched before the
    pre-tokenizer), and the backend encodes the whole text. Only for a backend whose
    configuration is exactly that (:meth:`of`); tests/service/test_tokenization.py checks
    the equality on the bench's texts and on random strings of every class."""

    PIECE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")
    """The GPT-2 pre-tokenizer's pattern with ASCII classes (\\s, on the accepted text: tab,
    line feed, carriage return, space)."""
    ACCEPTED = re.compile(r"[\t\n\r\x20-\x7e]*")
    MAX_PIECES = 200_000
    """Pieces remembered (all forgotten beyond: a flood of distinct words cannot grow it)."""

    def __init__(self, backend, added: tuple[str, ...]) -> None:
        self._backend = backend
        self._added = added
        self._pieces: dict[str, tuple[list[int], tuple[tuple[int, int], ...]]] = {}

    @classmethod
    def of(cls, backend) -> "BytePieces | None":
        """For a backend that pre-tokenizes with the GPT-2 byte-level pattern and nothing
        else that acts on the text (no normaliser, no truncation or padding, a BPE model
        without dropout, a post-processor that adds nothing without special tokens); else None."""
        try:
            config = json.loads(backend.to_str())
        except Exception:  # noqa: BLE001 - not a tokenizers.Tokenizer: the backend encodes
            return None
        pre, model, post = config.get("pre_tokenizer") or {}, config.get("model") or {}, config.get("post_processor")
        if (config.get("normalizer") is not None or config.get("truncation") is not None
                or config.get("padding") is not None
                or pre != {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": pre.get("trim_offsets"),
                           "use_regex": True}
                or model.get("type") != "BPE" or model.get("dropout") not in (None, 0.0)
                or not (post is None or (post.get("type") == "TemplateProcessing"
                                         and post.get("single") == [{"Sequence": {"id": "A", "type_id": 0}}]))):
            return None
        return cls(backend, tuple(t["content"] for t in config.get("added_tokens") or ()))

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]] | None:
        """The ids and offsets, or None where this does not apply to ``text``."""
        if not self.ACCEPTED.fullmatch(text) or any(token in text for token in self._added):
            return None
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        known = self._pieces
        start = 0
        for piece in self.PIECE.findall(text):
            found = known.get(piece)
            if found is None:
                encoding = self._backend.encode(piece, add_special_tokens=False)
                found = (encoding.ids, tuple(encoding.offsets))
                if len(known) >= self.MAX_PIECES:
                    known.clear()
                known[piece] = found
            ids += found[0]
            for a, b in found[1]:
                offsets.append((a + start, b + start))
            start += len(piece)
        return ids, offsets


_PIECES: dict[int, tuple[object, BytePieces | None]] = {}
_pieces_lock = threading.Lock()


def _pieces_of(backend) -> BytePieces | None:
    """The backend's :class:`BytePieces` (or None), made once per backend object."""
    found = _PIECES.get(id(backend))
    if found is not None and found[0] is backend:
        return found[1]
    with _pieces_lock:
        found = _PIECES.get(id(backend))
        if found is None or found[0] is not backend:
            found = _PIECES[id(backend)] = (backend, BytePieces.of(backend))
        return found[1]
