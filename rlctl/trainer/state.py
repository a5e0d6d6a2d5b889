"""The state of rlctl's RL loop: what every step works with (`Loop`), built once by `setup` (seeded first:
accelerate, models, optimizers, prompt stream, scorer, generation engine), written at each checkpoint
(`save_checkpoint`) and brought back from the last complete one by `restore`; and the clock of a step's phases
(`PhaseClock`).

A checkpoint holds the models, optimizers, schedulers and every process's RNG through accelerate, models sharded by
rlctl (`rlctl.trainer.sharding`) and their optimizers through torch distributed checkpoint (DCP: one file per
process, `sharded/__R_0.distcp`, plus `.metadata`; a load reshards when the process count changed), and the loop's
own state (step, prompt cursor, KL coefficient, world size) in `rlctl_loop.json`. Each is published by the
checkpoint protocol of `rlctl.checkpoint` once every process wrote it, scored on held-out data first when
checkpoint.keep_best."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rlctl import checkpoint
from rlctl.algorithms import AdaptiveKLController, AdvantageConfig, FixedKLController, PolicyLossConfig
from rlctl.data.tokens import prompt_text
from rlctl.monitors import heldout, memory_probe
from rlctl.rollout import generate, multiturn
from rlctl.rollout.generate import Generator
from rlctl.rollout.samples import Batch, PromptStream, Sample, pad_to
from rlctl.runtime import models
from rlctl.runtime.context import StageContext, resume_point
from rlctl.runtime.rewarding import Scorer
from rlctl.runtime.rows import training_rows
from rlctl.trainer import sharding
from rlctl.trainer.models import load_models, optimizer_and_schedule
from rlctl.trainer.offload import Offloaded, offload_optimizer_state

LOOP_STATE = "rlctl_loop.json"
SHARDS = "sharded"  # a checkpoint's DCP folder: one __R_0.distcp per process and .metadata


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
    offloaded: Offloaded = field(default_factory=Offloaded)  # the policy's AdamW state between phases
    # rl.async_rollout: the rounds the generator process samples (an rlctl.trainer.async_rollout.Pipeline, which
    # reads this Loop; set by `loop.train`), else None
    pipeline: Any = None

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

    def take_round(self) -> list[Sample]:
        """The next prompts_per_step prompts of the stream, group_size unsampled samples each (every process takes
        the same ones)."""
        prompts = [(g, row, self.prompt_ids(row)) for g, row in self.stream.take(self.rl.prompts_per_step)]
        return [Sample(g, row, list(ids)) for g, row, ids in prompts for _ in range(self.rl.group_size)]

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
        ctx, policy, rl.learning_rate, (rl.max_steps - min(rl.critic.warmup_steps, rl.max_steps)) * updates
    )
    if not sharded:
        policy, opt = acc.prepare(policy, opt)
    acc.register_for_checkpointing(sched)
    shards = {"policy": (policy, opt)} if sharded else {}  # what DCP checkpoints (accelerate: schedulers, RNG)
    c_opt = c_sched = None
    if critic is not None:
        c_opt, c_sched = optimizer_and_schedule(ctx, critic, rl.critic.lr or rl.learning_rate, rl.max_steps * updates)
        if not sharded:
            critic, c_opt = acc.prepare(critic, c_opt)
        acc.register_for_checkpointing(c_sched)
        shards |= {"critic": (critic, c_opt)} if sharded else {}
    if ref is not None and not sharded:
        ref.to(acc.device)
    kl_ctl = AdaptiveKLController(rl.beta, rl.kl.target, rl.kl.horizon) if rl.kl.target else FixedKLController(rl.beta)
    stream = PromptStream(rows, cfg.seed)
    with sharding.full_loading():
        scorer = Scorer(ctx, tok, acc.device)
    weights = sharding.full_weights if sharded else None
    agent = multiturn.agent_for(rl, tok)
    stops = agent.stop_ids if agent else ()
    generator = generate.for_plan(ctx.plan, tok, acc.unwrap_model(policy), acc, weights, stops)
    loss_cfg = PolicyLossConfig(
        clip_low=rl.loss.clip_low,
        clip_high=rl.loss.clip_high,
        dual_clip_c=rl.loss.dual_clip,
        cispo_max=rl.loss.cispo_cap,
        loss_agg_mode=rl.loss.agg,
        norm_len=rl.max_new_tokens,
    )
    adv_cfg = AdvantageConfig(gamma=rl.returns.gamma, lam=rl.returns.lam)
    clock = PhaseClock(acc.device.type == "cuda", on_lap=functools.partial(memory_probe.lap, ctx))
    return Loop(
        ctx, acc, tok, policy, ref, critic, opt, sched, c_opt, c_sched, kl_ctl, stream, scorer, generator,
        loss_cfg, adv_cfg, shard, mini, micro, clock, agent, shards,
    )  # fmt: skip


def restore(loop: Loop) -> int:
    """Resume from the last complete checkpoint (models, optimizers, RNG, loop state); returns the step it ended."""
    from accelerate.utils import set_seed

    start = 0
    state = load_checkpoint(loop.ctx, loop.acc, loop.shards)
    if state:
        start, loop.stream.cursor, loop.kl_ctl.value = state["step"], state["cursor"], state["kl_coef"]
        if state.get("world", loop.acc.num_processes) != loop.acc.num_processes:  # each process samples anew
            set_seed(loop.ctx.cfg.seed + loop.rank + start)
    else:
        set_seed(loop.ctx.cfg.seed + loop.rank)  # each process samples different completions
    if loop.ctx.plan.phase_offload:  # AdamW moments live in host RAM except around the policy's optimizer step
        offload_optimizer_state(loop.opt, loop.offloaded)
    return start


# ----------------------------------------------------------------------------------------------- checkpoints
def load_checkpoint(ctx: StageContext, acc, shards: dict) -> dict | None:
    """Restore the last complete checkpoint into the prepared objects; its loop state, or None to start anew."""
    last = resume_point(ctx)
    if not last:
        return None
    acc.load_state(last)
    if shards:
        load_shards(Path(last), shards)  # resharded when the process count changed
    return json.loads((Path(last) / LOOP_STATE).read_text())


def save_checkpoint(ctx: StageContext, acc, step: int, state: dict, policy, tokenizer, shards: dict) -> None:
    """Models, optimizers, schedulers and every process's RNG (accelerate; sharded models and their optimizers
    through DCP, one file per process), plus the loop state, written under `.incoming` and published (scored for
    keep-best, marked complete, renamed into place) once all is written."""
    folder = checkpoint.incoming(ctx.checkpoints) / f"checkpoint-{step}"
    acc.wait_for_everyone()
    acc.save_state(str(folder))
    if shards:
        save_shards(folder, shards)
    if acc.is_main_process:
        checkpoint.write_json_atomic(folder / LOOP_STATE, state)
    heldout.publish_checkpoint(ctx, step, acc.unwrap_model(policy), tokenizer)


def _states(parts: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """The sharded state dicts of each (model, optimizer) pair, keyed `NAME` and `NAME_optim`."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    state: dict[str, Any] = {}
    for name, (model, optimizer) in parts.items():
        state[name], state[f"{name}_optim"] = get_state_dict(model, optimizer)
    return state


def save_shards(folder: Path, parts: dict[str, tuple[Any, Any]]) -> None:
    """Write each (model, optimizer) of `parts` into `folder/sharded` with DCP; every process writes its shard."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_states(parts), checkpoint_id=str(folder / SHARDS))


def load_shards(folder: Path, parts: dict[str, tuple[Any, Any]]) -> None:
    """Read `folder/sharded` into each (model, optimizer) of `parts`, resharded for this process count."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _states(parts)
    dcp.load(state, checkpoint_id=str(folder / SHARDS))
    for name, (model, optimizer) in parts.items():
        set_state_dict(model, optimizer, model_state_dict=state[name], optim_state_dict=state[f"{name}_optim"])


class PhaseClock:
    """Seconds each phase of a step took (sync, generate, score, prepare, update), logged as `time_<phase>`.
    On a GPU it waits for the queued kernels at each boundary, so work is charged to the phase that launched it.
    `on_lap(phase)` is told of every boundary (the memory probe's phases)."""

    def __init__(self, cuda: bool, on_lap: Callable[[str], None] | None = None):
        self.cuda, self.on_lap = cuda, on_lap
        self.start()

    def start(self) -> None:
        self.spent, self.mark = {}, time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.spent[phase] = self.spent.get(phase, 0.0) + now - self.mark
        self.mark = now
        if self.on_lap is not None:
            self.on_lap(phase)

    def times(self) -> dict[str, float]:
        return {f"time_{phase}": round(seconds, 4) for phase, seconds in self.spent.items()}
