"""rlctl's RL-loop transformers generation: the policy is in training mode with gradient checkpointing on (as
GPU plans set it) while it generates; that must not change what it generates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlctl.rollout.generate import HFGenerator
from rlctl.stages.tiny import train_tokenizer
from tests.helpers import free_port


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


def test_sharded_generation_keeps_every_process_in_step(tmp_path):
    """Under FSDP2 every forward pass gathers the shards on all processes: a process with fewer prompts (none, in
    a multi-turn rollout whose conversations have all ended) takes part in the others' calls, and every process
    gets the completions the unsharded model gives (a process left out would hang the other)."""
    model, tok = _policy()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    prompts = [tok(f"{i} + 7 =")["input_ids"] for i in range(6)]
    gen = HFGenerator(tok, max_new_tokens=12, temperature=1.0, batch_size=4)
    gen.sync(model.eval())
    expected = [[gen.generate(prompts, greedy=True), []], [[], gen.generate(prompts[:1], greedy=True)]]

    worker = Path(__file__).resolve().parent / "synced_generate_worker.py"
    port = str(free_port())
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [*run, str(worker), str(tmp_path), str(tmp_path)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)] == expected
