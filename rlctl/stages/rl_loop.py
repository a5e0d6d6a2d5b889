"""rlctl's own RL loop: the algorithms TRL 1.16 does not run faithfully, i.e. PPO with a critic (GAE), DAPO
(dynamic sampling with refill), REINFORCE++ (and -baseline), ReMax and PF-PPO.

`run` reads top to bottom; each step calls, in order:

1. `rollout`: take prompts, sample a group of completions per prompt through the plan's generation engine
   (`rlctl.rollout.generate.for_plan`: colocated vLLM in sleep mode when the plan has it, else transformers) and
   score them (`rlctl.stages.rewarding.Scorer`). With dynamic sampling, groups whose rewards are all equal are
   dropped and more prompts are sampled until the batch is full.
2. `prepare`: each process computes old and reference log-probs and critic values for its share of the batch
   (ReMax: the greedy baseline; vLLM: the weight-sync check and rollout-correction weights).
3. `advantages`: on the whole batch gathered from every process (so group statistics, whitening and PF-PPO
   resampling see what a single process would): outcome reward on the last token, KL folded into the token
   rewards if `kl_in_reward`, then `ADVANTAGE_ESTIMATORS[rl.advantage]`, then PF-PPO resampling.
4. `update`: `ppo_epochs` passes of `ppo_mini_batches` optimizer updates of the policy (`POLICY_LOSSES[rl.policy_loss]`
   plus a KL loss term when the KL is not in the reward) and of the critic (`value_loss`), each accumulated over
   micro-batches with weights that make the sum equal the loss aggregated over the whole mini-batch. When the
   plan offloads between phases, the policy's AdamW moments stay in host RAM except around its optimizer step.
5. `log_step` to metrics.jsonl (with the seconds each phase took: `time_sync`, `time_generate`, `time_score`,
   `time_prepare`, `time_update`), then `loop_checkpoint.save` every `save_every` steps (models, optimizers,
   schedulers, RNG, loop state; marked complete). At the end the policy alone (no critic) goes to the stage's
   final folder.

The math lives in `rlctl.algorithms`, the models in `rlctl.stages.rl_models`; this module moves tensors between
processes and models.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rlctl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdaptiveKLController,
    AdvantageConfig,
    FixedKLController,
    PolicyLossConfig,
    agg_loss,
    groups_with_variance,
    kl_penalty_rewards,
    loss_units,
    masked_mean,
    pf_ppo_resample,
    value_loss,
)
from rlctl.algorithms.mismatch import correction_weights
from rlctl.data.tokens import prompt_text
from rlctl.monitors import layout, memory_probe
from rlctl.rollout import generate, multiturn, vllm
from rlctl.rollout.generate import Generator
from rlctl.rollout.samples import Batch, PromptStream, Sample, collate, pad_to, rollout_logprobs
from rlctl.runtime import models
from rlctl.runtime.context import (
    Interrupted,
    PhaseClock,
    StageContext,
    Trained,
    alarm_stop,
    over_ranks,
    signalled,
    stop_signal,
)
from rlctl.runtime.rewarding import Scorer
from rlctl.runtime.rows import training_rows
from rlctl.stages import loop_checkpoint, rl_async, sharding
from rlctl.stages.common import save_final
from rlctl.stages.rl_models import (
    load_models,
    optimizer_and_schedule,
    ref_logprobs,
    token_logprobs,
    token_values,
)
from rlctl.stages.weight_sync import sync_check


# ----------------------------------------------------------------------------------------------- the loop
@dataclass
class Loop:
    """What every step works with, built once by `setup`: the accelerator, models, optimizers, prompt stream,
    scorer and generation engine, and how each process splits the batch (`shard` rollouts per process, `mini`
    per optimizer update, `micro` per forward/backward)."""

    ctx: StageContext
    acc: Any
    tok: Any
    policy: Any
    ref: Any
    critic: Any
    opt: Any
    sched: Any
    c_opt: Any
    c_sched: Any
    kl_ctl: FixedKLController | AdaptiveKLController
    stream: PromptStream
    scorer: Scorer
    generator: Generator
    loss_cfg: PolicyLossConfig
    adv_cfg: AdvantageConfig
    shard: int
    mini: int
    micro: int
    clock: PhaseClock
    agent: multiturn.Agent | None  # multi-turn rollouts with rl.tools, else None (single-turn)
    shards: dict = field(default_factory=dict)  # sharded (model, optimizer) pairs DCP checkpoints, by name
    offloaded: vllm.Offloaded = field(default_factory=vllm.Offloaded)  # the policy's AdamW state between phases
    pipeline: rl_async.Pipeline | None = None  # rl.async_rollout: rounds sampled by the generator process

    @property
    def rl(self):
        return self.ctx.cfg.rl

    @property
    def rank(self) -> int:
        return self.acc.process_index

    def prompt_ids(self, row: dict) -> list[int]:
        if self.agent is not None:
            return self.agent.prompt_ids(row["prompt"], row)
        text = prompt_text(row["prompt"], self.tok)
        return self.tok(text, add_special_tokens=False)["input_ids"]  # fits: training_rows

    def forward_all(self, fn, model, batch: Batch) -> Tensor:
        """`fn(model, micro-batch)` over the whole batch without gradients, concatenated."""
        with torch.no_grad():
            return torch.cat([fn(model, batch[i : i + self.micro]) for i in range(0, len(batch.input_ids), self.micro)])

    def gather_rows(self, x: Tensor) -> Tensor:
        """This process's [shard, t] rows padded to max_new_tokens and gathered into [batch, max_new_tokens]."""
        return self.acc.gather(pad_to(x, self.rl.max_new_tokens).contiguous())


def setup(ctx: StageContext) -> Loop:
    """Models, optimizers and the engine for the stage, prepared by accelerate (seeded first)."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    rl, cfg = ctx.cfg.rl, ctx.cfg
    acc = Accelerator(cpu=ctx.plan.hardware.is_cpu, mixed_precision=ctx.plan.mixed_precision)
    set_seed(cfg.seed)
    tok = models.tokenizer(ctx, ctx.stage.init_from)
    rows = training_rows(ctx, tok)
    sharded = sharding.owns(ctx)
    with sharding.full_loading():
        policy, ref, critic = load_models(ctx)
    if sharded:  # FSDP2 by rlctl: each decoder layer, then the root, over every process
        models_ = (policy, ref, critic)
        policy, ref, critic = (m and sharding.shard(m, acc.device.type, ctx.plan.mixed_precision) for m in models_)
    shard = rl.prompts_per_step * rl.group_size // acc.num_processes
    mini = shard // rl.ppo_mini_batches
    micro = max(d for d in range(1, min(ctx.stage.micro_batch_size, mini) + 1) if mini % d == 0)
    updates = rl.ppo_epochs * rl.ppo_mini_batches
    opt, sched = optimizer_and_schedule(
        ctx, policy, rl.learning_rate, (rl.max_steps - min(rl.critic_warmup_steps, rl.max_steps)) * updates
    )
    if not sharded:
        policy, opt = acc.prepare(policy, opt)
    acc.register_for_checkpointing(sched)
    shards = {"policy": (policy, opt)} if sharded else {}  # what DCP checkpoints (accelerate: schedulers, RNG)
    c_opt = c_sched = None
    if critic is not None:
        c_opt, c_sched = optimizer_and_schedule(ctx, critic, rl.critic_lr or rl.learning_rate, rl.max_steps * updates)
        if not sharded:
            critic, c_opt = acc.prepare(critic, c_opt)
        acc.register_for_checkpointing(c_sched)
        shards |= {"critic": (critic, c_opt)} if sharded else {}
    if ref is not None and not sharded:
        ref.to(acc.device)
    kl_ctl = AdaptiveKLController(rl.beta, rl.kl_target, rl.kl_horizon) if rl.kl_target else FixedKLController(rl.beta)
    stream = PromptStream(rows, cfg.seed)
    with sharding.full_loading():
        scorer = Scorer(ctx, tok, acc.device)
    weights = sharding.full_weights if sharded else None
    agent = multiturn.agent_for(rl, tok)
    stops = agent.stop_ids if agent else ()
    generator = generate.for_plan(ctx.plan, tok, acc.unwrap_model(policy), acc, weights, stops)
    loss_cfg = PolicyLossConfig(
        clip_low=rl.clip_low,
        clip_high=rl.clip_high if rl.policy_loss != "cispo" else 0.2,
        dual_clip_c=rl.dual_clip,
        cispo_max=rl.clip_high if rl.policy_loss == "cispo" else 5.0,
        loss_agg_mode=rl.loss_agg,
        norm_len=rl.max_new_tokens,
    )
    adv_cfg = AdvantageConfig(gamma=rl.gamma, lam=rl.lam)
    clock = PhaseClock(acc.device.type == "cuda", on_lap=functools.partial(memory_probe.lap, ctx))
    return Loop(
        ctx, acc, tok, policy, ref, critic, opt, sched, c_opt, c_sched, kl_ctl, stream, scorer, generator,
        loss_cfg, adv_cfg, shard, mini, micro, clock, agent, shards,
    )  # fmt: skip


def restore(loop: Loop) -> int:
    """Resume from the last complete checkpoint (models, optimizers, RNG, loop state); returns the step it ended."""
    from accelerate.utils import set_seed

    start = 0
    state = loop_checkpoint.load(loop.ctx, loop.acc, loop.shards)
    if state:
        start, loop.stream.cursor, loop.kl_ctl.value = state["step"], state["cursor"], state["kl_coef"]
        if state.get("world", loop.acc.num_processes) != loop.acc.num_processes:  # each process samples anew
            set_seed(loop.ctx.cfg.seed + loop.rank + start)
    else:
        set_seed(loop.ctx.cfg.seed + loop.rank)  # each process samples different completions
    if loop.ctx.plan.phase_offload:  # AdamW moments live in host RAM except around the policy's optimizer step
        vllm.offload_optimizer_state(loop.opt, loop.offloaded)
    return start


def run(ctx: StageContext) -> None:
    """Train the policy with rlctl's loop, then save it (`rlctl.stages.common.save_final`)."""
    save_final(ctx, train(ctx))


def train_step(loop: Loop, step: int, first: bool) -> None:
    """One step: rollout, prepare, advantages, update (then the async push), log, and a checkpoint when due."""
    ctx = loop.ctx
    loop.clock.start()
    rollout_ = rollout(loop, step)
    prepared = prepare(loop, rollout_.samples, step)
    train = advantages(loop, rollout_.samples, prepared, step)
    stats = update(loop, train, step)
    if loop.pipeline is not None:
        loop.pipeline.push(loop, step)
        loop.clock.lap("push")
    if first:  # the first step of this process: does it run what the plan chose?
        engine = "vllm" if isinstance(loop.generator, vllm.ColocatedVLLM) else "transformers"
        engine = None if loop.pipeline else engine  # async: the generator process samples, not this engine
        beside = layout.Beside(loop.acc.mixed_precision, loop.ref, loop.scorer.funcs, loop.critic)
        layout.check(ctx, loop.policy, loop.opt, engine, beside, loop.offloaded.switches)
    log_step(loop, step, rollout_, prepared, train, stats)
    signum = stop_signal(ctx)
    if step % loop.rl.save_every == 0 or step == loop.rl.max_steps or signum:
        cursor = loop.pipeline.resume_cursor(loop) if loop.pipeline else loop.stream.cursor
        state = {"step": step, "cursor": cursor, "kl_coef": loop.kl_ctl.value, "world": loop.acc.num_processes}
        loop_checkpoint.save(ctx, loop.acc, step, state, loop.policy, loop.tok, loop.shards)
    if signum:
        raise Interrupted(signum)


def train(ctx: StageContext) -> Trained:
    """Every step from the last complete checkpoint on; what it trained, and why it ended early if it did (an
    alarm, a signal between the last step and the save). A NaN or a broken weight sync raises at its step."""
    loop = setup(ctx)
    start = restore(loop)
    if loop.rl.async_rollout.enabled:
        loop.pipeline = rl_async.Pipeline(loop, start)
    try:
        for step in range(start + 1, loop.rl.max_steps + 1):
            train_step(loop, step, first=step == start + 1)
    finally:
        if loop.pipeline is not None:
            loop.pipeline.close()
    layout.finish(ctx, loop.offloaded.switches)
    trained = max(0, loop.rl.max_steps - start)
    ctx.log.write(stage="rl", event="trained", resumed_from=start or None, steps=trained, max_steps=loop.rl.max_steps)
    stopped = ctx.alarm_stopped(start + trained) if alarm_stop(ctx) else signalled(ctx)
    return Trained(loop.acc, loop.policy, loop.tok, stopped)


# ----------------------------------------------------------------------------------------------- 1. rollout
@dataclass
class Rollout:
    samples: list[Sample]  # the step's batch, identical on every process
    generated: list[Sample]  # everything sampled, groups dropped by dynamic sampling included
    rounds: int
    shortfall: int  # groups short of prompts_per_step after the last round


def rollout(loop: Loop, step: int) -> Rollout:
    """A full batch of scored groups, identical on every process: each process generates (or, async, receives)
    and scores its share of each round, then all shares are gathered."""
    from accelerate.utils import gather_object

    rl, clock = loop.rl, loop.clock
    if loop.pipeline is None:
        loop.generator.sync(loop.acc.unwrap_model(loop.policy).eval())
        clock.lap("sync")
    kept, spare, generated, rounds = [], [], [], 0
    max_rounds = rl.dynamic_sampling_rounds if rl.dynamic_sampling else 1
    while len(kept) < rl.prompts_per_step and rounds < max_rounds:
        rounds += 1
        mine = loop.pipeline.next_round(loop, step) if loop.pipeline else sample_round(loop)
        clock.lap("generate")
        loop.scorer(mine)
        round_samples = gather_object(mine)
        clock.lap("score")
        generated += round_samples
        scores = torch.tensor([s.score for s in round_samples])
        groups = torch.tensor([s.group for s in round_samples])
        varied = groups_with_variance(scores, groups).tolist() if rl.dynamic_sampling else [True] * len(scores)
        for i in range(0, len(round_samples), rl.group_size):
            (kept if varied[i] else spare).append(round_samples[i : i + rl.group_size])
    samples = [s for group in (kept + spare)[: rl.prompts_per_step] for s in group]
    return Rollout(samples, generated, rounds, max(0, rl.prompts_per_step - len(kept)))


def sample_round(loop: Loop) -> list[Sample]:
    """This process's share of a round of prompts_per_step prompts x group_size completions, sampled here."""
    prompts = [(g, row, loop.prompt_ids(row)) for g, row in loop.stream.take(loop.rl.prompts_per_step)]
    samples = [Sample(g, row, list(ids)) for g, row, ids in prompts for _ in range(loop.rl.group_size)]
    mine = samples[loop.rank * loop.shard : (loop.rank + 1) * loop.shard]
    if loop.agent is not None:
        multiturn.rollout(loop.agent, loop.generator, mine)
        return mine
    for s, ids in zip(mine, loop.generator.generate([s.prompt_ids for s in mine]), strict=True):
        s.completion_ids, s.truncated = ids, loop.tok.eos_token_id not in ids
    for s, lps in zip(mine, loop.generator.logprobs or [], strict=False):
        s.rollout_logprobs = lps
    return mine


# ----------------------------------------------------------------------------------------------- 2. prepare
@dataclass
class Prepared:
    """This process's share of the batch with what the update compares against."""

    batch: Batch
    old_logp: Tensor
    ref_logp: Tensor | None
    values: Tensor | None
    baseline: Tensor  # gathered over processes: ReMax's greedy reward per sample, else zeros
    is_weights: Tensor | None  # gathered rollout-correction weights (vLLM generated)
    mismatch: dict[str, float]


def prepare(loop: Loop, samples: list[Sample], step: int) -> Prepared:
    acc, rl = loop.acc, loop.rl
    mine = samples[loop.rank * loop.shard : (loop.rank + 1) * loop.shard]
    if rl.advantage == "remax":
        remax_baseline(loop, mine)
    unwrapped = acc.unwrap_model(loop.policy)
    batch = collate(mine, loop.tok.pad_token_id, acc.device)
    temp = rl.temperature
    old_logp = loop.forward_all(lambda m, b: token_logprobs(m, b, temp), unwrapped, batch)
    ref_logp = None
    if rl.beta > 0:
        ref_logp = loop.forward_all(lambda m, b: ref_logprobs(m, loop.ref, b, temp), unwrapped, batch)
    values = None
    if loop.critic is not None:
        values = loop.forward_all(token_values, acc.unwrap_model(loop.critic).eval(), batch)
    baseline = acc.gather(torch.tensor([s.baseline for s in mine], device=acc.device))
    rollout_logp = rollout_logprobs(mine, old_logp)
    is_weights, mismatch = None, {}
    if rollout_logp is not None:
        if loop.pipeline is None:  # async: each push is checked by its weights' fingerprint instead
            mismatch = sync_check(loop.ctx, acc, old_logp, rollout_logp, batch.loss_mask, step)
        weights, corr = correction_weights(
            old_logp, rollout_logp, batch.loss_mask, rl.rollout_correction, rl.rollout_correction_cap
        )
        is_weights, mismatch = loop.gather_rows(weights), mismatch | corr
    return Prepared(batch, old_logp, ref_logp, values, baseline, is_weights, mismatch)


def remax_baseline(loop: Loop, mine: list[Sample]) -> None:
    """ReMax's baseline: the reward of the greedy completion of the same prompt, set on each sample."""
    firsts = {s.group: s for s in mine}
    greedy = [Sample(g, s.row, s.prompt_ids) for g, s in firsts.items()]
    if loop.agent is not None:
        multiturn.rollout(loop.agent, loop.generator, greedy, greedy=True)
    else:
        for s, ids in zip(greedy, loop.generator.generate([s.prompt_ids for s in greedy], greedy=True), strict=True):
            s.completion_ids = ids
    loop.clock.lap("generate")
    loop.scorer(greedy)
    loop.clock.lap("score")
    by_group = {s.group: s.score for s in greedy}
    for s in mine:
        s.baseline = by_group[s.group]


# ----------------------------------------------------------------------------------------------- 3. advantages
@dataclass
class TrainBatch:
    """This process's rows for the update (after PF-PPO resampling) with their per-token targets."""

    batch: Batch
    local: dict[str, Tensor | None]  # old, ref, values, adv, returns, mask: [shard, t]
    kl: float  # mean k1 KL of the batch (0 without a reference)


def advantages(loop: Loop, samples: list[Sample], p: Prepared, step: int) -> TrainBatch:
    acc, rl, cfg = loop.acc, loop.rl, loop.ctx.cfg
    mask = loop.gather_rows(p.batch.loss_mask)  # the model's own tokens (tool results between turns excluded)
    scores = torch.tensor([s.score for s in samples], device=acc.device)
    index = torch.tensor([s.group for s in samples], device=acc.device)
    last_token = (mask * torch.arange(1, mask.shape[1] + 1, device=acc.device)).argmax(-1)  # the last trained
    token_rewards = torch.zeros_like(mask).scatter(1, last_token[:, None], scores[:, None]) * mask
    g_old = loop.gather_rows(p.old_logp)
    g_ref = loop.gather_rows(p.ref_logp) if p.ref_logp is not None else None
    g_values = loop.gather_rows(p.values) if p.values is not None else None
    kl_k1 = masked_mean(g_old - g_ref, mask).item() if g_ref is not None else 0.0
    if rl.kl_in_reward and g_ref is not None:
        kl = KL_ESTIMATORS[rl.kl_estimator](g_old, g_ref)
        token_rewards = kl_penalty_rewards(token_rewards, kl, loop.kl_ctl.value, mask)
    adv, returns = ADVANTAGE_ESTIMATORS[rl.advantage](
        token_rewards, mask, index=index, values=g_values, baseline=p.baseline, cfg=loop.adv_cfg
    )
    if p.is_weights is not None:  # rollout correction: w >= 0 scales each token's clipped objective
        adv = adv * p.is_weights
    loss_mask = mask  # advantages use every completion; mask_truncated only leaves the truncated out of the loss
    if rl.mask_truncated:
        loss_mask = mask * torch.tensor([not s.truncated for s in samples], device=acc.device)[:, None]
    order = torch.arange(len(samples), device=acc.device)
    if rl.pf_ppo_mode:
        gen = torch.Generator().manual_seed(cfg.seed * 100003 + step)
        order = pf_ppo_resample(scores.cpu(), rl.pf_ppo_mode, weight_pow=rl.pf_ppo_weight_pow, generator=gen)
        order = order.to(acc.device)
    mine_rows = order[loop.rank * loop.shard : (loop.rank + 1) * loop.shard]
    batch = collate([samples[i] for i in mine_rows.tolist()], loop.tok.pad_token_id, acc.device)
    t = batch.completion_ids.shape[1]
    targets = {"old": g_old, "ref": g_ref, "values": g_values, "adv": adv, "returns": returns, "mask": loss_mask}
    local = {name: x[mine_rows, :t] if x is not None else None for name, x in targets.items()}
    loop.clock.lap("prepare")
    return TrainBatch(batch, local, kl_k1)


# ----------------------------------------------------------------------------------------------- 4. update
def update(loop: Loop, train: TrainBatch, step: int) -> dict[str, list[float]]:
    """ppo_epochs x ppo_mini_batches optimizer steps of the policy (after the critic warm-up) and the critic,
    each accumulated over micro-batches; returns this process's per-micro-batch statistics."""
    acc, rl, cfg = loop.acc, loop.rl, loop.ctx.cfg
    policy, critic, local, batch = loop.policy, loop.critic, train.local, train.batch
    world, temp = acc.num_processes, rl.temperature
    train_policy = step > rl.critic_warmup_steps
    policy.train()
    if critic is not None:
        critic.train()
    stats: dict[str, list[float]] = {}
    gen = torch.Generator().manual_seed(cfg.seed * 100019 + step * 31 + loop.rank)
    for _ in range(rl.ppo_epochs):
        for mb in torch.randperm(loop.shard, generator=gen).to(acc.device).split(loop.mini):
            m_mask = local["mask"][mb]
            units = acc.reduce(loss_units(m_mask, rl.loss_agg), "sum")
            tokens = acc.reduce(m_mask.sum(), "sum")
            parts = mb.split(loop.micro)
            for j, rows_ in enumerate(parts):
                sync = j == len(parts) - 1
                b, mk = batch[rows_], local["mask"][rows_]
                if train_policy:
                    with contextlib.nullcontext() if sync else acc.no_sync(policy):
                        logp = token_logprobs(policy, b, temp)
                        loss, metrics = POLICY_LOSSES[rl.policy_loss](
                            logp, local["old"][rows_], local["adv"][rows_], mk, cfg=loop.loss_cfg
                        )
                        if rl.beta > 0 and not rl.kl_in_reward:
                            kl_term = KL_ESTIMATORS[rl.kl_estimator](logp, local["ref"][rows_])
                            loss = loss + loop.kl_ctl.value * agg_loss(
                                kl_term, mk, rl.loss_agg, norm_len=rl.max_new_tokens
                            )
                        weight = loss_units(mk, rl.loss_agg) * world / units.clamp(min=1)
                        acc.backward(loss * weight)
                    _add(stats, loss=loss.item(), **metrics)
                if critic is not None:
                    with contextlib.nullcontext() if sync else acc.no_sync(critic):
                        v = token_values(critic, b)
                        v_loss, v_metrics = value_loss(
                            v, local["values"][rows_], local["returns"][rows_], mk, clip_range=rl.value_clip
                        )
                        weight = mk.sum() * world / tokens.clamp(min=1)
                        acc.backward(v_loss * weight)
                    _add(stats, value_loss=v_loss.item(), **v_metrics)
            if train_policy:
                _add(stats, grad_norm=float(acc.clip_grad_norm_(policy.parameters(), rl.max_grad_norm)))
                optimizer_step(loop)
            if critic is not None:
                acc.clip_grad_norm_(critic.parameters(), rl.max_grad_norm)
                loop.c_opt.step()
                loop.c_sched.step()
                loop.c_opt.zero_grad(set_to_none=True)
    loop.kl_ctl.update(train.kl, rl.prompts_per_step * rl.group_size)
    loop.clock.lap("update")
    return stats


def optimizer_step(loop: Loop) -> None:
    """The policy's optimizer step; with phase offload its AdamW moments come back from host RAM only for it."""
    offload = loop.ctx.plan.phase_offload
    memory_probe.lap(loop.ctx, "training")
    if offload:
        vllm.reload_optimizer_state(loop.opt, loop.offloaded)
    loop.opt.step()
    loop.sched.step()
    loop.opt.zero_grad(set_to_none=True)
    if offload:
        vllm.offload_optimizer_state(loop.opt, loop.offloaded)
    memory_probe.lap(loop.ctx, "optimizer step")


# ----------------------------------------------------------------------------------------------- 5. log
def log_step(loop: Loop, step: int, r: Rollout, p: Prepared, train: TrainBatch, stats: dict) -> None:
    """One metrics.jsonl record for the step; a non-finite reward, loss or grad norm stops the stage."""
    ctx, rl = loop.ctx, loop.rl
    record = {k: sum(v) / len(v) for k, v in stats.items()}  # this process's mean over its micro-batches
    record.update(loop.clock.times())
    record["reward"] = sum(s.score for s in r.generated) / len(r.generated)
    record["response_length"] = sum(len(s.completion_ids) for s in r.samples) / len(r.samples)
    record["lr"] = loop.sched.get_last_lr()[0]
    record["reward_errors"] = over_ranks(sum(loop.scorer.errors.values()))
    scores = torch.tensor([s.score for s in r.samples])
    groups = torch.tensor([s.group for s in r.samples])
    record["frac_reward_zero_std"] = 1.0 - groups_with_variance(scores, groups).float().mean().item()  # alarms
    record["truncated_ratio"] = sum(s.truncated for s in r.samples) / len(r.samples)
    record["prompt_index"] = min(s.group for s in r.generated)  # the step's first prompt in the stream (resume)
    record.update(p.mismatch)
    if p.ref_logp is not None:
        record.update(kl=train.kl, beta=loop.kl_ctl.value)
    if rl.dynamic_sampling:
        record.update(generation_rounds=r.rounds, groups_short=r.shortfall)
    if loop.agent is not None:
        record.update(multiturn.metrics(r.generated))
    if loop.pipeline is not None:
        record.update(loop.pipeline.metrics())
    finite = {k: v for k, v in record.items() if math.isfinite(v)}
    ctx.log.write(stage="rl", step=step, max_steps=rl.max_steps, **finite)
    memory_probe.flush(ctx, step)
    if alarm_stop(ctx):
        raise ctx.alarm_stopped(step)
    bad = [k for k in ("reward", "loss", "value_loss", "grad_norm") if k in record and k not in finite]
    if bad:
        raise ctx.non_finite_stopped(bad[0], record[bad[0]], step)


def _add(stats: dict[str, list[float]], **values: float) -> None:
    for key, value in values.items():
        stats.setdefault(key, []).append(float(value))
