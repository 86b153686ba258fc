"""The bundled tiny models (service/engines/assets): a DeepSeek-V3.2 target and a Llama draft.

Built by scripts/models/{build_corpus,train_tokenizer,train}.py (see scripts/models/NOTES.md).
The tests skip, with the reason, when the checkpoints have not been produced yet.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ASSETS = Path(__file__).resolve().parents[2] / "service" / "engines" / "assets"
TARGET = ASSETS / "hallmark-tiny-dsv32"
DRAFT = ASSETS / "hallmark-tiny-draft"
REPORT = ASSETS / "training_report.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
CHECKPOINT_FILES = ("config.json", "generation_config.json", "model.safetensors", *TOKENIZER_FILES)

pytestmark = pytest.mark.slow


def _missing() -> list[str]:
    return [str(d / f) for d in (TARGET, DRAFT) for f in CHECKPOINT_FILES if not (d / f).exists()]


if _missing():
    pytest.skip(
        "bundled checkpoints not built yet (missing: " + ", ".join(_missing()[:3]) + " ...); "
        "run scripts/models/train.py, see scripts/models/NOTES.md",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def target():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def draft():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(DRAFT, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TARGET)


def test_architectures(target, draft):
    from transformers import DeepseekV32ForCausalLM, LlamaForCausalLM

    assert isinstance(target, DeepseekV32ForCausalLM)
    assert isinstance(draft, LlamaForCausalLM)
    assert target.config.model_type == "deepseek_v32"
    assert draft.config.model_type == "llama"
    # a few million parameters each
    n_target = sum(p.numel() for p in target.parameters())
    n_draft = sum(p.numel() for p in draft.parameters())
    assert 1e6 < n_target < 20e6, n_target
    assert 0.5e6 < n_draft < 5e6, n_draft


def test_sparse_attention_config(target):
    cfg = target.config
    assert 0 < cfg.index_topk < 256, "index_topk must be small enough that sparsity is exercised at a few hundred tokens"
    assert cfg.max_position_embeddings >= 2048
    assert cfg.n_routed_experts >= 2 and cfg.n_shared_experts >= 1
    assert cfg.q_lora_rank and cfg.kv_lora_rank


def test_shared_tokenizer(target, draft, tokenizer):
    from transformers import AutoTokenizer

    for name in TOKENIZER_FILES:
        assert (TARGET / name).read_bytes() == (DRAFT / name).read_bytes(), f"{name} differs between the two models"
    draft_tok = AutoTokenizer.from_pretrained(DRAFT)
    assert draft_tok.get_vocab() == tokenizer.get_vocab()
    assert target.config.vocab_size == draft.config.vocab_size == len(tokenizer)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (0, 1, 2)
    for model in (target, draft):
        assert (model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id) == (0, 1, 2)
    for text in ("The function returns a new list.", "  café 東京 🙂\n\tx = {1: 'a'}  ", ""):
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_forward_and_generate(target, draft, tokenizer):
    ids = torch.tensor([tokenizer("This module provides")["input_ids"]])
    for model in (target, draft):
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
        assert torch.isfinite(logits).all()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, pad_token_id=2
            )
        assert out.shape[1] > ids.shape[1]
        assert isinstance(tokenizer.decode(out[0, ids.shape[1] :]), str)


def test_sampling_with_cache_matches_no_cache(target, tokenizer):
    """Greedy decoding with the KV (+ indexer key) cache equals recomputation without it."""
    ids = torch.tensor([tokenizer("Return a new list")["input_ids"]])
    with torch.no_grad():
        cached = target.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, pad_token_id=2
        )
        seq = ids
        for _ in range(6):
            nxt = target(input_ids=seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(cached, seq)


def test_indexer_selects_a_subset_at_a_few_hundred_tokens(target):
    """At 300 tokens each query past index_topk attends to exactly index_topk keys."""
    k = target.config.index_topk
    seen = {}
    hooks = [
        layer.self_attn.indexer.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, o))
        for i, layer in enumerate(target.model.layers)
    ]
    try:
        ids = torch.randint(3, target.config.vocab_size, (1, 300), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            target(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    assert len(seen) == target.config.num_hidden_layers
    for idx in seen.values():
        assert idx.shape == (1, 300, k)
        # query 299 sees 300 causal keys and keeps k of them, all causal
        assert int(idx[0, 299].max()) <= 299 and len(set(idx[0, 299].tolist())) == k < 300


def test_total_size_within_budget():
    total = sum(f.stat().st_size for d in (TARGET, DRAFT) for f in d.iterdir() if f.is_file())
    assert total <= 40_000_000, f"bundled checkpoints are {total / 1e6:.1f} MB (limit 40 MB)"


def test_training_report_if_present():
    if not REPORT.exists():
        pytest.skip("no training_report.json next to the checkpoints")
    report = json.loads(REPORT.read_text())
    ev = report["eval"]
    for kind in ("target", "draft"):
        assert ev[kind]["val_ppl"] > 1
        assert 0 < ev[kind]["entropy_T1_nats"] < 9.1  # below log(8192)
    assert 0 < ev["pair"]["expected_acceptance_T1"] <= 1
    ix = report["models"]["target"]["indexer"]
    assert ix["index_topk"] == json.loads((TARGET / "config.json").read_text())["index_topk"]
