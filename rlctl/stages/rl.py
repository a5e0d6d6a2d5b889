"""The RL stage: the policy starts from the SFT output (or the base model) and is scored by rule-based rewards,
user plugins and, optionally, the reward model trained in the rm stage.

Each algorithm runs on exactly one code path (`rlctl.config.RL_ALGORITHM_PATHS`): TRL's GRPOTrainer for the
GRPO family it implements faithfully (grpo, dr-grpo, gspo, cispo), TRL's RLOOTrainer for rloo, and rlctl's own
loop (`rlctl.trainer`) for everything else (ppo, dapo, reinforce-pp, reinforce-pp-baseline, remax,
pf-ppo). This module translates the algorithm keys of `rl` into the TRL trainers' arguments.
"""

from __future__ import annotations

import dataclasses

from rlctl.monitors import layout
from rlctl.rollout import vllm
from rlctl.runtime import models
from rlctl.runtime.models import lora_config
from rlctl.runtime.rewarding import overlong_buffer_tokens, reward_sources
from rlctl.runtime.rows import training_rows
from rlctl.stages.common import StageContext, StreamMetrics, save_final, train, training_args
from rlctl.trainer import offload

# rl.loss.agg -> TRL GRPOTrainer loss_type (rl.loss.policy=cispo uses TRL's "cispo", which normalises like "dapo").
TRL_LOSS_TYPE = {"seq-mean-token-mean": "grpo", "token-mean": "dapo", "seq-mean-token-sum-norm": "dr_grpo"}


def trl_batching(ctx: StageContext) -> dict:
    """Batch arguments so that one generation covers the rollout batch and makes ppo_mini_batches optimizer
    steps, each reused ppo_epochs times (TRL's num_iterations): rl.max_steps counts rollout batches."""
    rl, stage = ctx.cfg.rl, ctx.stage
    per_proc = stage.micro_batch_size * stage.grad_accum
    mini = per_proc // rl.ppo_mini_batches
    micro = max(d for d in range(1, min(stage.micro_batch_size, mini) + 1) if mini % d == 0)
    updates = rl.ppo_mini_batches * rl.ppo_epochs
    # transformers generation in the planner's chunks: TRL generates steps_per_generation micro-batches at once
    chunk = ctx.plan.rollouts_per_generate
    return {
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": mini // micro,
        "steps_per_generation": chunk // micro,
        "num_iterations": rl.ppo_epochs,
        "max_steps": rl.max_steps * updates,
        "save_steps": rl.save_every * updates,
    }


def run(ctx: StageContext) -> None:
    path = ctx.cfg.rl.path
    if path == "rlctl":
        from rlctl.trainer import loop

        save_final(ctx, loop.train(ctx))
    elif path == "trl-rloo":
        _run_trl(ctx, rloo=True)
    else:
        _run_trl(ctx, rloo=False)


def _run_trl(ctx: StageContext, rloo: bool) -> None:
    from datasets import Dataset

    if rloo:
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer
    else:
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer

    rl = ctx.cfg.rl
    if ctx.plan.generation_engine == "vllm":
        vllm.process_environment(ctx.plan)
    tok = models.tokenizer(ctx, ctx.stage.init_from)
    rows = training_rows(ctx, tok)
    reward_errors: dict[str, int] = {}
    funcs, reward_tokenizers, weights = reward_sources(ctx, reward_errors)
    if overlong_buffer_tokens(ctx):
        from trl.rewards import get_soft_overlong_punishment

        funcs.append(get_soft_overlong_punishment(rl.max_new_tokens, overlong_buffer_tokens(ctx)))
        reward_tokenizers.append(None)
        weights.append(rl.filters.overlong_penalty)
    if rloo:
        algorithm = {"normalize_advantages": False}
    else:
        algorithm = {
            "loss_type": "cispo" if rl.loss.policy == "cispo" else TRL_LOSS_TYPE[rl.loss.agg],
            "scale_rewards": "group" if rl.advantage == "grpo" else "none",
            "importance_sampling_level": "sequence" if rl.loss.policy == "gspo" else "token",
            **vllm.trl_correction_kwargs(ctx.plan),
        }
    batching = trl_batching(ctx)
    args = training_args(
        ctx,
        Config,
        num_generations=rl.group_size,
        max_completion_length=rl.max_new_tokens,
        temperature=rl.temperature,
        beta=rl.beta,
        epsilon=rl.loss.clip_low,
        epsilon_high=rl.loss.cispo_cap if rl.loss.policy == "cispo" else rl.loss.clip_high,  # TRL: cispo's cap
        mask_truncated_completions=rl.filters.mask_truncated,
        reward_weights=weights,
        **algorithm,
        **vllm.trl_kwargs(ctx.plan),  # use_vllm and the vllm_* arguments the memory plan chose
    )
    args = dataclasses.replace(args, generation_batch_size=None, **batching)
    offloaded = offload.Offloaded()
    trainer = Trainer(
        model=models.causal_lm(ctx, ctx.stage.init_from),
        reward_funcs=funcs,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        reward_processing_classes=reward_tokenizers,
        peft_config=lora_config(ctx),
        callbacks=[StreamMetrics(ctx, reward_errors), *offload.callbacks(ctx.plan, offloaded)],
    )
    if getattr(trainer, "use_vllm", False):
        vllm.adapt(trainer.vllm_generation, ctx.plan)
    layout.follow_plan(ctx, trainer, offloaded.switches)
    save_final(ctx, train(ctx, trainer, tok))
