"""The memory planner (rlctl.plan: memory*, planner, hardware) on CPU: hand-computed
component numbers, the decision matrix of model presets x hardware presets, user overrides, refusals with exit 2,
and a fast, torch-free `rlctl plan`. Every expected number is worked out in the comment next to it, without
the planner."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from rlctl import config
from rlctl.errors import UserError
from rlctl.plan import engine as choice
from rlctl.plan import hardware, memory
from rlctl.plan import planner as plan
from rlctl.plan.memory import arch as memory_arch
from rlctl.plan.memory import model as memory_model
from rlctl.plan.memory import search as memory_search
from rlctl.plan.parts import GenerationSettings, PhaseMemory
from tests.helpers import RLCTL, plan_in_fresh_interpreter

GiB = 2**30


@pytest.fixture
def vllm_here(monkeypatch):
    """Plan as on a GPU machine with vllm installed (the hybrid engine), whatever this machine has."""
    monkeypatch.setattr(choice, "installed", lambda: True)


def build(preset: str, spec: str, *sets: str) -> plan.Plan:
    return plan.build(config.resolve(preset, None, None, spec, list(sets)), "/tmp/rlctl-planner-test")


def phase(p: plan.Plan, name: str) -> PhaseMemory:
    return next(ph for ph in p.memory.phases if ph.label == name)


# --- Architecture arithmetic against published parameter counts ---------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "published", "qkv_biases"),
    [
        # Qwen2.5-7B-Instruct: 7,615,616,512 parameters, of which q/k/v biases 28 x (3584 + 512 + 512) = 129,024
        (memory_arch.Arch(28, 3584, 28, 4, 152064, 18944, False), 7_615_616_512, 28 * (3584 + 512 + 512)),
        # Llama-3.1-8B: 8,030,261,248, no biases
        (memory_arch.Arch(32, 4096, 32, 8, 128256, 14336, False), 8_030_261_248, 0),
        # Qwen2.5-0.5B-Instruct (tied embeddings): 494,032,768; biases 24 x (896 + 128 + 128) = 27,648
        (memory_arch.Arch(24, 896, 14, 2, 151936, 4864, True), 494_032_768, 24 * (896 + 128 + 128)),
    ],
)
def test_parameter_counts_match_published_models(arch, published, qkv_biases):
    assert arch.params() + qkv_biases == published


# A small model worked out by hand: layers 2, hidden 64, heads 4 (head_dim 16), kv_heads 2 (kv_dim 32),
# vocab 100, intermediate 128, untied.
#   per layer: q 64*64 = 4096, o 4096, k 64*32 = 2048, v 2048, gate/up/down 64*128 = 8192 each -> 36,864 linear
#              + 2 norms x 64 = 36,992
#   P = 2 x 36,992 + embedding 6,400 + LM head 6,400 + final norm 64 = 86,848
#   LoRA r=4: per layer 4 x (q 128 + k 96 + v 96 + o 128 + gate 192 + up 192 + down 192) = 4,096 -> 8,192
#   autocast's bf16 copies of the fp32 weights (full training, single/DDP): 2 B x (2 x 36,864 linear + LM head
#   6,400 = 80,128) = 160,256; a critic's (score head 64 x 1): 2 x (73,728 + 64) = 147,584
SMALL = memory_arch.Arch(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100, intermediate=128, tie_embeddings=False)
P, PL, COPIES, CRITIC_COPIES = 86_848, 8_192, 160_256, 147_584
LOGITS = 52_096  # rlctl's chunked LM head on RL below (test_activations_and_logits_by_hand)


def small_env(procs: int = 1, engine_name: str = "vllm") -> memory_model.Env:
    return memory_model.Env(
        is_cpu=False,
        procs=procs,
        nodes=1,
        total=80 * GiB,
        budget=76 * GiB,
        host_budget=1000 * GiB,
        host_assumed=False,
        precision="bf16",
        engine=engine_name,
        lora_r=4,
        lora_dropout=0.05,
    )


# RL workload: 16 rollouts per process, prompts of 6 tokens, completions of 8 -> 14 tokens per sequence
RL = memory_model.Workload("rl", per_proc=16, seqs=1, tokens=14, logit_tokens=8, prompt_tokens=6, group_size=8)


def test_small_model_architecture_numbers():
    assert SMALL.params() == P
    assert SMALL.params("score") == 2 * 36_992 + 6_400 + 64 + 64  # no LM head, a 64 x 1 score head: 80,512
    assert SMALL.lora_params(4) == PL
    assert SMALL.kv_bytes_per_token(2) == 256  # 2 (K, V) x 2 layers x 32 x 2 bytes
    assert SMALL.act_bytes_per_token_layer(2) == 2_432  # 2 bytes x (10 x 64 + 2 x 32 + 4 x 128) = 2 x 1,216
    # fp32 weights under bf16 autocast: fp32 residual; per norm input 4h + normalised 4h bytes (2 norms: 1,024),
    # a bf16 cast of the norm output per q, k, v, gate, up (5 x 2h = 640), Q + attention output 2 x 2h = 256,
    # K + V 2 x 2 x 32 = 128, MLP 4 x 2 x 128 = 1,024 -> 3,072 (= 30h + 4 kv_dim + 8I)
    assert SMALL.act_bytes_per_token_layer_master() == 3_072
    assert SMALL.matmul_params() == 80_128 and SMALL.matmul_params("score") == 73_792
    assert SMALL.lora_dropout_bytes_per_token_layer(2) == 1_024  # 2 x (6 x 64 + 128)
    # NF4 with double quantisation: 0.5 + 1/64 + 4/(64*256) = 0.515869140625 B per linear weight
    # 73,728 linear weights x 0.515869140625 = 38,034; the other 13,120 weights in bf16 = 26,240 -> 64,274
    assert memory_model.quantized_bytes(SMALL, small_env()) == pytest.approx(64_274)


@pytest.mark.parametrize(
    ("setup", "procs", "expected"),
    [
        # fp32 master weights (full training loads fp32, bf16 autocast): P = 86,848 -> weights 4P = 347,392,
        # grads 4P = 347,392, AdamW m+v 8P = 694,784
        (
            memory_model.Setup("single", "full"),
            1,
            {"weights": 347_392, "grads": 347_392, "optim": 694_784, "buckets": 0},
        ),
        # DDP adds fp32 gradient buckets (4P) on every GPU
        (
            memory_model.Setup("ddp", "full"),
            4,
            {"weights": 347_392, "grads": 347_392, "optim": 694_784, "buckets": 347_392},
        ),
        # FSDP2 over 4 GPUs, fp32 master: 4P/4 = 86,848 + gathered units 3 x max(36,992, 6,400) x 2 = 221,952
        # -> 308,800; grads 4P/4 = 86,848; AdamW 8P/4 = 173,696
        (memory_model.Setup("fsdp2", "full"), 4, {"weights": 308_800, "grads": 86_848, "optim": 173_696, "buckets": 0}),
        # FSDP2 + CPU offload: only the gathered units stay; the 347,392 B shard goes to host RAM
        (
            memory_model.Setup("fsdp2", "full", cpu_offload=True),
            4,
            {"weights": 221_952, "grads": 0, "optim": 0, "buckets": 0, "host": 347_392},
        ),
        # LoRA: frozen bf16 base 2P = 173,696 + fp32 adapters 4 x 8,192 = 32,768; grads 32,768; AdamW 65,536
        (memory_model.Setup("single", "lora"), 1, {"weights": 206_464, "grads": 32_768, "optim": 65_536, "buckets": 0}),
        # QLoRA: NF4 base 64,274 + adapters 32,768 = 97,042
        (memory_model.Setup("single", "qlora"), 1, {"weights": 97_042, "grads": 32_768, "optim": 65_536, "buckets": 0}),
    ],
)
def test_training_state_by_hand(setup, procs, expected):
    state = memory_model.model_state(SMALL, small_env(procs), setup)
    for key, value in expected.items():
        assert state[key] == pytest.approx(value), key


def test_activations_and_logits_by_hand():
    env = small_env()
    full = memory_model.Setup("single", "full")
    # micro-batch 2 x 14 tokens = 28 tokens; fp32 master weights, no checkpointing: 28 x 2 layers x 3,072 = 172,032
    assert memory_model.activations(SMALL, env, full, RL, 2) == 172_032
    # checkpointing: fp32 layer inputs 28 x 2 layers x 4 B x 64 = 14,336 + one layer recomputed 28 x 3,072
    # = 86,016 -> 100,352
    assert memory_model.activations(SMALL, env, full._replace(checkpointing=True), RL, 2) == 100_352
    # FSDP2 computes with its gathered bf16 units (bf16 residual): 28 x 2 x 2,432 = 136,192; checkpointed: inputs
    # 28 x 2 x 2 B x 64 = 7,168 + one layer 28 x 2,432 = 68,096 -> 75,264
    fsdp2 = memory_model.Setup("fsdp2", "full")
    assert memory_model.activations(SMALL, small_env(4), fsdp2, RL, 2) == 136_192
    assert memory_model.activations(SMALL, small_env(4), fsdp2._replace(checkpointing=True), RL, 2) == 75_264
    # LoRA keeps dropout copies too: 28 x 2 x (2,432 + 1,024) = 193,536
    assert memory_model.activations(SMALL, env, memory_model.Setup("single", "lora"), RL, 2) == 193_536
    # rlctl's RL loop scores the 2 sequences x 8 completion tokens = 16 tokens through the head in chunks (all 16 in
    # one here): 16 x vocab 100 x 14 B = 22,400, the fp32 gradient of the hidden states 16 x 64 x 4 = 4,096, and the
    # fp32 gradient of the trained head 100 x 64 x 4 = 25,600 -> 52,096 in any precision (a LoRA policy's frozen head
    # has none: 26,496)
    assert memory_model.logits(SMALL, env, full, RL, 2) == LOGITS == 52_096
    assert memory_model.logits(SMALL, env._replace(precision="no"), full, RL, 2) == LOGITS
    assert memory_model.logits(SMALL, env, memory_model.Setup("single", "lora"), RL, 2) == 26_496
    # a chunk holds at most LOGPROB_CHUNK_ENTRIES logits (at least one token of each sequence)
    big = SMALL._replace(vocab=2**22)
    assert memory_model.logits(big, env, memory_model.Setup("single", "lora"), RL, 2) == (
        memory_model.LOGPROB_CHUNK_ENTRIES * 14 + 16 * 64 * 4
    )


def test_phases_by_hand():
    env = small_env()
    fit = memory_search.stage_fit(SMALL, env, memory_model.Setup("single", "full"), RL, 2)
    gen, train, step = fit.phases
    ctx = 0.8 * GiB
    # training: context + fp32 weights 4P = 347,392 + grads 347,392 + vLLM residue 1 GiB + bf16 copies 160,256
    #           + activations 172,032 + logits 32,896 + AdamW 8P = 694,784
    assert train.components["vLLM sleeping residue"] == GiB
    assert train.components["bf16 weight copies (autocast)"] == COPIES
    assert train.peak == pytest.approx(ctx + GiB + 347_392 + 347_392 + 160_256 + 172_032 + LOGITS + 694_784)
    # generation: weights and AdamW stay (no gradients: freed after each step; no autocast copies: vLLM
    # generates), then vLLM's reservation. vLLM: its own bf16 weights 2P = 173,696; runtime 1 GiB + 16 seqs x
    # 100 x 4 B = 1 GiB + 6,400; KV 14 tokens x 256 B = 3,584 per rollout, 16 rollouts 57,344
    # -> need 1,073,979,264 B = 0.0125 of 80 GiB -> util 0.02
    assert fit.generation.util == 0.02
    reservation = 0.02 * 80 * GiB
    assert gen.components["vLLM KV cache"] == pytest.approx(reservation - 173_696 - GiB - 6_400)
    assert "bf16 weight copies (autocast)" not in gen.components
    assert gen.peak == pytest.approx(ctx + 347_392 + 694_784 + reservation)
    assert fit.generation.concurrent == 16 and fit.generation.max_model_length == 14
    # the optimizer step (measured apart): the state alone, no forward's activations, logits or autocast copies
    assert step.name == "optimizer step" and step.peak == pytest.approx(ctx + GiB + 347_392 + 347_392 + 694_784)
    assert step.peak < train.peak


def test_phase_offload_splits_the_optimizer_step():
    fit = memory_search.stage_fit(SMALL, small_env(), memory_model.Setup("single", "full", phase_offload=True), RL, 2)
    gen, train, step = fit.phases
    assert "optimizer states" not in gen.components and "optimizer states" not in train.components
    # AdamW m + v in fp32: 8P = 694,784, only around the step; the step runs no forward (no activations, logits
    # or autocast copies): context 0.8 GiB + residue 1 GiB + weights 347,392 + grads 347,392 + AdamW 694,784
    assert step.name == "optimizer step" and step.components["optimizer states"] == 694_784
    assert not {"activations", "logits", "bf16 weight copies (autocast)"} & set(step.components)
    assert step.peak == pytest.approx(1.8 * GiB + 347_392 + 347_392 + 694_784)
    assert train.peak == pytest.approx(1.8 * GiB + 347_392 + 347_392 + 160_256 + 172_032 + LOGITS)


def test_reward_model_and_critic_by_hand():
    wl = RL._replace(reward_model=True, critic=True)
    gen, train, _ = memory_search.stage_fit(SMALL, small_env(), memory_model.Setup("single", "full"), wl, 2).phases
    # reward model: the frozen classifier (80,512 parameters) loads in bf16 = 161,024 in both phases
    assert gen.components["reward model"] == train.components["reward model"] == 161_024
    # critic: trains in full like the policy, fp32: weights 4 x 80,512 = 322,048 + grads 322,048 + AdamW 644,096
    # = 1,288,192 while training; no gradients while generating: 966,144
    assert train.components["critic (weights, grads, optimizer)"] == 1_288_192
    assert gen.components["critic (weights, optimizer)"] == 966_144
    # the critic runs its own forward/backward over the same tokens: activations 2 x 172,032; its autocast copies
    # join the policy's: 160,256 + 147,584 = 307,840
    assert train.components["activations"] == 344_064
    assert train.components["bf16 weight copies (autocast)"] == COPIES + CRITIC_COPIES == 307_840


def test_transformers_generation_by_hand():
    env = small_env(engine_name="transformers")
    gen = memory_search.stage_fit(SMALL, env, memory_model.Setup("single", "full"), RL, 2).phases[0].components
    # fp32 policy: the fp32 embedding makes RoPE's cos/sin fp32, so cached keys (and values, cat'ed after them)
    # are fp32: 2 x 2 layers x 32 x 4 B = 512 B per token, every rollout at once 16 x 14 x 512 = 114,688
    assert gen["KV cache (generate)"] == 114_688
    # prefill: 16 x 6 prompt tokens x (gate, up, act in bf16 3 x 128 x 2 B + residual, norm output fp32 2 x 64 x
    # 4 B = 1,280) = 122,880; each forward re-casts the weights: copies 160,256
    assert gen["prefill activations"] == 122_880
    assert gen["bf16 weight copies (autocast)"] == COPIES
    assert gen["sampling logits"] == 16 * 100 * 12  # 19,200
    # weights 4P + AdamW 8P stay; context 0.8 GiB
    expected = 0.8 * GiB + 347_392 + 694_784 + 160_256 + 114_688 + 122_880 + 19_200
    assert sum(gen.values()) == pytest.approx(expected)
    # LoRA: a bf16 base computes in bf16: KV 16 x 14 x 256 = 57,344; prefill 16 x 6 x 2 x (3 x 128 + 2 x 64)
    # = 98,304; no fp32 weights to re-cast
    lora = memory_search.stage_fit(SMALL, env, memory_model.Setup("single", "lora"), RL, 2).phases[0].components
    assert lora["KV cache (generate)"] == 57_344 and lora["prefill activations"] == 98_304
    assert "bf16 weight copies (autocast)" not in lora


# --- Real presets: per-component numbers from `rlctl plan --json` against independent arithmetic ---------------


def test_qwen7b_on_8xh100_numbers(vllm_here):
    p = build("qwen7b-grpo", "8xH100-80GB", "rl.beta=0.0")
    assert (p.strategy, p.adapter, p.cpu_offload) == ("fsdp2", "full", False)
    n = 7_615_487_488  # Qwen2.5-7B without biases (see above)
    embedding = 152_064 * 3_584  # 544,997,376: the largest FSDP unit
    train = phase(p, "rl/training").components_gib
    assert train["policy weights"] == pytest.approx((4 * n / 8 + 3 * embedding * 2) / GiB, abs=1e-3)  # 6.592
    assert train["policy gradients"] == pytest.approx(4 * n / 8 / GiB, abs=1e-3)  # 3.546
    assert train["optimizer states"] == pytest.approx(8 * n / 8 / GiB, abs=1e-3)  # 7.092
    rl = p.stages[0]
    assert (rl.micro_batch_size, rl.grad_accum) == (4, 16)  # 512 rollouts / 8 GPUs = 64 per GPU
    assert p.gradient_checkpointing is False
    tokens = rl.micro_batch_size * (512 + 1024)  # max_prompt_length + max_new_tokens
    per_layer = 2 * (10 * 3584 + 2 * 512 + 4 * 18944)  # 225,280 B per token per layer
    assert train["activations"] == pytest.approx(tokens * 28 * per_layer / GiB, abs=1e-3)  # 36.094
    # the loop's chunked LM head: one chunk of 2^26 logits x 14 B = 939,524,096 + fp32 hidden-state gradient
    # 4 x 1,024 x 3,584 x 4 = 58,720,256 + the head's fp32 gradient 152,064 x 3,584 x 4 = 2,179,989,504
    assert train["logits"] == pytest.approx(3_178_233_856 / GiB, abs=1e-3)  # 2.960
    peak = 0.8 + 1.0 + sum(train[k] for k in ("policy weights", "policy gradients", "optimizer states"))
    peak += train["activations"] + train["logits"]
    assert phase(p, "rl/training").peak_gib == pytest.approx(peak, abs=2e-3)
    gen = phase(p, "rl/generation").components_gib
    assert gen["vLLM weights"] == pytest.approx(2 * n / GiB, abs=1e-3)  # 14.185
    # KV: 64 rollouts x 1,536 tokens x 2 x 28 x 512 x 2 B = 5.25 GiB, all held at once
    assert gen["vLLM KV cache"] >= 64 * 1536 * 57_344 / GiB - 1e-3
    assert p.vllm.concurrent_sequences == 64 and p.vllm.max_model_length == 1536
    for ph in p.memory.phases:
        assert ph.fits and ph.peak_gib <= ph.budget_gib == pytest.approx(79.65 * 0.95, abs=1e-2)


def test_qwen05b_on_one_h100_numbers(vllm_here):
    # full fine-tuning on one GPU keeps fp32 master weights without FSDP2 (the stages load the policy in fp32)
    p = build("qwen0.5b-grpo", "1xH100-80GB", "rl.beta=0.0")
    assert (p.strategy, p.adapter, p.cpu_offload, p.phase_offload) == ("single", "full", False, False)
    # P = 494,005,120 (published 494,032,768 less 27,648 q/k/v biases); linear per layer 2 x 896^2 + 2 x 896 x 128
    # + 3 x 896 x 4,864 = 14,909,440, x 24 = 357,826,560; tied LM head 151,936 x 896 = 136,134,656
    n = 494_005_120
    train = phase(p, "rl/training").components_gib
    assert train["policy weights"] == pytest.approx(4 * n / GiB, abs=1e-3)  # 1.840
    assert train["policy gradients"] == pytest.approx(4 * n / GiB, abs=1e-3)  # 1.840
    assert train["optimizer states"] == pytest.approx(8 * n / GiB, abs=1e-3)  # 3.681
    copies = 2 * (357_826_560 + 136_134_656)  # 987,922,432 B
    assert train["bf16 weight copies (autocast)"] == pytest.approx(copies / GiB, abs=1e-3)  # 0.920
    rl = p.stages[0]
    assert (rl.micro_batch_size, rl.grad_accum, p.gradient_checkpointing) == (16, 16, False)
    tokens = 16 * (512 + 1024)  # 24,576
    per_layer = 30 * 896 + 4 * 128 + 8 * 4864  # 66,304 B per token per layer (fp32 residual)
    assert train["activations"] == pytest.approx(tokens * 24 * per_layer / GiB, abs=1e-3)  # 36.422
    # the loop's chunked LM head: 2^26 logits x 14 B = 939,524,096 + hidden-state gradient 16 x 1,024 x 896 x 4
    # = 58,720,256 + the tied head's fp32 gradient 151,936 x 896 x 4 = 544,538,624 -> 1,542,782,976 B
    assert train["logits"] == pytest.approx(1_542_782_976 / GiB, abs=1e-3)  # 1.437
    # 0.8 + 1 (vLLM residue) + 1.840 + 1.840 + 3.681 + 0.920 + 36.422 + 1.437 = 47.940 of 79.65 x 0.95 = 75.668
    assert phase(p, "rl/training").peak_gib == pytest.approx(47.940, abs=2e-3)
    # disk: (keep_last 2 + the best + the one being written) checkpoints x (fp32 weights 4P + AdamW 8P)
    # + the fp32 final model 4P = 52P
    assert p.memory.disk.need_gib == pytest.approx(52 * n / GiB, abs=1e-3)  # 23.924


# --- The decision matrix ------------------------------------------------------------------------------------------

SINGLE, DDP = ("single", "full", False), ("ddp", "full", False)
FSDP2, CPU_OFFLOAD, QLORA = ("fsdp2", "full", False), ("fsdp2", "full", True), ("single", "qlora", False)
MATRIX = {
    # (preset, hardware): (strategy, adapter, FSDP2 CPU offload). Full fine-tuning keeps fp32 master weights
    # whatever the strategy (16 B/param of state + autocast's 2 B/param bf16 copies on single/DDP), so the
    # replicated layouts come first: 0.5B and 1.5B replicate (DDP state 20 B/param: 9.2 / 28.8 GiB per GPU);
    # 7-8B (16 B/param: 113-120 GiB) shard with FSDP2 over 8+ GPUs, offload the fp32 state to host RAM on one
    # 80 GB GPU, and fall back to QLoRA on 24 GB cards; 1.5B on a 24 GB card offloads too (its 23 GiB of
    # state does not fit next to the context).
    ("qwen0.5b-grpo", "1xA10G-24GB"): SINGLE,
    ("qwen0.5b-grpo", "1xH100-80GB"): SINGLE,
    ("qwen0.5b-grpo", "8xH100-80GB"): DDP,
    ("qwen0.5b-grpo", "2x8xH100-80GB"): DDP,
    ("qwen1.5b-grpo", "1xA10G-24GB"): CPU_OFFLOAD,
    ("qwen1.5b-grpo", "1xH100-80GB"): SINGLE,
    ("qwen1.5b-grpo", "8xH100-80GB"): DDP,
    ("qwen1.5b-grpo", "2x8xH100-80GB"): DDP,
    ("qwen7b-grpo", "1xA10G-24GB"): QLORA,
    ("qwen7b-grpo", "1xH100-80GB"): CPU_OFFLOAD,
    ("qwen7b-grpo", "8xH100-80GB"): FSDP2,
    ("qwen7b-grpo", "2x8xH100-80GB"): FSDP2,
    ("llama8b-grpo", "1xA10G-24GB"): QLORA,
    ("llama8b-grpo", "1xH100-80GB"): CPU_OFFLOAD,
    ("llama8b-grpo", "8xH100-80GB"): FSDP2,
    ("llama8b-grpo", "2x8xH100-80GB"): FSDP2,
    ("qwen7b-sft", "1xA10G-24GB"): QLORA,
    ("qwen7b-sft", "1xH100-80GB"): CPU_OFFLOAD,
    ("qwen7b-sft", "8xH100-80GB"): FSDP2,
    ("qwen7b-sft", "2x8xH100-80GB"): FSDP2,
    ("qwen7b-dpo", "1xA10G-24GB"): QLORA,
    ("qwen7b-dpo", "1xH100-80GB"): CPU_OFFLOAD,
    ("qwen7b-dpo", "8xH100-80GB"): FSDP2,
    ("qwen7b-dpo", "2x8xH100-80GB"): FSDP2,
}


@pytest.mark.parametrize(("preset", "spec"), list(MATRIX))
def test_decision_matrix(vllm_here, preset, spec):
    sets = ["rl.beta=0.0"] if "grpo" in preset else []
    p = build(preset, spec, *sets)
    assert (p.strategy, p.adapter, p.cpu_offload) == MATRIX[preset, spec]
    mem = p.memory
    assert mem is not None and mem.fits and mem.headroom_gib >= 0
    assert all(ph.peak_gib <= ph.budget_gib for ph in mem.phases)
    assert mem.host.peak_gib <= mem.host.budget_gib
    for s in p.stages:  # micro-batches divide the per-process batch
        assert s.micro_batch_size * s.grad_accum * p.num_processes * p.hardware.nodes == s.batch_size
    settings = {d["setting"] for d in p.decisions}
    assert {"strategy", "adapter", "gradient_checkpointing"} <= settings
    assert all(d["why"] for d in p.decisions), "every choice is explained"
    if "grpo" in preset:
        assert p.generation_engine == "vllm" and 0 < p.vllm.gpu_memory_utilization < 1
        assert {"vllm.gpu_memory_utilization", "vllm.tensor_parallel_size", "reference"} <= settings
        assert p.accelerate.get("fsdp_config", {}).get("fsdp_offload_params", False) == p.cpu_offload


def test_reference_placement(vllm_here):
    assert build("qwen7b-grpo", "8xH100-80GB", "rl.beta=0.0").reference == "none"
    sharded = build("qwen7b-grpo", "8xH100-80GB", "rl.beta=0.04")
    assert sharded.reference == "gpu-sharded"
    # rlctl's RL loop (every algorithm) loads its reference frozen, in bf16, and shards it with the policy under
    # FSDP2: 2 x 7,615,487,488 / 8 = 1,903,871,872 B = 1.773 GiB per GPU
    assert phase(sharded, "rl/training").components_gib["reference model"] == pytest.approx(1.773, abs=1e-3)
    # replicated: 2 x 494,005,120 = 988,010,240 B = 0.920 GiB on the one GPU
    whole = build("qwen0.5b-grpo", "1xH100-80GB", "rl.beta=0.04")
    assert (whole.strategy, whole.reference) == ("single", "gpu")
    assert phase(whole, "rl/training").components_gib["reference model"] == pytest.approx(0.920, abs=1e-3)
    loop = build("qwen7b-grpo", "8xH100-80GB", "rl.algorithm=reinforce-pp", "rl.beta=0.04")
    assert (loop.strategy, loop.adapter, loop.reference) == ("fsdp2", "full", "gpu-sharded")
    assert phase(loop, "rl/training").components_gib["reference model"] == pytest.approx(1.773, abs=1e-3)
    # FSDP2 + CPU offload (DPO, 7B on one H100): the fp32 reference waits in host RAM, 4 x 7,615,487,488 B
    # = 28.370 GiB, next to the offloaded fp32 state 16P = 113.480 GiB and 2 GiB for the process: 143.850 of
    # 160 x 0.9 = 144 GiB
    dpo = build("qwen7b-dpo", "1xH100-80GB")
    assert (dpo.strategy, dpo.cpu_offload, dpo.reference) == ("fsdp2", True, "cpu-offload")
    host = dpo.memory.host
    assert host.components_gib["reference model (CPU offload)"] == pytest.approx(28.370, abs=1e-3)
    assert host.peak_gib == pytest.approx(143.850, abs=2e-3) and host.budget_gib == 144.0
    lora = build("qwen7b-grpo", "1xA10G-24GB", "rl.beta=0.04")
    assert lora.adapter == "qlora" and lora.reference == "adapters-disabled"
    assert "reference model" not in phase(lora, "rl/training").components_gib


def test_tensor_parallel_when_vllm_weights_crowd_one_gpu(vllm_here):
    # Llama-3.1-70B numbers: P = 80 x (2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672 + 2 x 8192)
    # + 2 x 128256 x 8192 + 8192 = 70,553,706,496; its bf16 weights (131 GiB) cannot sit on one 80 GB GPU
    arch = ["layers=80", "hidden=8192", "heads=64", "kv_heads=8", "vocab=128256", "intermediate=28672"]
    p = build("llama8b-grpo", "8xH100-80GB", "rl.beta=0.0", *[f"model.arch.{a}" for a in arch])
    tp = p.vllm.tensor_parallel_size
    assert tp in (2, 4, 8)
    assert phase(p, "rl/generation").components_gib["vLLM weights"] == pytest.approx(
        2 * 70_553_706_496 / tp / GiB, abs=1e-3
    )


def test_phase_offload_chosen_when_training_needs_the_room(vllm_here):
    # Qwen2.5-1.5B (P = 28 x 46,795,776 + 151,936 x 1,536 + 1,536 = 1,543,656,960) on one A100-40GB (budget
    # 40 x 0.95 = 38 GiB), rlctl's loop with 32,768-token completions, micro-batch 2, checkpointed:
    #   context 0.8 + vLLM residue 1 + fp32 weights 4P 5.751 + grads 5.751
    #   + bf16 copies 2 x (28 x 46,792,704 + 233,373,696) = 3,087,138,816 B = 2.875
    #   + activations 18.027 + the loop's chunked LM head 2^26 x 14 B + 65,536 x 1,536 x 4 + 151,936 x 1,536 x 4
    #   = 2.119 -> 36.323 GiB; with AdamW (8P = 11.501) also on the GPU 47.8 > 38
    # so AdamW leaves the GPU between steps; the optimizer step: 0.8 + 1 + 5.751 + 5.751 + 11.501 = 24.803
    p = build("qwen1.5b-grpo", "1xA100-40GB", "rl.beta=0.0", "rl.max_new_tokens=32768", "rl.algorithm=reinforce-pp")
    assert (p.strategy, p.adapter, p.phase_offload, p.gradient_checkpointing) == ("single", "full", True, True)
    assert (p.stages[0].micro_batch_size, p.stages[0].grad_accum) == (2, 128)
    names = [ph.label for ph in p.memory.phases]
    assert names == ["rl/generation", "rl/training", "rl/optimizer step"]
    assert "optimizer states" not in phase(p, "rl/generation").components_gib
    assert phase(p, "rl/training").components_gib["logits"] == pytest.approx(
        (2**26 * 14 + 65_536 * 1_536 * 4 + 151_936 * 1_536 * 4) / GiB, abs=1e-3
    )
    assert phase(p, "rl/training").peak_gib == pytest.approx(36.323, abs=2e-3)
    assert phase(p, "rl/optimizer step").peak_gib == pytest.approx(24.803, abs=2e-3)
    assert p.memory.host.components_gib["optimizer states (between phases)"] == pytest.approx(11.501, abs=1e-3)
    why = next(d["why"] for d in p.decisions if d["setting"] == "optimizer offload" and d["value"] == "between phases")
    assert "rl/training would peak at 47.8 GiB > 38.0 GiB" in why
    # at 8,192 tokens, where the loop once held all [tokens x vocabulary] logits (18.5 GiB) and needed it, AdamW
    # now stays
    assert not build("qwen1.5b-grpo", "1xA100-40GB", "rl.beta=0.0", "rl.max_new_tokens=8192").phase_offload


def test_transformers_generation_when_vllm_is_not_used(monkeypatch):
    p = build("qwen0.5b-grpo", "1xA10G-24GB", "rl.beta=0.0", "rl.use_vllm=false")
    assert p.generation_engine == "transformers" and p.vllm is None
    assert (p.strategy, p.adapter) == ("single", "full")
    chunk = p.generation.rollouts_per_generate
    assert p.generation.rollouts_per_process == 256 and 256 % chunk == 0
    gen = phase(p, "rl/generation").components_gib
    # the chunk's rollouts at once, fp32 keys and values (fp32 policy): chunk x (512 + 1024) tokens x 2 x 24 layers
    # x 128 x 4 B (9.0 GiB for all 256)
    assert gen["KV cache (generate)"] == pytest.approx(chunk * 1536 * 2 * 24 * 128 * 4 / GiB, abs=1e-3)


def test_transformers_generation_runs_in_chunks_that_fit(monkeypatch):
    """qwen7b-grpo without vLLM on one H100: 512 rollouts at once do not fit, half of them per call do."""
    p = build("qwen7b-grpo", "1xH100-80GB", "rl.use_vllm=false")
    assert p.generation == GenerationSettings(rollouts_per_process=512, rollouts_per_generate=256)
    assert any(d["setting"] == "generation chunk" and d["value"].startswith("256 of 512") for d in p.decisions)
    gen = phase(p, "rl/generation")
    assert gen.fits and gen.components_gib["KV cache (generate)"] == pytest.approx(
        256 * (512 + 1024) * 2 * 28 * 512 * 2 / GiB, rel=0.01
    )  # 256 rollouts x (prompt + completion) x K,V x 28 layers x 4 kv heads x 128 x bf16 (gathered FSDP2 units)
    rl = next(s for s in p.stages if s.name == "rl")
    assert 256 % rl.micro_batch_size == 0  # whole micro-batches, and whole groups of 8


# --- Tiny demo on CPU: reported against RAM, never refused --------------------------------------------------------


def test_tiny_demo_on_cpu_keeps_its_settings():
    p = build("tiny-demo", "cpu")
    assert (p.strategy, p.adapter, p.gradient_checkpointing, p.generation_engine) == (
        "single",
        "full",
        False,
        "transformers",
    )
    assert [(s.name, s.micro_batch_size, s.grad_accum) for s in p.stages] == [
        ("sft", 64, 1),
        ("rm", 32, 1),
        ("rl", 64, 2),
    ]
    mem = p.memory
    assert mem.device == "cpu" and mem.fits and 0 < mem.peak_gib < mem.budget_gib
    assert not p.phase_offload and not p.cpu_offload and p.vllm is None


def test_tiny_demo_is_never_refused_even_without_ram(monkeypatch):
    real = hardware.parse_spec

    def tiny_ram(spec):
        hw = real(spec)
        return hw.__class__(**{**hw.to_dict(), "ram_gib": 0.001}) if spec == "cpu" else hw

    monkeypatch.setattr(hardware, "parse_spec", tiny_ram)
    p = build("tiny-demo", "cpu")
    assert not p.memory.fits
    assert any("the run may swap or fail" in w for w in p.warnings)


# --- The user's explicit settings win --------------------------------------------------------------------------


def test_explicit_adapter_wins_with_a_warning(vllm_here):
    p = build("qwen7b-grpo", "1xA10G-24GB", "rl.beta=0.0", "model.adapter=full")
    assert p.adapter == "full" and not p.memory.fits
    warning = next(w for w in p.warnings if "model.adapter=full will not fit" in w)
    assert "Nearest plan that fits: --set model.adapter=qlora" in warning
    assert any(d["setting"] == "adapter" and "(set by you)" in d["why"] for d in p.decisions)


def test_explicit_settings_that_fit_are_kept(vllm_here):
    p = build(
        "qwen7b-grpo",
        "8xH100-80GB",
        "rl.beta=0.0",
        "hardware.strategy=ddp",
        "model.adapter=lora",
        "model.gradient_checkpointing=true",
        "rl.micro_batch_size=2",
    )
    assert (p.strategy, p.adapter, p.gradient_checkpointing, p.stages[0].micro_batch_size) == ("ddp", "lora", True, 2)
    assert p.memory.fits and not [w for w in p.warnings if "will not fit" in w]


def test_full_training_keeps_fp32_master_weights(vllm_here):
    p = build("qwen0.5b-grpo", "1xH100-80GB", "rl.beta=0.0", "hardware.strategy=single", "model.adapter=full")
    assert (p.strategy, p.adapter) == ("single", "full")
    why = next(d for d in p.decisions if d["setting"] == "adapter")["why"]
    assert "fp32 master weights" in why and "4 + grads 4 + AdamW 8 B/param" in why


# --- Refusal ------------------------------------------------------------------------------------------------------


def test_refusal_names_the_nearest_fitting_plan(vllm_here):
    cfg = config.resolve("qwen7b-grpo", None, None, "1xL4-24GB", ["rl.beta=0.0", "rl.max_new_tokens=32000"])
    with pytest.raises(UserError) as e:
        plan.build(cfg, "/tmp/x")
    text = str(e.value)
    assert "does not fit 1xL4-24GB" in text and "Nearest plans that fit" in text
    assert "--set rl.max_new_tokens=8000 (qlora" in text  # 32000 -> 16000 -> 8000 fits
    assert "--hardware 1xA100-80GB" in text


def test_refusal_exits_2_from_the_cli():
    proc = subprocess.run(
        [RLCTL, "plan", "--preset", "qwen7b-grpo", "--hardware", "1xL4-24GB", "--set", "rl.max_new_tokens=32000"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "does not fit 1xL4-24GB" in proc.stderr and "Traceback" not in proc.stderr
    assert "Nearest plans that fit" in proc.stderr or "No nearby plan fits" in proc.stderr


# --- Torch-free ----------------------------------------------------------------------------------------------------


def test_plan_json_is_torch_free():
    # its speed is measured in bench/cli_latency.py, not here: a timed test is a flaky test
    result = plan_in_fresh_interpreter("--preset", "qwen7b-grpo", "--hardware", "1xH100-80GB", "--run-dir", "/tmp/x")
    assert (result["torch"], result["vllm"]) == (False, False) and result["plan"]["num_processes"] == 1


def test_plan_counts_a_generated_task_and_plans_the_lengths_it_has_torch_free(tmp_path: Path):
    # tiny-demo generates its data (data.generate): `rlctl plan` generates it into a scratch folder as `rlctl train`
    # does, counts it with the builtin tokenizer trained as the launch trains it, and plans those lengths
    result = plan_in_fresh_interpreter("--preset", "tiny-demo", "--run-dir", str(tmp_path / "run"))
    p, counted = result["plan"], result["plan"]["preflight"]["lengths"]
    assert result["torch"] is False and not (tmp_path / "run").exists()
    assert p["data"]["sft"]["source"] == "generated (arithmetic, data.generate)"
    said = {d["setting"]: d["value"] for d in p["decisions"]}
    for stage in ("sft", "rm"):  # shorter than their 16-token limits
        assert counted[stage]["longest"] < counted[stage]["limit"] == 16
        assert said[f"{stage} tokens per sequence (memory)"] == str(counted[stage]["longest"])
    assert said["RL prompt tokens (memory)"] == str(counted["rl"]["longest"])


def test_plan_json_carries_the_memory_section():
    proc = subprocess.run(
        [RLCTL, "plan", "--preset", "qwen7b-grpo", "--hardware", "8xH100-80GB", "--json", "--run-dir", "/tmp/x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    p = json.loads(proc.stdout)
    for key in ("strategy", "adapter", "gradient_checkpointing", "cpu_offload", "phase_offload", "reference"):
        assert key in p
    mem = p["memory"]
    assert {"phases", "peak_gib", "budget_gib", "headroom_gib", "fits", "host", "disk"} <= set(mem)
    assert {"stage", "phase", "components_gib", "peak_gib", "budget_gib", "headroom_gib"} <= set(mem["phases"][0])
    assert all(set(d) == {"setting", "value", "why"} for d in p["decisions"])


def test_render_is_a_rich_table(vllm_here):
    from rich.console import Console
    from rich.table import Table

    p = build("qwen7b-grpo", "1xA10G-24GB")
    table = memory.render(p)
    assert isinstance(table, Table)
    console = Console(width=200, record=True)
    console.print(table)
    text = console.export_text()
    assert "rl: generation" in text and "vLLM KV cache" in text and "headroom" in text
    assert "vllm.gpu_memory_utilization" in text


# --- Hardware -----------------------------------------------------------------------------------------------------


def test_specs_carry_usable_memory_and_compute_capability():
    h = hardware.parse_spec("1xA10G-24GB")
    assert (h.gpu_memory_gib, h.gpu_usable_gib, h.compute_capability) == (24.0, 22.49, "8.6")  # 23,028 MiB
    h = hardware.parse_spec("2x8xH100-80GB")
    assert (h.nodes, h.gpus_per_node, h.world_size, h.gpu_usable_gib) == (2, 8, 16, 79.65)  # 81,559 MiB
    assert h.ram_assumed and h.ram_gib == 2 * 80 * 8
    t4 = hardware.parse_spec("1xT4-16GB")
    assert t4.compute_capability == "7.5" and not t4.bf16 and t4.gpu_usable_gib == 16.0


def test_t4_plans_in_float32(vllm_here):
    p = build("qwen0.5b-grpo", "1xT4-16GB", "rl.beta=0.0")
    assert p.mixed_precision == "no" and any("no bf16" in w for w in p.warnings)


def _fake_smi(monkeypatch, rows_by_fields: dict[str, str]):
    def run(cmd, **kwargs):
        fields = cmd[1].split("=", 1)[1]
        if fields not in rows_by_fields:
            raise subprocess.CalledProcessError(6, cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=rows_by_fields[fields], stderr="")

    monkeypatch.setattr(hardware.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(hardware.subprocess, "run", run)


def test_detect_reads_nvidia_smi_without_cuda(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    rows = "".join(f"{i}, NVIDIA H100 80GB HBM3, 81559, 9.0\n" for i in range(8))
    _fake_smi(monkeypatch, {"index,name,memory.total,compute_cap": rows})
    h = hardware.detect()
    assert (h.spec, h.gpus_per_node, h.gpu_name, h.compute_capability) == ("8xH100-80GB", 8, "H100", "9.0")
    assert h.gpu_usable_gib == 79.6 and not h.ram_assumed  # floor(81,559 / 1,024, 0.1)


def test_detect_old_driver_and_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    rows = "0, NVIDIA A10G, 23028\n1, NVIDIA A10G, 23028\n"
    _fake_smi(monkeypatch, {"index,name,memory.total": rows})  # no compute_cap column on old drivers
    h = hardware.detect()
    assert (h.spec, h.gpus_per_node, h.compute_capability) == ("1xA10G-24GB", 1, "8.6")


def test_free_disk_of_a_future_run_dir(tmp_path):
    assert hardware.free_disk_gib(tmp_path / "not" / "yet") > 0
    p = build("tiny-demo", "cpu")
    assert p.memory.disk.free_gib > 0 and p.memory.disk.need_gib >= 0


def test_adapters_on_the_random_init_tiny_model_train_its_embeddings_too():
    """model.train_embeddings=auto: on for builtin:tiny (its frozen random embeddings cap what adapters learn),
    counted by the memory model; off for a pretrained model unless set."""
    tiny = build("tiny-demo", "cpu", "model.adapter=qlora")
    assert tiny.config.model.train_embeddings is True
    assert any(d["setting"] == "model.train_embeddings" for d in tiny.decisions)
    arch = memory_arch.Arch.of(tiny.config.model.arch)
    assert arch.adapter_params(16, True) == arch.lora_params(16) + 320 * 128  # tied: one matrix
    assert (
        "LoRA parameters and the token embeddings"
        in next(d for d in tiny.decisions if d["setting"] == "adapter")["why"]
    )
    assert not any(d["setting"] == "model.train_embeddings" for d in build("tiny-demo", "cpu").decisions)  # full
    qwen = build("qwen7b-grpo", "1xH100-80GB", "model.adapter=lora")
    assert qwen.config.model.train_embeddings is False
    assert not any(d["setting"] == "model.train_embeddings" for d in qwen.decisions)
    both = build("qwen7b-grpo", "1xH100-80GB", "model.adapter=lora", "model.train_embeddings=true")
    untied = 152064 * 3584 * 2  # Qwen2.5-7B's embeddings and output head: two matrices, their grads and AdamW
    grown = phase(both, "rl/training").components_gib["optimizer states"]
    assert grown - phase(qwen, "rl/training").components_gib["optimizer states"] == pytest.approx(
        8 * untied / GiB, abs=0.01
    )


# --- plan.json: what every rank reads ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "spec", "sets"),
    [
        ("tiny-demo", "cpu", ()),
        ("qwen7b-grpo", "8xH100-80GB", ("rl.async_rollout.enabled=true",)),  # the async split's GPU ids
        ("smollm2-grpo-cpu", "cpu", ()),  # a GGUF import
        ("qwen7b-grpo", "2x8xH100-80GB", ("model.adapter=lora",)),
        ("qwen7b-grpo", "1xH100-80GB", ("rl.use_vllm=false",)),  # transformers generation in chunks
        ("qwen7b-grpo", "8xH100-80GB", ("rl.async_rollout.enabled=true", "rl.use_vllm=false")),
        ("qwen7b-grpo", "8xH100-80GB", ("model.arch=null",)),  # no memory estimate, an unsized vLLM engine
    ],
)
def test_plan_json_reads_back_as_the_plan_it_was(tmp_path: Path, monkeypatch, preset: str, spec: str, sets: tuple):
    from rlctl import rundir
    from rlctl.plan import resolved

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # the preset's architecture, or none
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    built = plan.build(config.resolve(preset, None, None, spec, list(sets)), tmp_path)
    rundir.write_record(rundir.RunDir(tmp_path).plan, built)
    assert resolved.read(tmp_path) == built
    assert json.loads(rundir.RunDir(tmp_path).plan.read_text()) == built.to_json()


def test_build_changes_nothing_it_is_given(tmp_path: Path):
    """What the plan resolves (epochs into steps, the architecture from the GGUF header, the data's lengths) lands
    in its own copy of the config (`Plan.config`); the config and the lengths it was given stay as they were."""
    cfg = config.resolve("smollm2-grpo-cpu", None, None, "cpu", ["sft.epochs=1", "model.arch=null"])
    lengths = {"sft": 40}
    before = (cfg.model_dump(), dict(lengths))
    p = plan.build(cfg, tmp_path, prompt_tokens=17, lengths=lengths)
    assert (cfg.model_dump(), lengths) == before
    assert p.config.sft.max_steps != cfg.sft.max_steps and p.config.model.arch is not None and cfg.model.arch is None
    assert {"sft.max_steps", "RL prompt tokens (memory)", "sft tokens per sequence (memory)"} <= {
        d["setting"] for d in p.decisions
    }


def test_a_damaged_plan_json_is_named(tmp_path: Path):
    """plan.json is read as its record: a key it lacks, or one of another kind (its parts' keys by their path, a
    boolean is no count), is named with the file and what still works."""
    from rlctl import rundir, strictjson
    from rlctl.plan import resolved

    path = rundir.RunDir(tmp_path).plan
    path.write_text('{"run_dir": "x"}')
    with pytest.raises(strictjson.DamagedFile, match=r"plan\.json is damaged: it lacks its `config`.*rlctl resume"):
        resolved.read(tmp_path)
    built = plan.build(config.resolve("tiny-demo", None, None, "cpu", []), tmp_path).to_json()
    damages = {
        "`stages[0].max_steps` is a string": lambda p: p["stages"][0].update(max_steps="4"),
        "`hardware.nodes` is a boolean": lambda p: p["hardware"].update(nodes=True),
        "`memory.phases[1].peak_gib` is a string": lambda p: p["memory"]["phases"][1].update(peak_gib="1"),
        "`layout.main` is the number 3": lambda p: p["layout"].update(main=3),
        "`model.params` is a string": lambda p: p["model"].update(params="7B"),
        "`decisions[0].why` is a JSON array": lambda p: p["decisions"][0].update(why=[]),
        "it lacks its `hardware.spec`": lambda p: p["hardware"].pop("spec"),
    }
    for said, damage in damages.items():
        damaged = json.loads(json.dumps(built))
        damage(damaged)
        path.write_text(json.dumps(damaged))
        with pytest.raises(rundir.WrongRecord, match=re.escape(said)):
            resolved.read(tmp_path)


# --- Planning runs once, in short steps ------------------------------------------------------------------------------


def test_build_is_a_short_composition_of_steps():
    import inspect

    assert len(inspect.getsource(plan.build).splitlines()) <= 15
    assert len(inspect.getsource(plan.build_from).splitlines()) <= 40


def test_train_plans_once_for_the_lengths_of_the_data(tmp_path, monkeypatch):
    """`rlctl train` (launch.prepare) runs the memory planner once, with the lengths the pre-flight counted, and
    writes that plan."""
    from rlctl import launch

    calls = []
    decide = memory.decide
    monkeypatch.setattr(memory, "decide", lambda cfg, *rest: calls.append(cfg) or decide(cfg, *rest))
    run_dir = tmp_path / "run"
    prepared = launch.prepare(config.resolve("tiny-demo", None, None, "cpu", []), run_dir)
    assert len(calls) == 1
    assert any("(memory)" in d["setting"] for d in prepared.plan.decisions)  # sized by the data's lengths
    assert json.loads((run_dir / "plan.json").read_text()) == prepared.plan.to_json()
