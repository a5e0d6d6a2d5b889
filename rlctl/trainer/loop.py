"""rlctl's own RL loop, which trains every RL algorithm of the rl stage: GRPO and its family (Dr. GRPO, GSPO,
CISPO), RLOO, PPO with a critic (GAE), VAPO, DAPO (dynamic sampling with refill), REINFORCE++ (and -baseline),
ReMax and PF-PPO.

`train` takes what the rl stage built (`rlctl.trainer.state`: `Parts`, ready to train; `Settings`, the rl section
and the plan fields the loop reads; `Hooks`, the stage around it: its metrics log, stops and monitors) and reads
top to bottom: `setup` and `restore` build the `Loop` and bring back the last complete checkpoint, then each step
(`train_step`) calls, in order:

1. `rollout`: take prompts (value pretraining's from a stream of its own, so the policy's steps see the prompts
   they would without it), sample a group of completions per prompt through the plan's generation engine
   (`rlctl.rollout.generate.for_plan`: colocated vLLM in sleep mode when the plan has it, else transformers; with
   rl.async_rollout the rounds the generator engines sampled, each its share, `rlctl.trainer.async_rollout`) and
   score them
   (`rlctl.runtime.rewarding.Scorer`). With dynamic sampling, groups whose rewards are all equal are dropped and
   more prompts are sampled until the batch is full.
2. `prepare`: each process computes old and reference log-probs and critic values for its share of the batch
   (ReMax: the greedy baseline; vLLM: the weight-sync check `sync_check` and rollout-correction weights).
3. `advantages`: on the whole batch gathered from every process (so group statistics, whitening and PF-PPO
   resampling see what a single process would): outcome reward on the last token, KL folded into the token
   rewards if `rl.kl.in_reward`, then `ADVANTAGE_ESTIMATORS[rl.advantage]` (gae: per-sample λ, the critic's
   targets at their own λ), then PF-PPO resampling. In VAPO's value pretraining (the first
   `rl.critic.pretrain_steps` steps, before rl.max_steps) the critic's targets are the Monte-Carlo returns.
4. `update`: `ppo_epochs` passes of `ppo_mini_batches` optimizer updates of the policy (`POLICY_LOSSES[rl.loss.policy]`
   plus a KL loss term when the KL is not in the reward, plus VAPO's positive-example LM loss with
   `rl.loss.lm_coef`) and of the critic (`value_loss`), each accumulated over micro-batches with weights that make
   the sum equal the loss aggregated over the whole mini-batch. Value pretraining and `rl.critic.warmup_steps`
   update the critic only. When the plan offloads between phases, the policy's AdamW moments stay in host RAM
   except around its optimizer step (`rlctl.trainer.offload`).
5. with rl.async_rollout, the updated weights pushed to every generator engine; at this process's first step the
   layout check against the plan (the stage's monitors); `log_step` to metrics.jsonl (with the seconds each phase
   took: `time_sync`, `time_generate`, `time_score`, `time_prepare`, `time_update`, and the step's best and worst
   samples, `log_samples`), then `save_checkpoint` (`rlctl.trainer.state`) every `save_every` steps (models,
   optimizers, schedulers, RNG, loop state; scored and marked complete by the stage's monitors). `train` hands back
   the policy alone (no critic); the rl stage (`rlctl.stages.rl`) saves it to the stage's final folder.

The math lives in `rlctl.algorithms`, the models in `rlctl.trainer.models`; this module moves tensors between
processes and models.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from rlctl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    agg_loss,
    explained_variance,
    gae_lambdas,
    groups_with_variance,
    kl_penalty_rewards,
    loss_units,
    masked_mean,
    pf_ppo_resample,
    positive_lm_loss,
    returns_to_go,
    value_loss,
)
from rlctl.algorithms.mismatch import behaviour_ratio, correction_weights, logprob_gap
from rlctl.monitors import layout
from rlctl.rewards.state import TrainerState
from rlctl.rollout import multiturn, vllm
from rlctl.rollout.samples import Batch, Sample, collate, rollout_logprobs, token_logprobs
from rlctl.rundir import LoopState
from rlctl.runtime.context import Interrupted, Trained, alarm_stop, over_ranks, signalled, stop_signal
from rlctl.trainer import async_rollout
from rlctl.trainer.models import ref_logprobs, token_values
from rlctl.trainer.offload import offload_optimizer_state, release_cached_blocks, reload_optimizer_state
from rlctl.trainer.state import Hooks, Loop, Parts, Settings, restore, save_checkpoint, setup


# ----------------------------------------------------------------------------------------------- the loop
def train(parts: Parts, settings: Settings, hooks: Hooks) -> Trained:
    """Every step from the last complete checkpoint on; what it trained, and why it ended early if it did (an
    alarm, a signal between the last step and the save). A NaN or a broken weight sync raises at its step."""
    loop = setup(parts, settings, hooks)
    start = restore(loop)
    if parts.async_generator is not None:
        loop.pipeline = async_rollout.Pipeline(loop, parts.async_generator, start)
    total = loop.rl.total_steps  # value pretraining (rl.critic.pretrain_steps), then rl.max_steps
    try:
        for step in range(start + 1, total + 1):
            train_step(loop, step, first=step == start + 1)
    finally:
        if loop.pipeline is not None:
            loop.pipeline.close(loop)
    hooks.monitors.finish_layout(loop.offloaded.switches)
    trained = max(0, total - start)
    hooks.log.write(stage="rl", event="trained", resumed_from=start or None, steps=trained, max_steps=total)
    stopped = hooks.stops.alarm_stopped(start + trained) if alarm_stop(hooks.log) else signalled(hooks.stop)
    return Trained(loop.acc, loop.policy, loop.tok, stopped)


def train_step(loop: Loop, step: int, first: bool) -> None:
    """One step: rollout, prepare, advantages, update (then the async push), log, and a checkpoint when due."""
    loop.clock.start()
    rollout_ = rollout(loop, step)
    prepared = prepare(loop, rollout_.samples, step)
    train = advantages(loop, rollout_.samples, prepared, step)
    stats = update(loop, train, step)
    if loop.pipeline is not None:
        loop.pipeline.push(loop, step)
        loop.clock.lap("push")
    if first:  # the first step of this process: does it run what the plan chose?
        engine = "vllm" if isinstance(loop.generator, vllm.VLLMGenerator) else "transformers"
        generators = None
        if loop.pipeline is not None:  # async: the generator engines sampled, with the engine they report
            engine, generators = loop.pipeline.sampled_with, loop.pipeline.running
        beside = layout.Beside(loop.acc.mixed_precision, loop.ref, loop.scorer.funcs, loop.critic, generators)
        loop.hooks.monitors.check_layout(loop.policy, loop.opt, engine, beside, loop.offloaded.switches)
    log_step(loop, step, rollout_, prepared, train, stats)
    signum = stop_signal(loop.hooks.stop)
    if step % loop.rl.save_every == 0 or step == loop.rl.total_steps or signum:
        cursor = loop.pipeline.resume_cursor(loop, step) if loop.pipeline else loop.stream_at(step + 1).cursor
        save_checkpoint(loop, step, LoopState(step, cursor, loop.kl_ctl.value, loop.acc.num_processes))
    if signum:
        raise Interrupted(signum)


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
        release_cached_blocks(loop.acc.device)
        loop.generator.sync(loop.acc.unwrap_model(loop.policy).eval())
        clock.lap("sync")
    kept, spare, generated, rounds = [], [], [], 0
    max_rounds = rl.filters.dynamic_sampling_rounds if rl.filters.dynamic_sampling else 1
    while len(kept) < rl.prompts_per_step and rounds < max_rounds:
        rounds += 1
        mine = loop.pipeline.next_round(loop, step) if loop.pipeline else sample_round(loop, step)
        clock.lap("generate")
        loop.scorer(mine, trainer_state(loop, step))
        round_samples = gather_object(mine)
        clock.lap("score")
        generated += round_samples
        scores = torch.tensor([s.score for s in round_samples])
        groups = torch.tensor([s.group for s in round_samples])
        varied = groups_with_variance(scores, groups).tolist() if rl.filters.dynamic_sampling else [True] * len(scores)
        for i in range(0, len(round_samples), rl.group_size):
            (kept if varied[i] else spare).append(round_samples[i : i + rl.group_size])
    samples = [s for group in (kept + spare)[: rl.prompts_per_step] for s in group]
    return Rollout(samples, generated, rounds, max(0, rl.prompts_per_step - len(kept)))


def trainer_state(loop: Loop, step: int) -> TrainerState:
    """What reward functions get as `trainer_state` (TRL's `global_step` and `max_steps`): the policy's optimizer
    steps before this step's update and the stage's total."""
    updates, rl_step = loop.rl.ppo_epochs * loop.rl.ppo_mini_batches, step - loop.rl.critic.pretrain_steps
    return TrainerState(global_step=max(0, rl_step - 1) * updates, max_steps=loop.rl.max_steps * updates)


def sample_round(loop: Loop, step: int) -> list[Sample]:
    """This process's share of a round of step `step`'s prompts_per_step prompts x group_size completions, sampled
    here."""
    mine = loop.mine(loop.take_round(step))
    multiturn.sample(loop.agent, loop.generator, mine, loop.tok.eos_token_id)
    return mine


# ----------------------------------------------------------------------------------------------- 2. prepare
@dataclass
class Prepared:
    """This process's share of the batch with what the update compares against."""

    batch: Batch
    old_logp: Tensor  # the trainer's policy before the update
    ratio_logp: Tensor  # the PPO ratio's reference: old_logp, or an async round's behaviour policy
    ref_logp: Tensor | None
    values: Tensor | None
    baseline: Tensor  # gathered over processes: ReMax's greedy reward per sample, else zeros
    is_weights: Tensor | None  # gathered rollout-correction weights (vLLM generated)
    mismatch: dict[str, float]


def prepare(loop: Loop, samples: list[Sample], step: int) -> Prepared:
    acc, rl = loop.acc, loop.rl
    mine = loop.mine(samples)
    if rl.advantage == "remax":
        remax_baseline(loop, mine, step)
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
    is_weights, mismatch, ratio_logp = None, {}, old_logp
    if rollout_logp is not None:
        correction = (rl.mismatch.correction, rl.mismatch.correction_cap)
        if loop.pipeline is None:  # vLLM: the engine's rounding, corrected by weights on the loss
            mismatch = sync_check(loop, old_logp, rollout_logp, batch.loss_mask, step)
            weights, corr = correction_weights(old_logp, rollout_logp, batch.loss_mask, *correction)
        else:  # async (each push checked by its weights' fingerprint): the PPO ratio against the policy that sampled
            ratio_logp, weights, corr = behaviour_ratio(
                old_logp, rollout_logp, batch.loss_mask, *correction, policy_loss=rl.loss.policy
            )
        is_weights, mismatch = loop.gather_rows(weights), mismatch | corr
    return Prepared(batch, old_logp, ratio_logp, ref_logp, values, baseline, is_weights, mismatch)


def remax_baseline(loop: Loop, mine: list[Sample], step: int) -> None:
    """ReMax's baseline: the reward of the greedy completion of the same prompt, set on each sample."""
    firsts = {s.group: s for s in mine}
    greedy = [Sample(g, s.row, s.prompt_ids, vision=s.vision) for g, s in firsts.items()]
    if loop.agent is not None:
        multiturn.rollout(loop.agent, loop.generator, greedy, greedy=True)
    else:
        prompts, images = [s.prompt_ids for s in greedy], [s.vision for s in greedy]
        with_images = {"vision": images} if any(v is not None for v in images) else {}
        for s, ids in zip(greedy, loop.generator.generate(prompts, greedy=True, **with_images), strict=True):
            s.completion_ids = ids
    loop.clock.lap("generate")
    loop.scorer(greedy, trainer_state(loop, step))
    loop.clock.lap("score")
    by_group = {s.group: s.score for s in greedy}
    for s in mine:
        s.baseline = by_group[s.group]


def sync_check(loop: Loop, train: Tensor, rollout: Tensor, mask: Tensor, step: int) -> dict:
    """The weight-sync check: trainer vs vLLM log-probs of the tokens vLLM just sampled, over every process;
    a mean gap beyond rl.mismatch.sync_tolerance stops the stage (the math: `rlctl.algorithms.mismatch`)."""
    acc = loop.acc
    mean, worst = logprob_gap(train, rollout, mask)
    both = acc.gather(torch.tensor([[mean, worst]], device=acc.device))
    mean, worst = float(both[:, 0].mean()), float(both[:, 1].max())
    loop.hooks.stops.check_sync(step, mean, worst)
    return {"sync_logp_diff_mean": mean, "sync_logp_diff_max": worst}


# ----------------------------------------------------------------------------------------------- 3. advantages
@dataclass
class TrainBatch:
    """This process's rows for the update (after PF-PPO resampling) with their per-token targets."""

    batch: Batch
    local: dict[str, Tensor | None]  # old, ref, values, adv, returns, mask: [shard, t]; correct: [shard]
    kl: float  # mean k1 KL of the batch (0 without a reference)
    gauges: dict[str, float]  # the batch's per-sample λ (length-adaptive GAE), critic fit, correct share


def advantages(loop: Loop, samples: list[Sample], p: Prepared, step: int) -> TrainBatch:
    acc, rl = loop.acc, loop.rl
    mask = loop.gather_rows(p.batch.loss_mask)  # the model's own tokens (tool results between turns excluded)
    scores = torch.tensor([s.score for s in samples], device=acc.device)
    index = torch.tensor([s.group for s in samples], device=acc.device)
    last_token = (mask * torch.arange(1, mask.shape[1] + 1, device=acc.device)).argmax(-1)  # the last trained
    token_rewards = torch.zeros_like(mask).scatter(1, last_token[:, None], scores[:, None]) * mask
    g_old = loop.gather_rows(p.old_logp)
    g_ref = loop.gather_rows(p.ref_logp) if p.ref_logp is not None else None
    g_values = loop.gather_rows(p.values) if p.values is not None else None
    kl_k1 = masked_mean(g_old - g_ref, mask).item() if g_ref is not None else 0.0
    if rl.kl.in_reward and g_ref is not None:
        kl = KL_ESTIMATORS[rl.kl.estimator](g_old, g_ref)
        token_rewards = kl_penalty_rewards(token_rewards, kl, loop.kl_ctl.value, mask)
    adv, returns = ADVANTAGE_ESTIMATORS[rl.advantage](
        token_rewards, mask, index=index, values=g_values, baseline=p.baseline, cfg=loop.adv_cfg
    )
    if loop.pretraining(step):  # VAPO's value pretraining: the critic fits the Monte-Carlo returns
        returns = returns_to_go(token_rewards, mask, rl.returns.gamma)
    gauges = batch_gauges(loop, samples, mask, g_values, returns)
    if p.is_weights is not None:  # rollout correction: w >= 0 scales each token's clipped objective
        adv = adv * p.is_weights
    loss_mask = mask  # advantages use every completion; rl.filters.mask_truncated leaves the truncated out of the loss
    if rl.filters.mask_truncated:
        loss_mask = mask * torch.tensor([not s.truncated for s in samples], device=acc.device)[:, None]
    order = torch.arange(len(samples), device=acc.device)
    if rl.filters.pf_ppo_mode:
        gen = torch.Generator().manual_seed(loop.settings.seed * 100003 + step)
        order = pf_ppo_resample(
            scores.cpu(), rl.filters.pf_ppo_mode, weight_pow=rl.filters.pf_ppo_weight_pow, generator=gen
        )
        order = order.to(acc.device)
    mine_rows = loop.mine(order)
    batch = collate([samples[i] for i in mine_rows.tolist()], loop.tok.pad_token_id, acc.device)
    t = batch.completion_ids.shape[1]
    g_ratio = g_old if p.ratio_logp is p.old_logp else loop.gather_rows(p.ratio_logp)
    targets = {"old": g_ratio, "ref": g_ref, "values": g_values, "adv": adv, "returns": returns, "mask": loss_mask}
    local = {name: x[mine_rows, :t] if x is not None else None for name, x in targets.items()}
    # which samples the verifier scored correct, [shard]: VAPO's positive-example LM loss trains on their tokens
    correct = torch.tensor([float(s.correct) for s in samples], device=acc.device)
    local["correct"] = correct[mine_rows] if rl.loss.lm_coef > 0 else None
    loop.clock.lap("prepare")
    return TrainBatch(batch, local, kl_k1, gauges)


def batch_gauges(loop: Loop, samples: list[Sample], mask: Tensor, values: Tensor | None, returns: Tensor) -> dict:
    """What the step's metrics show of VAPO's parts: each sample's GAE λ (mean, min, max over the batch) with
    length-adaptive GAE, how well the critic's values fit its targets (explained variance, before the update), and
    the share of samples the verifier scored correct (the positive-example LM loss trains on those)."""
    rl, out = loop.rl, {}
    if rl.advantage == "gae" and rl.returns.lam_alpha is not None:
        lam = gae_lambdas(mask, loop.adv_cfg)
        out.update(lam_mean=lam.mean().item(), lam_min=lam.min().item(), lam_max=lam.max().item())
    if values is not None:
        out["value_explained_var"] = explained_variance(values, returns, mask)
    if rl.loss.lm_coef > 0:
        out["correct_frac"] = sum(s.correct for s in samples) / len(samples)
    return out


# ----------------------------------------------------------------------------------------------- 4. update
def update(loop: Loop, train: TrainBatch, step: int) -> dict[str, list[float]]:
    """ppo_epochs x ppo_mini_batches optimizer steps of the policy (after value pretraining and the critic warm-up)
    and the critic, each accumulated over micro-batches; returns this process's per-micro-batch statistics."""
    acc, rl = loop.acc, loop.rl
    policy, critic, local, batch = loop.policy, loop.critic, train.local, train.batch
    world, temp = acc.num_processes, rl.temperature
    pretraining = loop.pretraining(step)
    train_policy = not pretraining and step - rl.critic.pretrain_steps > rl.critic.warmup_steps
    policy.train()
    if critic is not None:
        critic.train()
    stats: dict[str, list[float]] = {}
    gen = torch.Generator().manual_seed(loop.settings.seed * 100019 + step * 31 + loop.rank)
    for _ in range(rl.ppo_epochs):
        for mb in torch.randperm(loop.shard, generator=gen).to(acc.device).split(loop.mini):
            m_mask = local["mask"][mb]
            units = acc.reduce(loss_units(m_mask, rl.loss.agg), "sum")
            tokens = acc.reduce(m_mask.sum(), "sum")
            positive = None  # tokens of correct samples in the mini-batch, over every process
            if local["correct"] is not None:
                positive = acc.reduce((m_mask * local["correct"][mb, None]).sum(), "sum")
            parts = mb.split(loop.micro)
            for j, rows_ in enumerate(parts):
                sync = j == len(parts) - 1
                b, mk = batch[rows_], local["mask"][rows_]
                if train_policy:
                    with contextlib.nullcontext() if sync else acc.no_sync(policy):
                        logp = token_logprobs(policy, b, temp)
                        loss, metrics = POLICY_LOSSES[rl.loss.policy](
                            logp, local["old"][rows_], local["adv"][rows_], mk, cfg=loop.loss_cfg
                        )
                        if rl.beta > 0 and not rl.kl.in_reward:
                            kl_term = KL_ESTIMATORS[rl.kl.estimator](logp, local["ref"][rows_])
                            loss = loss + loop.kl_ctl.value * agg_loss(
                                kl_term, mk, rl.loss.agg, norm_len=rl.max_new_tokens
                            )
                        weight = loss_units(mk, rl.loss.agg) * world / units.clamp(min=1)
                        total = loss * weight
                        if positive is not None:  # VAPO: + mu x the next-token loss of the correct samples
                            correct = local["correct"][rows_]
                            lm = positive_lm_loss(logp, mk, correct)
                            share = (mk * correct[:, None]).sum() * world / positive.clamp(min=1)
                            total = total + rl.loss.lm_coef * lm * share
                            metrics["lm_loss"] = lm.item()
                        acc.backward(total)
                    _add(stats, loss=loss.item(), **metrics)
                if critic is not None:
                    with contextlib.nullcontext() if sync else acc.no_sync(critic):
                        v = token_values(critic, b)
                        v_loss, v_metrics = value_loss(
                            v, local["values"][rows_], local["returns"][rows_], mk, clip_range=rl.critic.value_clip
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
    if not pretraining:  # the policy has not moved: there is no KL to adapt to
        loop.kl_ctl.update(train.kl, rl.prompts_per_step * rl.group_size)
    loop.clock.lap("value_pretrain" if pretraining else "update")
    return stats


def optimizer_step(loop: Loop) -> None:
    """The policy's optimizer step; with phase offload its AdamW moments come back from host RAM only for it."""
    offload = loop.settings.phase_offload
    loop.hooks.monitors.lap("training")
    if offload:
        reload_optimizer_state(loop.opt, loop.offloaded)
    loop.opt.step()
    loop.sched.step()
    loop.opt.zero_grad(set_to_none=True)
    if offload:
        offload_optimizer_state(loop.opt, loop.offloaded)
    loop.hooks.monitors.lap("optimizer step")


# ----------------------------------------------------------------------------------------------- 5. log
def log_step(loop: Loop, step: int, r: Rollout, p: Prepared, train: TrainBatch, stats: dict) -> None:
    """One metrics.jsonl record for the step; a non-finite reward, loss or grad norm stops the stage."""
    hooks, rl = loop.hooks, loop.rl
    record = {k: sum(v) / len(v) for k, v in stats.items()}  # this process's mean over its micro-batches
    record.update(loop.clock.times())
    record["reward"] = sum(s.score for s in r.generated) / len(r.generated)
    record["response_length"] = sum(len(s.completion_ids) for s in r.samples) / len(r.samples)
    record["lr"] = loop.sched.get_last_lr()[0]
    record["reward_errors"] = over_ranks(sum(loop.scorer.errors.values()))
    scores = torch.tensor([s.score for s in r.samples])
    groups = torch.tensor([s.group for s in r.samples])
    if rl.group_size > 1:  # one sample per prompt (a critic's run) has no group to compare: no alarm about it
        record["frac_reward_zero_std"] = 1.0 - groups_with_variance(scores, groups).float().mean().item()  # alarms
    record["truncated_ratio"] = sum(s.truncated for s in r.samples) / len(r.samples)
    record["prompt_index"] = min(s.group for s in r.generated)  # the step's first prompt in the stream (resume)
    record.update(p.mismatch)
    record.update(train.gauges)
    if loop.pretraining(step):  # VAPO's value pretraining: the critic fits Monte-Carlo returns, the policy waits
        record["value_pretrain_step"] = step
    if p.ref_logp is not None:
        record.update(kl=train.kl, beta=loop.kl_ctl.value)
    if rl.filters.dynamic_sampling:
        record.update(generation_rounds=r.rounds, groups_short=r.shortfall)
    if loop.agent is not None:
        record.update(multiturn.metrics(r.generated))
    if loop.pipeline is not None:
        record.update(loop.pipeline.metrics())
    finite = {k: v for k, v in record.items() if math.isfinite(v)}
    hooks.log.write(stage="rl", step=step, max_steps=rl.total_steps, **finite)
    log_samples(loop, step, r)
    hooks.monitors.flush(step)
    if alarm_stop(hooks.log):
        raise hooks.stops.alarm_stopped(step)
    bad = [k for k in ("reward", "loss", "value_loss", "grad_norm") if k in record and k not in finite]
    if bad:
        raise hooks.stops.non_finite_stopped(bad[0], record[bad[0]], step)


SAMPLES_LOGGED = 3  # the best and the worst completions of each step, as `rlctl ui` shows them


def log_samples(loop: Loop, step: int, r: Rollout) -> None:
    """A `samples` record of the step: the main process's best and worst completions with their rewards."""
    if not loop.hooks.is_main or not r.generated:
        return
    ranked = sorted(r.generated, key=lambda s: s.score if math.isfinite(s.score) else -math.inf, reverse=True)

    def shown(s: Sample) -> dict:
        prompt = loop.tok.decode(s.prompt_ids, skip_special_tokens=True)[-300:]
        completion = loop.tok.decode(s.completion_ids, skip_special_tokens=True)[:500]
        return {"prompt": prompt, "completion": completion, "reward": s.score}

    best, worst = [shown(s) for s in ranked[:SAMPLES_LOGGED]], [shown(s) for s in ranked[::-1][:SAMPLES_LOGGED]]
    loop.hooks.log.write(stage="rl", step=step, event="samples", best=best, worst=worst)


def _add(stats: dict[str, list[float]], **values: float) -> None:
    for key, value in values.items():
        stats.setdefault(key, []).append(float(value))
