"""RL through TRL's GRPOTrainer: the policy starts from the SFT output (or the base model) and is scored by
rule-based rewards, user plugins and, optionally, the reward model trained in the rm stage."""

from __future__ import annotations

from rlctl import data, engine, rewards
from rlctl.plan import final_dir
from rlctl.stages import models
from rlctl.stages.common import (
    StageContext,
    StreamMetrics,
    lora_config,
    resume_point,
    save_final,
    training_args,
)


def reward_sources(ctx: StageContext) -> tuple[list, list, list[float]]:
    """(reward functions or models, their tokenizers, weights) in the order of rl.rewards."""
    funcs, tokenizers, weights = [], [], []
    for spec in ctx.cfg.rl.rewards:
        if spec.name == "reward_model":
            path = str(final_dir(ctx.run_dir, "rm"))
            tok = models.tokenizer(ctx, path)
            funcs.append(models.reward_model(ctx, path, tok.pad_token_id))
            tokenizers.append(tok)
        else:
            funcs.append(rewards.resolve(spec.name, ctx.cfg.data.answer_field))
            tokenizers.append(None)
        weights.append(spec.weight)
    return funcs, tokenizers, weights


def run(ctx: StageContext) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rl = ctx.cfg.rl
    tok = models.tokenizer(ctx, ctx.stage.init_from)
    rows = data.check(ctx.data["rl"], "rl", ctx.cfg.data.answer_field)
    funcs, reward_tokenizers, weights = reward_sources(ctx)
    args = training_args(
        ctx,
        GRPOConfig,
        num_generations=rl.group_size,
        max_completion_length=rl.max_new_tokens,
        temperature=rl.temperature,
        beta=rl.beta,
        epsilon=rl.clip_low,
        epsilon_high=rl.clip_high,
        loss_type=rl.loss_type,
        scale_rewards=rl.scale_rewards,
        importance_sampling_level=rl.importance_sampling_level,
        reward_weights=weights,
        **engine.trl_kwargs(ctx.plan),  # use_vllm and the vllm_* arguments the memory plan chose
    )
    trainer = GRPOTrainer(
        model=models.causal_lm(ctx, ctx.stage.init_from),
        reward_funcs=funcs,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        reward_processing_classes=reward_tokenizers,
        peft_config=lora_config(ctx),
        callbacks=[StreamMetrics(ctx), *engine.callbacks(ctx.plan)],
    )
    trainer.train(resume_from_checkpoint=resume_point(ctx))
    save_final(ctx, trainer, tok)
