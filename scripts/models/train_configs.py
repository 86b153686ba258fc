"""The bundled models' configurations: the DeepSeek-V3.2-architecture target and the dense draft."""

from __future__ import annotations

from transformers import DeepseekV32Config, LlamaConfig

from train_common import BOS_ID, EOS_ID, PAD_ID


def target_config(args, vocab_size: int) -> DeepseekV32Config:
    return DeepseekV32Config(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=768,  # the dense MLP of layer 0
        moe_intermediate_size=128,
        num_hidden_layers=4,
        first_k_dense_replace=1,  # layer 0 dense, layers 1-3 MoE
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        q_lora_rank=128,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        index_topk=args.index_topk,
        index_n_heads=4,
        index_head_dim=32,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        initializer_range=0.02,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )


def draft_config(args, vocab_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=192,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=3,  # head_dim 64 (a size vLLM's CPU attention supports)
        num_key_value_heads=1,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
