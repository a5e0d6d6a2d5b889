"""rlctl's RL-loop transformers generation: the policy is in training mode with gradient checkpointing on (as
GPU plans set it) while it generates; that must not change what it generates."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlctl.rollout.generate import HFGenerator
from rlctl.stages.tiny import train_tokenizer


def _policy():
    tok = train_tokenizer([f"{a} + {b} = {a + b}" for a in range(30) for b in range(30)], 128)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config), tok


def test_generation_with_checkpointing_in_training_mode_sees_the_whole_sequence():
    model, tok = _policy()
    prompts = [tok(f"{i} + 7 =")["input_ids"] for i in range(6)]
    gen = HFGenerator(tok, max_new_tokens=12, temperature=1.0)
    gen.sync(model.eval())
    reference = gen.generate(prompts, greedy=True)  # eval mode: KV cache on, no checkpointing

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    assert gen.generate(prompts, greedy=True) == reference
    assert model.training and model.is_gradient_checkpointing  # left as the trainer had it

    torch.manual_seed(1)
    sampled = gen.generate(prompts)
    torch.manual_seed(1)
    assert gen.generate(prompts) == sampled  # sampling is reproducible from the RNG state (exact resume)
