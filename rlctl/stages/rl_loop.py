"""rlctl's own RL loop: the algorithms TRL 1.16 does not run faithfully, i.e. PPO with a critic (GAE), DAPO
(dynamic sampling with refill), REINFORCE++ (and -baseline), ReMax and PF-PPO. `run` is the whole loop, read
top to bottom; every step is

1. rollout: take prompts, sample a group of completions per prompt through the generation boundary
   (`make_generator`: colocated vLLM in sleep mode when the plan has it, else transformers), score them with
   the run's rewards (plus DAPO's overlong shaping). With dynamic sampling, groups whose rewards are all equal
   are dropped and more prompts are sampled until the batch is full.
2. prepare: each process computes old and reference log-probs and critic values for its share of the batch.
3. advantages: on the whole batch gathered from every process (so group statistics, whitening and PF-PPO
   resampling see what a single process would): outcome reward on the last token, KL folded into the token
   rewards if `kl_in_reward`, then `ADVANTAGE_ESTIMATORS[rl.advantage]`, then PF-PPO resampling.
4. update: `ppo_epochs` passes of `ppo_mini_batches` optimizer updates of the policy (`POLICY_LOSSES[rl.policy_loss]`
   plus a KL loss term when the KL is not in the reward) and of the critic (`value_loss`), each accumulated over
   micro-batches with weights that make the sum equal the loss aggregated over the whole mini-batch. When the
   plan offloads between phases, the policy's AdamW moments stay in host RAM except around its optimizer step.
5. log to metrics.jsonl (with the seconds each phase took: `time_sync`, `time_generate`, `time_score`,
   `time_prepare`, `time_update`), checkpoint every `save_every` steps (models, optimizers, schedulers, RNG, loop state;
   marked complete), and at the end save the policy only (no critic) to the stage's final folder.

The math lives in `rlctl.algorithms`; this module moves tensors between processes and models.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor

from rlctl import checkpoint, engine, evaluate
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
    masked_mean,
    overlong_penalty,
    pf_ppo_resample,
    value_loss,
)
from rlctl.algorithms.mismatch import correction_weights, logprob_gap
from rlctl.stages import heldout, layout, lengths, models, sharding
from rlctl.stages.common import (
    Interrupted,
    NonFiniteError,
    StageContext,
    Stopped,
    lora_config,
    over_ranks,
    resume_point,
    save_final,
    stop_signal,
    torch_dtype,
)
from rlctl.stages.rl import overlong_buffer_tokens, reward_sources

LOOP_STATE = "rlctl_loop.json"


# ----------------------------------------------------------------------------------------------- data
@dataclass
class Sample:
    """One completion of one prompt; `group` is the prompt's position in the prompt stream (unique per prompt)."""

    group: int
    row: dict
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    truncated: bool = False
    score: float = 0.0
    baseline: float = 0.0
    rollout_logprobs: list[float | None] | None = None  # the engine's log-prob of each sampled token (vLLM)


class PromptStream:
    """The rl dataset in a seeded shuffled order, one epoch after another; `cursor` is all its state."""

    def __init__(self, rows: list[dict], seed: int, cursor: int = 0):
        self.rows, self.seed, self.cursor = rows, seed, cursor

    def take(self, n: int) -> list[tuple[int, dict]]:
        out = []
        for _ in range(n):
            epoch, i = divmod(self.cursor, len(self.rows))
            order = list(range(len(self.rows)))
            random.Random(self.seed + epoch).shuffle(order)
            out.append((self.cursor, self.rows[order[i]]))
            self.cursor += 1
        return out


@dataclass
class Batch:
    """Left-padded prompts followed by right-padded completions; `mask` marks the completion tokens."""

    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    completion_ids: Tensor
    mask: Tensor

    def __getitem__(self, rows) -> Batch:
        return Batch(*(getattr(self, f)[rows] for f in self.__dataclass_fields__))


def collate(samples: list[Sample], pad_id: int, device) -> Batch:
    p = max(len(s.prompt_ids) for s in samples)
    t = max(len(s.completion_ids) for s in samples)
    ids = torch.full((len(samples), p + t), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, s in enumerate(samples):
        ids[i, p - len(s.prompt_ids) : p] = torch.tensor(s.prompt_ids)
        ids[i, p : p + len(s.completion_ids)] = torch.tensor(s.completion_ids)
        attn[i, p - len(s.prompt_ids) : p + len(s.completion_ids)] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    ids, attn, pos = ids.to(device), attn.to(device), pos.to(device)
    return Batch(ids, attn, pos, ids[:, p:], attn[:, p:].float())


def pad_to(x: Tensor, length: int) -> Tensor:
    """Right-pad a [b, t] tensor with zeros to [b, length]."""
    return torch.nn.functional.pad(x, (0, length - x.shape[1]))


class PhaseClock:
    """Seconds each phase of a step took (sync, generate, score, prepare, update), logged as `time_<phase>`.
    On a GPU it waits for the queued kernels at each boundary, so work is charged to the phase that launched it."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.start()

    def start(self) -> None:
        self.spent, self.mark = {}, time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.spent[phase] = self.spent.get(phase, 0.0) + now - self.mark
        self.mark = now

    def times(self) -> dict[str, float]:
        return {f"time_{phase}": round(seconds, 4) for phase, seconds in self.spent.items()}


# ----------------------------------------------------------------------------------------------- generation
class HFGenerator:
    """Sampling with transformers' `generate` on the policy in training. This is the generation boundary:
    `rlctl.engine.ColocatedVLLM` has the same two methods."""

    logprobs = None  # the policy itself samples: its log-probs are the trainer's

    def __init__(self, tokenizer, max_new_tokens: int, temperature: float, batch_size: int = 64, synced: bool = False):
        from transformers import GenerationConfig

        self.tok, self.max_new_tokens, self.temperature = tokenizer, max_new_tokens, temperature
        self.batch_size, self.model = batch_size, None
        self.synced = synced  # a sharded policy: every process steps until all are done (each step gathers)
        # built once, as TRL does: generate() then validates no per-call keyword arguments
        common = {"max_new_tokens": max_new_tokens, "pad_token_id": tokenizer.pad_token_id}
        common |= {"eos_token_id": tokenizer.eos_token_id, "disable_compile": True}
        self.configs = {
            False: GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, **common),
            True: GenerationConfig(do_sample=False, **common),
        }

    def sync(self, model) -> None:
        """Use the current policy weights (a separate inference engine would reload them here)."""
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], greedy: bool = False) -> list[list[int]]:
        """Completion token ids of each prompt, up to and including the first EOS. The policy samples in eval
        mode (its dropout is off already): in training mode gradient checkpointing would switch off the KV cache
        and each new token would see none of the sequence before it."""
        was_training = self.model.training
        self.model.eval()
        try:
            return self._generate(prompts, greedy)
        finally:
            self.model.train(was_training)

    def _generate(self, prompts: list[list[int]], greedy: bool) -> list[list[int]]:
        pad, eos, out = self.tok.pad_token_id, self.tok.eos_token_id, []
        for i in range(0, len(prompts), self.batch_size):
            chunk = prompts[i : i + self.batch_size]
            width = max(map(len, chunk))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=self.model.device)
            attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=self.model.device)
            config, synced = self.configs[greedy], self.synced
            gen = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=config, synced_gpus=synced)
            for row in gen[:, width:].tolist():
                out.append(row[: row.index(eos) + 1] if eos in row else row)
        return out


def make_generator(ctx: StageContext, tokenizer, policy, acc) -> HFGenerator | engine.ColocatedVLLM:
    """The plan's generation engine for `policy` (the unwrapped model the loop syncs before each rollout); a
    sharded policy reaches vLLM one gathered weight at a time."""
    sharded = sharding.owns(ctx)
    if ctx.plan.generation_engine == "vllm":
        return engine.ColocatedVLLM(ctx.plan, policy, acc, tokenizer, sharding.full_weights if sharded else None)
    chunk = (ctx.plan.generation or {}).get("rollouts_per_generate") or 64  # the planner's, else 64 at a time
    return HFGenerator(tokenizer, ctx.cfg.rl.max_new_tokens, ctx.cfg.rl.temperature, chunk, synced=sharded)


# ----------------------------------------------------------------------------------------------- models
def token_logprobs(model, batch: Batch, temperature: float) -> Tensor:
    """log π(y_t | x, y_<t) of the completion tokens, [b, T], from logits / temperature (as sampled)."""
    t = batch.completion_ids.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=t + 1,
    )
    logits = out.logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)


def token_values(critic, batch: Batch) -> Tensor:
    """V(state before each completion token), [b, T] (same alignment as the log-probs)."""
    t = batch.completion_ids.shape[1]
    out = critic(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    return out.logits[:, -t - 1 : -1, 0].float()


def no_dropout(model):
    """Dropout off, so log-probs in the update match the rollout's (TRL's disable_dropout)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def load_models(ctx: StageContext):
    """(policy, reference or None, critic or None): the reference is the starting policy, frozen."""
    from transformers import AutoModelForTokenClassification

    rl, init = ctx.cfg.rl, ctx.stage.init_from
    policy = no_dropout(models.causal_lm(ctx, init))
    if ctx.plan.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lora = lora_config(ctx)
    ref = None
    if rl.beta > 0 and lora is None:
        ref = no_dropout(models.causal_lm(ctx, init, trainable=False)).eval().requires_grad_(False)
    if lora is not None:
        from peft import get_peft_model

        policy = get_peft_model(policy, lora)
    critic = None
    if rl.critic_init is not None:
        path = init if rl.critic_init == "policy" else str(ctx.run_dir / "rm" / "final")
        critic = AutoModelForTokenClassification.from_pretrained(
            path,
            num_labels=1,
            dtype=torch_dtype(ctx),
            trust_remote_code=ctx.cfg.model.trust_remote_code,
        )
        critic = no_dropout(critic)
        if ctx.plan.gradient_checkpointing:
            critic.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora_config(ctx, task_type="TOKEN_CLS") is not None:
            from peft import get_peft_model

            critic = get_peft_model(critic, lora_config(ctx, task_type="TOKEN_CLS"))
    return policy, ref, critic


def ref_logprobs(policy, ref, batch: Batch, temperature: float) -> Tensor:
    """Reference log-probs: the frozen copy, or the LoRA policy with its adapters switched off."""
    if ref is not None:
        return token_logprobs(ref, batch, temperature)
    with policy.disable_adapter():
        return token_logprobs(policy, batch, temperature)


def optimizer_and_schedule(ctx: StageContext, model, lr: float, updates: int):
    from transformers import get_scheduler

    sc = ctx.cfg.rl
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=sc.weight_decay)
    sched = get_scheduler(sc.lr_scheduler, opt, int(sc.warmup_ratio * updates), max(updates, 1))
    return opt, sched


# ----------------------------------------------------------------------------------------------- rewards
class Scorer:
    """The run's weighted reward sum (rules, plugins, reward model) plus DAPO's soft overlong punishment."""

    def __init__(self, ctx: StageContext, tokenizer, device):
        self.errors: dict[str, int] = {}  # completions scored 0 by rewards with on_error=zero, per reward
        self.funcs, self.tokenizers, self.weights = reward_sources(ctx, self.errors)
        self.funcs = [f.to(device).eval() if isinstance(f, torch.nn.Module) else f for f in self.funcs]
        self.tok, self.rl, self.buffer = tokenizer, ctx.cfg.rl, overlong_buffer_tokens(ctx)

    def __call__(self, samples: list[Sample]) -> None:
        prompts = [s.row["prompt"] for s in samples]
        texts = self.tok.batch_decode([s.completion_ids for s in samples], skip_special_tokens=True)
        chat = isinstance(prompts[0], list)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if chat else texts
        columns = {k: [s.row.get(k) for s in samples] for k in samples[0].row if k != "prompt"}
        total = torch.zeros(len(samples))
        for fn, rm_tok, weight in zip(self.funcs, self.tokenizers, self.weights, strict=True):
            if isinstance(fn, torch.nn.Module):
                full = [evaluate.prompt_text(p, self.tok) + t for p, t in zip(prompts, texts, strict=True)]
                values = evaluate.reward_scores(fn, rm_tok, full)
            else:
                ids = [s.completion_ids for s in samples]
                values = fn(prompts=prompts, completions=completions, completion_ids=ids, **columns)
            total += weight * torch.tensor([float(v) if v is not None else 0.0 for v in values])
        if self.buffer:
            lengths = torch.tensor([len(s.completion_ids) for s in samples])
            total += overlong_penalty(lengths, self.rl.max_new_tokens, self.buffer, self.rl.overlong_penalty)
        for s, value in zip(samples, total.tolist(), strict=True):
            s.score = value


# ----------------------------------------------------------------------------------------------- the loop
def run(ctx: StageContext) -> None:
    from accelerate import Accelerator
    from accelerate.utils import gather_object, set_seed

    rl, cfg = ctx.cfg.rl, ctx.cfg
    acc = Accelerator(cpu=ctx.plan.hardware.is_cpu, mixed_precision=ctx.plan.mixed_precision)
    rank, world = acc.process_index, acc.num_processes
    set_seed(cfg.seed)
    tok = models.tokenizer(ctx, ctx.stage.init_from)
    rows = lengths.training_rows(ctx, tok)
    sharded = sharding.owns(ctx)
    with sharding.full_loading():
        policy, ref, critic = load_models(ctx)
    if sharded:  # FSDP2 by rlctl: each decoder layer, then the root, over every process
        models_ = (policy, ref, critic)
        policy, ref, critic = (m and sharding.shard(m, acc.device.type, ctx.plan.mixed_precision) for m in models_)
    batch_size = rl.prompts_per_step * rl.group_size
    shard = batch_size // world
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
    generator = make_generator(ctx, tok, acc.unwrap_model(policy), acc)
    loss_cfg = PolicyLossConfig(
        clip_low=rl.clip_low,
        clip_high=rl.clip_high if rl.policy_loss != "cispo" else 0.2,
        dual_clip_c=rl.dual_clip,
        cispo_max=rl.clip_high if rl.policy_loss == "cispo" else 5.0,
        loss_agg_mode=rl.loss_agg,
        norm_len=rl.max_new_tokens,
    )
    adv_cfg = AdvantageConfig(gamma=rl.gamma, lam=rl.lam)
    start = 0
    last = resume_point(ctx)
    if last:
        acc.load_state(last)
        if shards:
            sharding.load(Path(last), shards)  # resharded when the process count changed
        state = json.loads((Path(last) / LOOP_STATE).read_text())
        start, stream.cursor, kl_ctl.value = state["step"], state["cursor"], state["kl_coef"]
        if state.get("world", world) != world:  # another process count: each process samples anew
            set_seed(cfg.seed + rank + start)
    else:
        set_seed(cfg.seed + rank)  # each process samples different completions
    if ctx.plan.phase_offload:  # AdamW moments live in host RAM except around the policy's optimizer step
        engine.offload_optimizer_state(opt)

    def prompt_ids(row: dict) -> list[int]:
        text = evaluate.prompt_text(row["prompt"], tok)
        return tok(text, add_special_tokens=False)["input_ids"]  # fits: lengths.training_rows

    temp = rl.temperature

    def logprobs_fn(model, batch: Batch) -> Tensor:
        return token_logprobs(model, batch, temp)

    def ref_fn(model, batch: Batch) -> Tensor:
        return ref_logprobs(model, ref, batch, temp)

    def forward_all(fn, model, batch: Batch) -> Tensor:
        with torch.no_grad():
            return torch.cat([fn(model, batch[i : i + micro]) for i in range(0, len(batch.input_ids), micro)])

    def gather_rows(x: Tensor) -> Tensor:
        """This process's [shard, t] rows padded to max_new_tokens and gathered into [batch, max_new_tokens]."""
        return acc.gather(pad_to(x, rl.max_new_tokens).contiguous())

    clock = PhaseClock(acc.device.type == "cuda")
    for step in range(start + 1, rl.max_steps + 1):
        # 1. rollout: a full batch of groups, identical on every process
        clock.start()
        unwrapped = acc.unwrap_model(policy).eval()
        generator.sync(unwrapped)
        clock.lap("sync")
        kept, spare, generated, rounds = [], [], [], 0
        max_rounds = rl.dynamic_sampling_rounds if rl.dynamic_sampling else 1
        while len(kept) < rl.prompts_per_step and rounds < max_rounds:
            rounds += 1
            prompts = [(g, row, prompt_ids(row)) for g, row in stream.take(rl.prompts_per_step)]
            round_samples = [Sample(g, row, list(ids)) for g, row, ids in prompts for _ in range(rl.group_size)]
            mine = round_samples[rank * shard : (rank + 1) * shard]
            for s, ids in zip(mine, generator.generate([s.prompt_ids for s in mine]), strict=True):
                s.completion_ids, s.truncated = ids, tok.eos_token_id not in ids
            for s, lps in zip(mine, generator.logprobs or [], strict=False):
                s.rollout_logprobs = lps
            clock.lap("generate")
            scorer(mine)
            round_samples = gather_object(mine)
            clock.lap("score")
            generated += round_samples
            scores = torch.tensor([s.score for s in round_samples])
            groups = torch.tensor([s.group for s in round_samples])
            varied = groups_with_variance(scores, groups).tolist() if rl.dynamic_sampling else [True] * len(scores)
            for i in range(0, len(round_samples), rl.group_size):
                (kept if varied[i] else spare).append(round_samples[i : i + rl.group_size])
        shortfall = max(0, rl.prompts_per_step - len(kept))
        samples = [s for group in (kept + spare)[: rl.prompts_per_step] for s in group]

        # 2. prepare: old/reference log-probs and values of this process's share
        mine = samples[rank * shard : (rank + 1) * shard]
        if rl.advantage == "remax":  # ReMax baseline: the reward of the greedy completion of the same prompt
            firsts = {s.group: s for s in mine}
            greedy = [Sample(g, s.row, s.prompt_ids) for g, s in firsts.items()]
            for s, ids in zip(greedy, generator.generate([s.prompt_ids for s in greedy], greedy=True), strict=True):
                s.completion_ids = ids
            clock.lap("generate")
            scorer(greedy)
            clock.lap("score")
            by_group = {s.group: s.score for s in greedy}
            for s in mine:
                s.baseline = by_group[s.group]
        batch = collate(mine, tok.pad_token_id, acc.device)
        old_logp = forward_all(logprobs_fn, unwrapped, batch)
        ref_logp = forward_all(ref_fn, unwrapped, batch) if rl.beta > 0 else None
        values = forward_all(token_values, acc.unwrap_model(critic).eval(), batch) if critic is not None else None
        baseline = acc.gather(torch.tensor([s.baseline for s in mine], device=acc.device))
        rollout_logp = rollout_logprobs(mine, old_logp)
        is_weights, mismatch = None, {}
        if rollout_logp is not None:
            mismatch = sync_check(ctx, acc, old_logp, rollout_logp, batch.mask, step)
            weights, corr = correction_weights(
                old_logp, rollout_logp, batch.mask, rl.rollout_correction, rl.rollout_correction_cap
            )
            is_weights, mismatch = gather_rows(weights), mismatch | corr

        # 3. advantages on the gathered batch
        mask = gather_rows(batch.mask)
        scores = torch.tensor([s.score for s in samples], device=acc.device)
        index = torch.tensor([s.group for s in samples], device=acc.device)
        last_token = (mask.sum(-1).long() - 1).clamp(min=0)
        token_rewards = torch.zeros_like(mask).scatter(1, last_token[:, None], scores[:, None]) * mask
        g_old = gather_rows(old_logp)
        g_ref = gather_rows(ref_logp) if ref_logp is not None else None
        g_values = gather_rows(values) if values is not None else None
        kl_k1 = masked_mean(g_old - g_ref, mask).item() if g_ref is not None else 0.0
        if rl.kl_in_reward and g_ref is not None:
            kl = KL_ESTIMATORS[rl.kl_estimator](g_old, g_ref)
            token_rewards = kl_penalty_rewards(token_rewards, kl, kl_ctl.value, mask)
        advantages, returns = ADVANTAGE_ESTIMATORS[rl.advantage](
            token_rewards, mask, index=index, values=g_values, baseline=baseline, cfg=adv_cfg
        )
        if is_weights is not None:  # rollout correction: w >= 0 scales each token's clipped objective
            advantages = advantages * is_weights
        loss_mask = mask  # advantages use every completion; mask_truncated only leaves the truncated out of the loss
        if rl.mask_truncated:
            loss_mask = mask * torch.tensor([not s.truncated for s in samples], device=acc.device)[:, None]
        order = torch.arange(len(samples), device=acc.device)
        if rl.pf_ppo_mode:
            gen = torch.Generator().manual_seed(cfg.seed * 100003 + step)
            order = pf_ppo_resample(scores.cpu(), rl.pf_ppo_mode, weight_pow=rl.pf_ppo_weight_pow, generator=gen)
            order = order.to(acc.device)
        mine_rows = order[rank * shard : (rank + 1) * shard]
        batch = collate([samples[i] for i in mine_rows.tolist()], tok.pad_token_id, acc.device)
        t = batch.completion_ids.shape[1]
        local = {
            name: x[mine_rows, :t] if x is not None else None
            for name, x in {
                "old": g_old,
                "ref": g_ref,
                "values": g_values,
                "adv": advantages,
                "returns": returns,
                "mask": loss_mask,
            }.items()
        }

        clock.lap("prepare")

        # 4. update: ppo_epochs x ppo_mini_batches optimizer steps, accumulated over micro-batches
        train_policy = step > rl.critic_warmup_steps
        policy.train()
        if critic is not None:
            critic.train()
        stats: dict[str, list[float]] = {}
        gen = torch.Generator().manual_seed(cfg.seed * 100019 + step * 31 + rank)
        for _ in range(rl.ppo_epochs):
            for mb in torch.randperm(shard, generator=gen).to(acc.device).split(mini):
                m_mask = local["mask"][mb]
                units = acc.reduce(loss_units(m_mask, rl.loss_agg), "sum")
                tokens = acc.reduce(m_mask.sum(), "sum")
                parts = mb.split(micro)
                for j, rows_ in enumerate(parts):
                    sync = j == len(parts) - 1
                    b, mk = batch[rows_], local["mask"][rows_]
                    if train_policy:
                        with contextlib.nullcontext() if sync else acc.no_sync(policy):
                            logp = token_logprobs(policy, b, temp)
                            loss, metrics = POLICY_LOSSES[rl.policy_loss](
                                logp, local["old"][rows_], local["adv"][rows_], mk, cfg=loss_cfg
                            )
                            if rl.beta > 0 and not rl.kl_in_reward:
                                kl_term = KL_ESTIMATORS[rl.kl_estimator](logp, local["ref"][rows_])
                                loss = loss + kl_ctl.value * agg_loss(
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
                    if ctx.plan.phase_offload:
                        engine.reload_optimizer_state(opt)
                    opt.step()
                    sched.step()
                    opt.zero_grad(set_to_none=True)
                    if ctx.plan.phase_offload:
                        engine.offload_optimizer_state(opt)
                if critic is not None:
                    acc.clip_grad_norm_(critic.parameters(), rl.max_grad_norm)
                    c_opt.step()
                    c_sched.step()
                    c_opt.zero_grad(set_to_none=True)
        kl_ctl.update(kl_k1, batch_size)
        clock.lap("update")
        if step == start + 1:  # the first step of this process: does it run what the plan chose?
            layout.check(ctx, policy, opt, "vllm" if isinstance(generator, engine.ColocatedVLLM) else "transformers")

        # 5. log and checkpoint
        record = {k: sum(v) / len(v) for k, v in stats.items()}  # this process's mean over its micro-batches
        record.update(clock.times())
        record["reward"] = sum(s.score for s in generated) / len(generated)
        record["response_length"] = sum(len(s.completion_ids) for s in samples) / len(samples)
        record["lr"] = sched.get_last_lr()[0]
        record["reward_errors"] = over_ranks(sum(scorer.errors.values()))
        record.update(mismatch)
        if g_ref is not None:
            record.update(kl=kl_k1, beta=kl_ctl.value)
        if rl.dynamic_sampling:
            record.update(generation_rounds=rounds, groups_short=shortfall)
        finite = {k: v for k, v in record.items() if math.isfinite(v)}
        ctx.log.write(stage="rl", step=step, max_steps=rl.max_steps, **finite)
        bad = [k for k in ("reward", "loss", "value_loss", "grad_norm") if k in record and k not in finite]
        if bad:
            last = checkpoint.last_complete(ctx.checkpoints)
            raise NonFiniteError(
                f"Stage rl stopped: {bad[0]} became {record[bad[0]]} at step {step}. The last good "
                f"checkpoint is {last or 'none (the stage restarts from its start)'}. Lower rl.learning_rate or "
                f"check the rewards and data, then `rlctl resume {ctx.run_dir}`."
            )
        state = {"step": step, "cursor": stream.cursor, "kl_coef": kl_ctl.value, "world": world}
        signum = stop_signal()
        if step % rl.save_every == 0 or step == rl.max_steps or signum:
            save_checkpoint(ctx, acc, step, state, policy, tok, shards)
        if signum:
            raise Interrupted(signum)
    no_callbacks = SimpleNamespace(callbacks=[])
    save_final(ctx, SimpleNamespace(accelerator=acc, model=policy, callback_handler=no_callbacks), tok)


def rollout_logprobs(samples: list[Sample], like: Tensor) -> Tensor | None:
    """The engine's log-probs of the sampled tokens as a [b, T] tensor shaped like the trainer's (None when the
    policy generated itself); where the engine gave none, the trainer's value (no difference)."""
    if any(s.rollout_logprobs is None for s in samples):
        return None
    out = like.clone()
    for i, s in enumerate(samples):
        for t, lp in enumerate(s.rollout_logprobs[: like.shape[1]]):
            if lp is not None and math.isfinite(lp):
                out[i, t] = lp
    return out


class SyncMismatch(Stopped):
    """vLLM generated with weights other than the policy's."""


def sync_check(ctx: StageContext, acc, train: Tensor, rollout: Tensor, mask: Tensor, step: int) -> dict:
    """The weight-sync check: trainer vs vLLM log-probs of the tokens vLLM just sampled, over every process;
    a mean gap beyond rl.sync_tolerance stops the stage."""
    mean, worst = logprob_gap(train, rollout, mask)
    both = acc.gather(torch.tensor([[mean, worst]], device=acc.device))
    mean, worst = float(both[:, 0].mean()), float(both[:, 1].max())
    tolerance = ctx.cfg.rl.sync_tolerance
    if tolerance and mean > tolerance:
        last = checkpoint.last_complete(ctx.checkpoints)
        raise SyncMismatch(
            f"Stage rl stopped at step {step}: vLLM generated with weights other than the policy's (mean |log-prob "
            f"difference| on its sampled tokens {mean:.4f}, max {worst:.4f}; rl.sync_tolerance {tolerance}). "
            "Likely causes: LoRA adapters pushed unmerged, a tied embedding / LM head not refreshed, a stale engine "
            "after wake-up (weights not reloaded), or a parameter pushed under the wrong name. Nothing of this step "
            f"was trained; the last good checkpoint is {last or 'none'}. Report it with logs/train.log; to run "
            f"anyway, resume with --set rl.use_vllm=false."
        )
    return {"sync_logp_diff_mean": mean, "sync_logp_diff_max": worst}


def loss_units(mask: Tensor, mode: str) -> Tensor:
    """What `agg_loss(mode)` divides by: tokens (token-mean), non-empty sequences (seq-mean-*), or rows
    (seq-mean-token-sum-norm). Weighting each micro-batch by units / total units makes the accumulated gradient
    that of the loss aggregated over the whole mini-batch, across processes."""
    if mode == "token-mean":
        return mask.sum()
    if mode == "seq-mean-token-sum-norm":
        return torch.tensor(float(mask.shape[0]), device=mask.device)
    return (mask.sum(-1) > 0).sum().float()


def _add(stats: dict[str, list[float]], **values: float) -> None:
    for key, value in values.items():
        stats.setdefault(key, []).append(float(value))


def save_checkpoint(ctx: StageContext, acc, step: int, state: dict, policy, tokenizer, shards: dict) -> None:
    """Models, optimizers, schedulers and every process's RNG (accelerate; sharded models and their optimizers
    through DCP, one file per process), plus the loop state, written under `.incoming` and published (scored for
    keep-best, marked complete, renamed into place) once all is written."""
    folder = checkpoint.incoming(ctx.checkpoints) / f"checkpoint-{step}"
    acc.wait_for_everyone()
    acc.save_state(str(folder))
    if shards:
        sharding.save(folder, shards)
    if acc.is_main_process:
        checkpoint.write_json_atomic(folder / LOOP_STATE, state)
    heldout.publish_checkpoint(ctx, step, acc.unwrap_model(policy), tokenizer)
