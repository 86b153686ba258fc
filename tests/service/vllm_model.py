"""A tiny dense Llama checkpoint for the vLLM tests (random weights, real tokenizer).

The bundled draft model (``hallmark-tiny-draft``) is preferred when it exists; until
then (and so that these tests never depend on it) :func:`tiny_llama` writes a 0.3 M
parameter LlamaForCausalLM with a byte-level BPE tokenizer trained in a second on a few
KB of standard-library documentation. Random weights give a near-uniform next-token
distribution: the hardest case for nothing and the easiest for detection, which is what
the two-tenant test needs (it checks keys, not the model).
"""

from __future__ import annotations

import atexit
import json
import os
import pydoc
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from service.model_paths import BUNDLED_DRAFT, resolve_model_path

VOCAB_SIZE = 512
SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>"]


def bundled_draft() -> Path | None:
    """The bundled dense draft model's directory, if it has been built."""
    path = Path(resolve_model_path(BUNDLED_DRAFT))
    return path if (path / "config.json").exists() and any(path.glob("*.safetensors")) else None


def _corpus() -> list[str]:
    import collections
    import json as json_module
    import textwrap

    text = "".join(pydoc.render_doc(module, renderer=pydoc.plaintext)
                   for module in (collections, json_module, textwrap))
    return [line for line in text.splitlines() if line.strip()]


def _tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=SPECIALS[0], eos_token=SPECIALS[1],
                                   pad_token=SPECIALS[2], clean_up_tokenization_spaces=False)
    fast.save_pretrained(directory)


def tiny_llama(directory: Path, seed: int = 0) -> Path:
    """Write the checkpoint into ``directory`` (created) and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    _tokenizer(directory)
    vocab = len(json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"])
    config = LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=64,
                         max_position_embeddings=2048, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(directory)
    return directory


@lru_cache(maxsize=1)
def checkpoint() -> Path:
    """The checkpoint the vLLM tests run: ``HALLMARK_TEST_VLLM_MODEL`` if set, else the
    bundled draft if it has been built, else a tiny random Llama built once per process."""
    configured = os.environ.get("HALLMARK_TEST_VLLM_MODEL")
    if configured:
        return Path(resolve_model_path(configured))
    bundled = bundled_draft()
    if bundled is not None:
        return bundled
    directory = Path(tempfile.mkdtemp(prefix="hallmark-tiny-llama-"))
    atexit.register(shutil.rmtree, directory, True)
    return tiny_llama(directory / "model")


def child_pids() -> set[int]:
    import psutil

    return {child.pid for child in psutil.Process().children(recursive=True)}


def wait_for_children_to_exit(before: set[int], timeout_s: float = 30.0) -> list[str]:
    """Processes (pid and command) started since ``before`` still alive after ``timeout_s``
    (vLLM's engine-core and worker processes must not outlive their engine)."""
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for pid in child_pids() - before:
            try:
                process = psutil.Process(pid)
                # multiprocessing's resource tracker lives as long as this process does.
                if process.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(process.cmdline()):
                    alive.append(f"{pid} {' '.join(process.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)
